"""Keep the devnet chain's state on disk, so a devnet survives a stop, a crash or a kill -9 of its owner.

anvil holds the whole chain in memory. `anvil_dumpState` returns it (accounts, storage, blocks, receipts
and logs, gzip-compressed) in milliseconds, and `anvil --load-state FILE` starts from such a file. A small
keeper process (`python -m zoo.devnet.chain_state`), started and stopped with the devnet's anvil, polls
the chain head and, whenever it moved, writes the state to the state file through a temp file, fsync and
rename: a crash at any moment leaves the previous complete state or the new one, never half a file. On
SIGTERM it writes a last dump before it exits. anvil's own `--state-interval` writes in place, which a
kill -9 mid-write can leave truncated; that is why this is hand-written.

A loaded chain keeps its blocks but not its clock offset (the devnet moves time forward with
`evm_increaseTime`), so `restore_clock` makes new blocks continue after the last saved timestamp instead
of stepping back to the wall clock, which would break every timestamp snapshot.
"""

from __future__ import annotations

import argparse
import gzip
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from zoo.devnet.process import ProcessRecord
from zoo.registry.errors import ZooError
from zoo.registry.fsutil import write_atomic

__all__ = ["ChainStateError", "dump_state", "restore_clock"]


class ChainStateError(ZooError, RuntimeError):
    """The chain's state could not be read or written."""


def _rpc(client: httpx.Client, url: str, method: str, *params: Any) -> Any:
    reply = client.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)})
    reply.raise_for_status()
    body = reply.json()
    if "error" in body:
        raise ChainStateError(f"{method}: {body['error']}")
    return body["result"]


def dump_state(rpc_url: str, path: Path, client: httpx.Client | None = None) -> int:
    """Write the chain's state to `path` atomically (plain JSON, as `anvil --load-state` reads it);
    returns the number of bytes written."""
    own = client is None
    client = client or httpx.Client(timeout=30)
    try:
        raw = _rpc(client, rpc_url, "anvil_dumpState")
    finally:
        if own:
            client.close()
    data = bytes.fromhex(raw.removeprefix("0x"))
    if data[:2] == b"\x1f\x8b":  # gzip magic: anvil compresses its dumps, --load-state wants JSON text
        data = gzip.decompress(data)
    write_atomic(path, data)
    return len(data)


def restore_clock(w3: Any) -> int:
    """After loading a saved chain, make the next blocks' timestamps continue from the last saved block
    (when that lies ahead of the wall clock); returns the seconds the clock was moved forward."""
    latest = int(w3.eth.get_block("latest")["timestamp"])
    ahead = latest - int(time.time()) + 1
    if ahead > 0:
        w3.provider.make_request("evm_increaseTime", [ahead])
        return ahead
    return 0


def keep(rpc_url: str, path: Path, anvil_pid: int, interval_s: float, ready_file: Path | None = None) -> None:
    """Dump whenever the chain head changes, until anvil exits or SIGTERM arrives (then dump once more).
    `ready_file` is created once SIGTERM is handled: a stop before that would lose the last dump."""
    stopping = False

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if ready_file is not None:
        ready_file.touch()
    last: Any = None
    anvil = ProcessRecord.of("anvil", anvil_pid)  # its start time too, so a reused pid is not taken for it
    with httpx.Client(timeout=10) as client:
        while anvil.alive():
            # Read once per pass: a SIGTERM that lands mid-pass gets its final dump on the next pass.
            stop_now = stopping
            try:
                head = _rpc(client, rpc_url, "eth_getBlockByNumber", "latest", False)
                key = (head["number"], head["hash"])
                if stop_now or key != last:
                    dump_state(rpc_url, path, client)
                    last = key
            except (httpx.HTTPError, ChainStateError, ValueError, KeyError, TypeError) as e:
                print(f"chain-state: dump failed: {e}", file=sys.stderr, flush=True)
            if stop_now:
                return
            time.sleep(interval_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rpc", required=True, help="anvil's JSON-RPC URL")
    parser.add_argument("--out", required=True, type=Path, help="state file to keep up to date")
    parser.add_argument("--anvil-pid", required=True, type=int, help="exit when this process is gone")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between checks of the head")
    parser.add_argument("--ready-file", type=Path, help="created once the keeper handles SIGTERM")
    args = parser.parse_args(argv)
    keep(args.rpc, args.out, args.anvil_pid, args.interval, args.ready_file)


if __name__ == "__main__":
    main()
