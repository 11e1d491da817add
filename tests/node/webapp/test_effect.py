"""A library proposal's measured effect in the web app, on a full node (the bundled model on llama.cpp, a
real devnet): the page asks the node to score the parent version and the proposal on a shipped task file
through its own model, and shows both scores with their intervals and the paired difference; the same
figures come again from the node's memory, for the proposal and for a draft of the same bytes; bad
requests are refused by field; a light node says it
measures nothing (tests/node/webapp/test_site.py)."""

from __future__ import annotations

import json
import time

import httpx
from web3 import Web3

from tests.conftest import devnet_serving_node
from tests.node.approve import next_version
from tests.node.webapp.browser import browser_page, screenshot
from tests.node.webapp.test_browser import open_proposal, wait_text
from zoo.devnet.genesis import genesis_library
from zoo.devnet.manager import Devnet
from zoo.node.client import NodeClient
from zoo.registry.canonical import encode_library
from zoo.registry.chain import RegistryClient, format_proposal_id
from zoo.registry.ipfs import IpfsClient
from zoo.registry.keys import dev_account
from zoo.registry.merkle import library_root
from zoo.trainer.tasks.schema import DATA_DIR

TASK = "families/habitats-test"


def test_the_page_shows_a_proposals_measured_effect(tmp_path) -> None:
    with devnet_serving_node(tmp_path) as node:
        info = Devnet(node.data_dir).info()
        base = str(node.info["http"])
        w3 = Web3(Web3.HTTPProvider(info.rpc_url, request_kwargs={"timeout": 60}))
        genesis = genesis_library()
        lesson = ("conventions.habitats", "When an animal lives in water or marsh, file it under WET.")
        proposed = next_version(genesis, "0x" + library_root(genesis).hex(), lesson)
        with IpfsClient(info.ipfs_api) as ipfs:
            cid = ipfs.add(encode_library(proposed))
        made = RegistryClient(w3, info.registry_address, dev_account(0)).propose(
            library_root(proposed), cid, tree_size=len(proposed.experiences)
        )
        pid = format_proposal_id(made.proposal_id)
        assert TASK in httpx.get(base + "/app/config.json", timeout=30).json()["tasks"]

        def ask(body: object) -> httpx.Response:
            return httpx.post(base + "/app/effect", content=json.dumps(body).encode(), timeout=600)

        refused = ask({"proposal": pid, "task": "../../etc/passwd"})
        assert refused.status_code == 400 and refused.json()["error"]["field"] == "task"
        assert ask({"proposal": "0x12", "task": TASK}).json()["error"]["field"] == "proposal"
        assert ask({"proposal": "0x" + "ab" * 32, "task": TASK}).status_code == 404  # no such proposal
        assert ask({"cid": cid}).status_code == 400
        with browser_page(base) as page:
            open_proposal(page, pid)
            page.select_option("#effect-task", TASK)
            page.click("#measure")
            wait_text(page, "#effect-difference", "B - A", timeout_s=540)
            shown = page.inner_text("#effect-difference")
            screenshot(page, "proposal-effect")
            assert page.problems == [], page.problems
        tasks = len((DATA_DIR / f"{TASK}.jsonl").read_text().splitlines())
        assert f"over {tasks} tasks" in shown, shown
        started = time.monotonic()
        again = ask({"proposal": pid, "task": TASK})
        assert again.status_code == 200 and time.monotonic() - started < 5  # kept, not measured again
        assert again.json()["parent_cid"] == info.genesis["cid"] and again.json()["cid"] == cid  # from chain
        figures = again.json()
        assert figures["n"] == figures["compare"]["n"] == figures["difference"]["n"] == tasks
        assert (
            figures["configuration"]["library"] == info.genesis["cid"]
            and figures["compare"]["configuration"]["library"] == cid
        )
        # A draft of the same bytes, before any proposal, measures the same: kept by the same CIDs.
        draft = ask({"draft": encode_library(proposed).decode(), "task": TASK})
        assert draft.status_code == 200 and draft.json() == figures, draft.text
        assert ask({"draft": "{}", "task": TASK}).status_code == 400
        d = figures["difference"]
        assert f"B - A: {d['difference']:+.3f}" in shown
        assert d["ci95"][0] <= d["difference"] <= d["ci95"][1]

        # The operator cancels a learning job from the page, with the admin token typed into it.
        with NodeClient(node.address, admin_token=node.admin_token) as client:
            job = client.submit_job(
                "tf-grpo", {"dataset": str(DATA_DIR / "families" / "habitats-train.jsonl")}
            )
        with browser_page(base) as page:
            page.goto(base + "/#/status")
            page.fill("#admin-token", node.admin_token)
            page.click("#show-jobs")
            row = page.locator(f'#jobs tr[data-job="{job.id}"]')
            row.locator("button.cancel-job").click()
            state = f'#jobs tr[data-job="{job.id}"] .state'
            page.wait_for_function(
                "(s) => document.querySelector(s)?.textContent === 'CANCELLED'", arg=state, timeout=120_000
            )
            screenshot(page, "status-jobs")
            assert page.problems == [], page.problems
