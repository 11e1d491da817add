"""The web app's figures (issue 48): page load to the proposal list shown, with N proposals on the chain,
beside the simplest alternative in the same run, `zoo-node dao proposals --no-verify` (the same list from
the CLI: its process start, chain reads and table); and the bundle's size.

A light node on its own devnet (as tests/node/webapp do), N library proposals made by dev0. Each load is a
fresh headless chromium page (Debian's, driven by Playwright): from `goto` to every proposal's row on the
page. Loads and CLI runs alternate, round by round; medians.

Usage: ./zoo bench webapp [--proposals 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.node.approve import next_version  # noqa: E402
from tests.node.webapp.browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from tests.node.webapp.conftest import start_light_devnet_node  # noqa: E402


def make_proposals(node, count: int) -> None:
    from web3 import Web3

    from zoo.devnet.genesis import genesis_library
    from zoo.devnet.info import warp
    from zoo.devnet.manager import Devnet
    from zoo.registry.canonical import encode_library
    from zoo.registry.chain import RegistryClient
    from zoo.registry.ipfs import IpfsClient
    from zoo.registry.keys import dev_account
    from zoo.registry.merkle import library_root

    info = Devnet(node.data_dir).info()
    w3 = Web3(Web3.HTTPProvider(info.rpc_url, request_kwargs={"timeout": 60}))
    proposer = RegistryClient(w3, info.registry_address, dev_account(0))
    genesis = genesis_library()
    root = "0x" + library_root(genesis).hex()
    with IpfsClient(info.ipfs_api) as ipfs:
        for i in range(count):
            lesson = ("bench.webapp", f"When proposal {i} is listed, its row shows its tally.")
            library = next_version(genesis, root, lesson)
            cid = ipfs.add(encode_library(library))
            proposer.propose(library_root(library), cid, tree_size=len(library.experiences))
    warp(w3, 1)


def page_load(browser, base: str, rows: int) -> float:
    page = browser.new_page()
    try:
        started = time.perf_counter()
        page.goto(base + "/")
        page.wait_for_function(
            "(n) => document.querySelectorAll('#proposals tbody tr').length >= n", arg=rows
        )
        return time.perf_counter() - started
    finally:
        page.close()


def cli_list(node) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "zoo.node.cli", "dao", "proposals", "--no-verify", "--limit", "1000",
         "--config", str(node.config_file)],
        check=True, capture_output=True,
    )  # fmt: skip
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--proposals", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    bundle = REPO / "node" / "webapp" / "dist" / "assets" / "app.js"
    data = bundle.read_bytes()
    zipped = len(gzip.compress(data))
    print(f"   bundle: {len(data) / 1024:.0f} KiB of JavaScript, {zipped / 1024:.0f} KiB gzipped")
    with tempfile.TemporaryDirectory() as tmp:
        node = start_light_devnet_node(Path(tmp))
        try:
            make_proposals(node, args.proposals)
            base = str(node.info["http"])
            loads, cli = [], []
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    page_load(browser, base, args.proposals)  # warm: the first page pays chromium's start
                    for r in range(args.rounds):
                        if r % 2:
                            cli.append(cli_list(node))
                        loads.append(page_load(browser, base, args.proposals))
                        if not r % 2:
                            cli.append(cli_list(node))
                        print(
                            f"   round {r + 1}: page {loads[-1] * 1e3:6.0f} ms, CLI {cli[-1] * 1e3:6.0f} ms",
                            flush=True,
                        )
                finally:
                    browser.close()
        finally:
            node.stop()
    page_ms, cli_ms = statistics.median(loads) * 1000, statistics.median(cli) * 1000
    print(f"   {args.proposals} proposals (plus the devnet's own), medians of {args.rounds} rounds:")
    print(f"     web app, goto to every row shown     {page_ms:6.0f} ms")
    print(
        f"     zoo-node dao proposals --no-verify   {cli_ms:6.0f} ms   (page / CLI: {page_ms / cli_ms:.2f}x)"
    )


if __name__ == "__main__":
    main()
