"""The web app in a real headless browser (Debian's chromium, driven by Playwright) against a light node on a
real devnet, its transactions signed by a test wallet (tests/node/webapp/browser.py) forwarding to anvil's
dev accounts: a holder delegates; a library change is drafted and proposed from the page; two accounts
vote for it from its page; the devnet warps; the proposal is executed from the page; the node syncs it and
the library page shows the new version. On
the way: a call proposal shown decoded, the content's Merkle root rebuilt in the browser (green), a proposal
whose CID holds other bytes shown red with the reason, and an experience holding `<script>` rendered as
text. Screenshots of each page go to tests/.artifacts/webapp/."""

from __future__ import annotations

import time

from web3 import Web3

from tests.node.approve import next_version
from tests.node.webapp.browser import DevWallet, browser_page, screenshot
from zoo.devnet.genesis import genesis_library
from zoo.devnet.info import warp
from zoo.devnet.manager import Devnet
from zoo.node.client import NodeClient
from zoo.registry.canonical import encode_library
from zoo.registry.chain import RegistryClient, format_proposal_id
from zoo.registry.ipfs import IpfsClient
from zoo.registry.keys import dev_account, dev_address
from zoo.registry.merkle import library_root

SCRIPT = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'


def wait_text(page, selector: str, text: str, timeout_s: float = 30) -> None:
    page.wait_for_function(
        "([s, t]) => (document.querySelector(s)?.textContent ?? '').includes(t)", arg=[selector, text],
        timeout=timeout_s * 1000,
    )  # fmt: skip


def open_proposal(page, pid: str) -> None:
    page.goto(page.url.split("#")[0] + f"#/proposal/{pid}")
    wait_text(page, "#proposal-id", pid)


def test_delegate_vote_execute_and_see_the_new_version(light_node) -> None:
    info = Devnet(light_node.data_dir).info()
    base = str(light_node.info["http"])
    w3 = Web3(Web3.HTTPProvider(info.rpc_url, request_kwargs={"timeout": 60}))
    wallet = DevWallet(info.rpc_url, dev_address(5))
    with browser_page(base, wallet) as page:
        # The devnet's proposals so far (the genesis library, the calls approving the bundled model and
        # registering the node), each shown; the calls decoded.
        page.wait_for_selector("#proposals tbody tr")
        events = RegistryClient(w3, info.registry_address).contract.events
        made = [*events.ProposalCreated.get_logs(from_block=0), *events.CallProposed.get_logs(from_block=0)]
        screenshot(page, "proposals-genesis")
        assert page.locator("#proposals tbody tr").count() == len(made) >= 2
        listed = page.inner_text("#proposals")
        assert f"setBaseModel(0x{info.genesis['base_models'][0].removeprefix('0x')}, true)" in listed, listed

        # dev5 connects, sees its balance and quadratic power, and delegates to dev6.
        page.click("#connect")
        wait_text(page, "#balance", "1000000 KEEPER")
        assert page.inner_text("#power") == "power 1000000000000"  # √(10**24), as the registry counts
        page.fill("#delegatee", dev_address(6))
        page.click("#delegate-button")
        wait_text(page, "#notice", "delegate: done")
        page.wait_for_selector(f'#delegate[title="{dev_address(6)}"]')
        assert page.inner_text("#votes") == "0 votes"  # dev5's votes are dev6's now
        warp(w3, 1)  # the delegation is in the past of the next proposals' snapshot

        # A proposal whose CID holds other bytes than its root commits to (made outside the page: the page
        # proposes only what it built).
        current = genesis_library()
        genesis_root = "0x" + library_root(current).hex()
        claimed = next_version(current, genesis_root, ("web.safety", "When a lesson is claimed, check it."))
        other = next_version(
            current, genesis_root, ("web.safety", "When a lesson differs, so does its root.")
        )
        with IpfsClient(info.ipfs_api) as ipfs:
            other_cid = ipfs.add(encode_library(other))
        proposer = RegistryClient(w3, info.registry_address, dev_account(0))
        tampered = format_proposal_id(
            proposer.propose(library_root(claimed), other_cid, tree_size=len(claimed.experiences)).proposal_id
        )

        # dev6 (holding dev5's votes too) drafts a library change with a hostile experience text and
        # proposes it through the wallet; the node publishes its bytes.
        wallet.use(page, dev_address(6))
        page.goto(base + "/#/draft")
        page.click("#start-draft")
        page.fill("#add-lesson textarea", f"When a page shows {SCRIPT}, show it.")
        page.fill("#add-lesson input[name=domain]", "web.safety")
        page.click("#add-lesson button")
        wait_text(page, "#notice", "Added exp-")
        page.click("#build")
        page.click("#propose")
        wait_text(page, "#notice", "Proposed and published", timeout_s=60)
        good = page.url.split("#/proposal/")[1]
        warp(w3, 1)  # voting opens the second after a proposal

        open_proposal(page, tampered)
        page.wait_for_selector("#root-check.bad")
        assert "Merkle root is 0x" + library_root(other).hex() in page.inner_text("#root-check")
        screenshot(page, "proposal-tampered")

        # The good one: verified in the browser, its added experience shown as text, never run as markup.
        open_proposal(page, good)
        page.wait_for_selector("#root-check.good")
        assert page.locator("#added li").count() == 1
        assert SCRIPT in page.inner_text("#added li .text")
        assert page.evaluate("window.pwned") is None and page.locator("main script, main img").count() == 0
        wait_text(page, ".actions", "Your weight on this proposal: 1414213562373")  # √(2 * 10**24)
        page.click("#vote-for")
        wait_text(page, "#notice", "vote: done")
        wallet.use(page, dev_address(1))
        page.wait_for_selector("#vote-for:not([disabled])")
        page.click("#vote-for")
        wait_text(page, "#notice", "vote: done")
        wait_text(page, "main dl", "2414213562373 / 0")
        page.wait_for_selector("#root-check.good")
        screenshot(page, "proposal-voted")

        # Past the vote: the page executes it; the node syncs it.
        warp(w3, info.settings["voting_period_s"] + info.settings["execution_delay_s"] + 1)
        page.reload()
        page.wait_for_selector("#execute")
        page.click("#execute")
        wait_text(page, "#notice", "execute: done")
        wait_text(page, "#state", "Executed")
        assert "Stale" in _state_of(page, tampered)

        with NodeClient(light_node.address) as client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and client.status().library.version != 2:
                time.sleep(0.3)
        page.goto(base + "/#/library")
        wait_text(page, "main h1", "Library version 2")
        page.wait_for_selector("#root-check.good")
        assert SCRIPT in page.inner_text("#experiences")
        assert page.evaluate("window.pwned") is None
        screenshot(page, "library")

        page.goto(base + "/#/status")
        wait_text(page, "main", "experiences")
        wait_text(page, "#components", "library")
        # Jobs only with the admin token, which the operator types in; a wrong one is refused in words.
        page.fill("#admin-token", "not-the-token")
        page.click("#show-jobs")
        wait_text(page, "#jobs-refused", "admin token")
        page.click("#forget-token")
        page.fill("#admin-token", light_node.admin_token)
        page.click("#show-jobs")
        wait_text(page, "#no-jobs", "No jobs")
        page.problems[:] = [x for x in page.problems if "401" not in x]  # the refusal above, as expected
        screenshot(page, "status")
        assert page.problems == [], page.problems  # no script error, no CSP violation


def _state_of(page, pid: str) -> str:
    open_proposal(page, pid)
    return page.inner_text("#state")


def test_a_contributor_drafts_and_proposes_through_the_wallet(light_node) -> None:
    info = Devnet(light_node.data_dir).info()
    base = str(light_node.info["http"])
    wallet = DevWallet(info.rpc_url, dev_address(2))
    with browser_page(base, wallet) as page:
        page.click("#connect")
        wait_text(page, "#balance", "KEEPER")
        page.goto(base + "/#/draft")
        page.click("#start-draft")
        page.wait_for_selector("#draft-experiences li")
        before = page.locator("#draft-experiences li").count()
        removed = page.locator("#draft-experiences li").first.get_attribute("data-id")
        page.locator("#draft-experiences li").first.locator("button.remove").click()
        wait_text(page, "#notice", f"Removed {removed}")
        # A lesson the node refuses (no trigger) says why; then one it takes.
        page.fill("#add-lesson textarea", "Drafts are checked by the node.")
        page.fill("#add-lesson input[name=domain]", "web.drafts")
        page.click("#add-lesson button")
        wait_text(page, "#notice", "text:")
        assert len(page.problems) == 2 and "400" in page.problems[0]  # that refusal, in the console too
        page.problems.clear()
        page.fill(
            "#add-lesson textarea", "When a contributor drafts in a browser, the node checks each lesson."
        )
        page.fill("#add-lesson input[name=domain]", "web.drafts")
        page.click("#add-lesson button")
        wait_text(page, "#notice", "Added exp-")
        wait_text(page, "#draft-change", "1 added, 1 removed")
        assert page.locator("#draft-experiences li").count() == before
        # An edit of a lesson's confidence keeps its id (the id is its domain and text): edited, not replaced.
        edited = page.locator("#draft-experiences li").nth(1)
        edited_id = edited.get_attribute("data-id")
        edited.locator("button.edit").click()
        edited.locator("input[name=confidence]").fill("0.55")
        edited.locator("form button").click()
        wait_text(page, "#draft-change", "1 added, 1 removed, 1 edited")
        screenshot(page, "draft")
        page.click("#build")
        page.wait_for_selector("#propose")
        page.click("#propose")
        wait_text(page, "#notice", "Proposed and published", timeout_s=60)
        page.wait_for_selector("#root-check.good")
        assert page.locator("#added li").count() == 1 and page.locator("#removed li").count() == 1
        assert "the node checks each lesson" in page.inner_text("#added")
        assert page.locator("#removed li").get_attribute("data-id") == removed
        assert page.locator("#edited li").count() == 2  # before and after
        assert "0.550000" in page.locator(f'#edited li[data-id="{edited_id}"]').last.inner_text()
        # Its proposer may cancel it before its vote ends: the wallet signs.
        page.click("#cancel")
        wait_text(page, "#notice", "cancel: done")
        wait_text(page, "#state", "Canceled")
        assert "eth_sendTransaction" in wallet.sent
        screenshot(page, "draft-proposed")
        assert page.problems == [], page.problems
