"""`zoo-node dao ...` as an operator runs it: subprocesses against one real devnet for the whole module.

A proposal's parent must be the current version when it is made, so every test publishes a library for the
version after whatever `current()` is then, and the tests do not depend on each other's order.
"""

from __future__ import annotations

import itertools
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from web3 import Web3

from tests.devnet import tear_down, zoo
from zoo.devnet.info import DevnetInfo, warp
from zoo.devnet.manager import Devnet
from zoo.registry.canonical import decode_library, encode_library
from zoo.registry.chain import ProposalState, RegistryClient, TokenClient
from zoo.registry.experience import Experience
from zoo.registry.ipfs import IpfsClient
from zoo.registry.keys import dev_account
from zoo.registry.library import Library
from zoo.registry.merkle import library_root
from zoo.trainer.tasks.schema import Task, write_jsonl

TOKEN = 10**18
Run = subprocess.CompletedProcess[str]
_unique = itertools.count()


class Chain:
    def __init__(self, data_dir: Path, info: DevnetInfo) -> None:
        self.data_dir = data_dir
        self.info = info
        self.w3 = Web3(Web3.HTTPProvider(info.rpc_url))
        self.registry = RegistryClient(self.w3, info.registry_address)
        self.token = TokenClient(self.w3, info.token_address)

    def dao(self, *args: str, env: dict[str, str] | None = None):
        return zoo("dao", *args, "--data-dir", str(self.data_dir), env=env)

    def current_library(self) -> Library:
        """The library of the chain's current version, from IPFS."""
        cur = self.registry.current()
        with IpfsClient(self.info.ipfs_api) as ipfs:
            return decode_library(ipfs.fetch_verified(cur.cid))

    def next_library(self, added: int = 2, drop: int = 0) -> Library:
        """The next version: the current library minus its first `drop` experiences, plus `added` new ones."""
        cur = self.current_library()
        new = [
            Experience.create(
                text=f"When the CLI test {next(_unique)} runs, check the proposal before voting for it.",
                domain="tests.dao",
                confidence=0.7,
                author="job:test-dao",
                base_model=cur.base_model,
                created_at="2026-03-01T00:00:00Z",
            )
            for _ in range(added)
        ]
        return Library.create(
            version=cur.version + 1,
            parent_root="0x" + library_root(cur).hex(),
            base_model=cur.base_model,
            experiences=[*cur.experiences[drop:], *new],
        )

    def publish(self, library: Library) -> str:
        with IpfsClient(self.info.ipfs_api) as ipfs:
            return ipfs.add(encode_library(library))

    def propose(self, *extra: str, key: str = "dev0", env: dict[str, str] | None = None) -> tuple[str, Run]:
        """Publish the next library and propose it by its CID; on success, returns the new proposal id and
        steps the chain clock into its voting window."""
        cid = self.publish(self.next_library())
        result = self.dao("propose", "--cid", cid, "--key", key, *extra, env=env)
        if result.returncode != 0:
            return "", result
        # Voting opens one second after the proposal's block: do not depend on how fast the CLI starts.
        warp(self.w3, 1)
        return proposal_id_in(result.stdout), result


def proposal_id_in(text: str) -> str:
    match = re.search(r"proposed (0x[0-9a-f]{64})", text)
    assert match, text
    return match.group(1)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    data_dir = tmp_path_factory.mktemp("dao-devnet")
    try:
        # Tied to this test process too (pdeathsig), so even a crashed run leaves no chain behind.
        info, reused = Devnet(data_dir).up(die_with_parent=True)
        assert not reused
        yield Chain(data_dir, info)
    finally:
        tear_down(data_dir)


def row_of(table: str, pid: str) -> str:
    """The line of `dao proposals` for proposal `pid` (shown as its first 12 hex digits)."""
    lines = [line for line in table.splitlines() if pid[:14] in line]
    assert len(lines) == 1, table
    return lines[0]


def test_propose_vote_execute_round(chain: Chain) -> None:
    before = chain.registry.current()
    library = chain.next_library()
    cid = chain.publish(library)
    proposed = chain.dao("propose", "--cid", cid)
    assert proposed.returncode == 0, proposed.stderr
    pid = proposal_id_in(proposed.stdout)
    root = "0x" + library_root(library).hex()
    assert f"root {root}, {len(library.experiences)} experiences" in proposed.stdout
    assert f"signing as {dev_account(0).address}" in proposed.stderr
    warp(chain.w3, 1)
    prop = chain.registry.proposal(pid)
    assert prop is not None and prop.cid == cid and prop.parent_version == before.version
    assert prop.tree_size == len(library.experiences) and "0x" + prop.root.hex() == root

    for voter in ("dev0", "dev1"):
        voted = chain.dao("vote", pid[:12], "--for", "--key", voter)  # an unambiguous prefix is enough
        assert voted.returncode == 0, voted.stderr
        assert "voted for" in voted.stdout
    assert "tally: for 2,000,000,000,000 against 0" in voted.stdout

    listed = chain.dao("proposals")
    assert listed.returncode == 0, listed.stderr
    row = row_of(listed.stdout, pid)
    assert re.search(r"\bactive\b", row) and "2,000,000,000,000/2,000,000,000,000" in row, row
    assert re.search(r"\bverified\b", row), row

    tally = chain.registry.tallies(pid)
    again = chain.dao("vote", pid, "--for", "--key", "dev1")
    assert again.returncode == 1
    assert "already voted" in again.stderr
    assert dev_account(1).address in again.stderr
    assert chain.registry.tallies(pid) == tally

    early = chain.dao("execute", pid)
    assert early.returncode == 1
    assert "refused:" in early.stderr and "cannot be executed before" in early.stderr
    assert "Traceback" not in early.stderr
    assert chain.registry.current() == before

    warped = zoo("devnet", "warp", "400", "--data-dir", str(chain.data_dir))
    assert warped.returncode == 0, warped.stderr
    assert "chain time is now" in warped.stdout
    assert chain.registry.state(pid) == ProposalState.SUCCEEDED

    executed = chain.dao("execute", pid[:10])
    assert executed.returncode == 0, executed.stderr
    assert f"library version {before.version + 1} is now {root}" in executed.stdout
    now = chain.registry.current()
    assert (now.version, "0x" + now.root.hex(), now.cid, now.tree_size) == (
        before.version + 1,
        root,
        cid,
        len(library.experiences),
    )

    shown = chain.dao("show", pid)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"state\s+executed", shown.stdout), shown.stdout
    assert re.search(r"executed\s+True", shown.stdout), shown.stdout
    assert "2,000,000,000,000 / 0" in shown.stdout
    assert re.search(r"\bexecuted\b", row_of(chain.dao("proposals").stdout, pid))


def test_review_shows_what_a_proposal_changes(chain: Chain) -> None:
    library = chain.next_library(added=2, drop=1)
    removed = chain.current_library().experiences[0]
    added = [e for e in library.experiences if e.domain == "tests.dao" and e.id not in
             {x.id for x in chain.current_library().experiences}]  # fmt: skip
    proposed = chain.dao("propose", "--cid", chain.publish(library))
    assert proposed.returncode == 0, proposed.stderr
    pid = proposal_id_in(proposed.stdout)

    reviewed = chain.dao("review", pid[:12])
    assert reviewed.returncode == 0, reviewed.stderr
    assert "content verified" in reviewed.stdout
    assert "2 added, 1 removed, 0 modified" in reviewed.stdout
    assert f"- {removed.id}" in reviewed.stdout
    for e in added:
        assert f"+ {e.id}" in reviewed.stdout
    assert f"version {library.version}: root 0x{library_root(library).hex()}" in reviewed.stdout

    # --eval scores the parent version (A) against the proposed one (B) before anyone votes.
    tasks = chain.data_dir.parent / "review-tasks.jsonl"
    write_jsonl(
        tasks, [Task(id=f"t{i}", question=f"What is {i} plus {i}?", answer=str(2 * i)) for i in (1, 2)]
    )
    scored = chain.dao("review", pid, "--eval", str(tasks))
    assert scored.returncode == 0, scored.stderr[-2000:]
    assert "A is the parent version, B the proposed one" in scored.stdout and "B - A:" in scored.stdout
    assert "paired bootstrap over 2 tasks" in scored.stdout
    missing = chain.dao("review", pid, "--eval", str(tasks) + ".missing")
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_a_proposal_whose_cid_does_not_match_its_root_cannot_be_voted_for(chain: Chain) -> None:
    """The attack of a squatter or a careless proposer: the root voters approve is not what the CID holds."""
    approved = chain.next_library()
    other_cid = chain.publish(chain.next_library())  # valid content, other experiences
    root = "0x" + library_root(approved).hex()
    size = str(len(approved.experiences))
    plain = chain.dao("propose", "--cid", other_cid, "--root", root, "--size", size)
    assert plain.returncode == 1
    assert "not verified" in plain.stderr and "Merkle root" in plain.stderr and "--force" in plain.stderr
    forced = chain.dao("propose", "--cid", other_cid, "--root", root, "--size", size, "--force")
    assert forced.returncode == 0, forced.stderr
    pid = proposal_id_in(forced.stdout)
    warp(chain.w3, 1)

    reviewed = chain.dao("review", pid)
    assert reviewed.returncode == 1
    assert "content NOT verified" in reviewed.stdout and f"not the proposed {root}" in reviewed.stdout

    refused = chain.dao("vote", pid, "--for", "--key", "dev1")
    assert refused.returncode == 1
    assert "not verified" in refused.stderr and "dao review" in refused.stderr
    assert not chain.registry.has_voted(pid, dev_account(1).address)
    assert re.search(r"\bMISMATCH\b", row_of(chain.dao("proposals").stdout, pid))

    against = chain.dao("vote", pid, "--against", "--key", "dev1")  # voting against needs no check
    assert against.returncode == 0, against.stderr
    forced_vote = chain.dao("vote", pid, "--for", "--force", "--key", "dev2")
    assert forced_vote.returncode == 0, forced_vote.stderr
    assert "voting for unverified content" in forced_vote.stderr
    assert chain.registry.tallies(pid).for_weight == 10**12


def test_propose_on_a_wrong_parent_is_refused_in_words(chain: Chain) -> None:
    current = chain.registry.current_version()
    events = len(chain.registry.proposal_created_events())
    cid = chain.publish(chain.next_library())
    result = chain.dao("propose", "--cid", cid, "--parent-version", str(current + 5), "--force")
    assert result.returncode == 1
    assert f"refused: wrong parent: version {current + 5} is not the current library version {current}" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert len(chain.registry.proposal_created_events()) == events


@pytest.mark.parametrize("bad", ["0x1234", "0x" + "zz" * 32, "0x" + "00" * 33, "not-a-root"])
def test_propose_with_an_invalid_root_exits_2(chain: Chain, bad: str) -> None:
    events = len(chain.registry.proposal_created_events())
    result = chain.dao(
        "propose", "--root", bad, "--cid", "bafkreif7mj3riqa7oiyf4da5lvx5epsszua32bcnfzccykznwxn75gnaaa"
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--root must be 0x followed by 64 hex digits" in result.stderr
    assert len(chain.registry.proposal_created_events()) == events


@pytest.mark.parametrize(
    ("given", "words"),
    [("0x12", "too short"), ("0xzzzz", "not a proposal id"), ("0x" + "f" * 63, "no proposal id starts with")],
)
def test_a_proposal_argument_that_names_no_proposal_exits_2(chain: Chain, given: str, words: str) -> None:
    result = chain.dao("show", given)
    assert result.returncode == 2, result.stdout + result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr


def test_env_key_signs_as_its_account_and_is_never_printed(chain: Chain) -> None:
    signer = dev_account(5)
    key = signer.account.key.hex()
    bare = key.removeprefix("0x")
    pid, result = chain.propose(key="env:MYKEY", env={"MYKEY": key})
    assert result.returncode == 0, result.stderr
    assert f"signing as {signer.address}" in result.stderr
    prop = chain.registry.proposal(pid)
    assert prop is not None and prop.proposer == signer.address
    voted = chain.dao("vote", pid, "--against", "--key", "env:MYKEY", env={"MYKEY": key})
    assert voted.returncode == 0, voted.stderr
    assert chain.registry.has_voted(pid, signer.address)
    assert chain.registry.tallies(pid).against_weight == 10**12

    # A damaged key is refused without echoing it either.
    damaged = bare[:-1] + ("0" if bare[-1] != "0" else "1") + "f"
    refused = chain.dao("vote", pid, "--for", "--key", "env:MYKEY", env={"MYKEY": damaged})
    assert refused.returncode == 2
    assert "cannot load signing key" in refused.stderr and "MYKEY" in refused.stderr
    for run, secret in ((result, bare), (voted, bare), (refused, damaged)):
        output = (run.stdout + run.stderr).lower()
        assert secret.lower() not in output, "the private key was printed"
        assert secret.lower()[:16] not in output, "part of the private key was printed"


def test_balance_of_a_dev_account(chain: Chain) -> None:
    result = chain.dao("balance", "dev3")
    assert result.returncode == 0, result.stderr
    address = dev_account(3).address
    assert f"{address}: balance 1,000,000.0000 KEEPER" in result.stdout
    assert "votes 1,000,000.0000 KEEPER (quadratic weight 1,000,000,000,000)" in result.stdout
    assert f"delegates to {address}" in result.stdout
    assert chain.token.balance(address) == 1_000_000 * TOKEN


def test_delegate_moves_votes_and_back(chain: Chain) -> None:
    dev4, dev6 = dev_account(4).address, dev_account(6).address
    moved = chain.dao("delegate", dev6, "--key", "dev4")
    assert moved.returncode == 0, moved.stderr
    assert f"delegated to {dev6}" in moved.stdout
    assert chain.token.delegates(dev4) == dev6
    assert chain.token.get_votes(dev4) == 0
    assert chain.token.get_votes(dev6) == 2_000_000 * TOKEN
    shown = chain.dao("balance", "dev4")
    assert "votes 0.0000 KEEPER" in shown.stdout and f"delegates to {dev6}" in shown.stdout

    back = chain.dao("delegate", "--key", "dev4")
    assert back.returncode == 0, back.stderr
    assert "delegated to self" in back.stdout
    assert chain.token.delegates(dev4) == dev4
    assert chain.token.get_votes(dev4) == 1_000_000 * TOKEN
    assert chain.token.get_votes(dev6) == 1_000_000 * TOKEN


def test_the_dao_registers_a_node_on_the_ledger_through_a_call_proposal(chain: Chain) -> None:
    from zoo.registry.chain import LedgerClient

    ledger = LedgerClient(chain.w3, chain.info.ledger_address)
    node = dev_account(6).address
    assert not ledger.is_registered(node)
    proposed = chain.dao("propose-node", node)
    assert proposed.returncode == 0, proposed.stderr
    pid = proposal_id_in(proposed.stdout)
    assert f"proposed {pid}: registerNode({node})" in proposed.stdout
    warp(chain.w3, 1)
    voted = chain.dao("vote", pid[:12], "--for", "--key", "dev1")
    assert voted.returncode == 0, voted.stderr
    assert f"a call proposal: it calls registerNode({node}) on the UsageLedger" in voted.stdout
    assert chain.dao("vote", pid, "--for", "--key", "dev0").returncode == 0
    shown = chain.dao("show", pid)
    assert shown.returncode == 0 and f"registerNode({node})" in shown.stdout, shown.stdout
    assert "call: registerNode" in row_of(chain.dao("proposals").stdout, pid)
    early = chain.dao("execute", pid)
    assert early.returncode == 1 and "cannot be executed before" in early.stderr, early.stderr
    settings = chain.info.settings
    warp(chain.w3, settings["voting_period_s"] + settings["execution_delay_s"] + 1)
    executed = chain.dao("execute", pid)
    assert executed.returncode == 0, executed.stderr
    assert f"called registerNode({node})" in executed.stdout
    assert ledger.is_registered(node)
    # Proposing what is already so is refused before any transaction; a malformed address is a usage error.
    again = chain.dao("propose-node", node)
    assert again.returncode == 1 and "already registered" in again.stderr, again.stderr
    absent = chain.dao("propose-node", dev_account(7).address, "--deregister")
    assert absent.returncode == 1 and "not registered" in absent.stderr, absent.stderr
    bad = chain.dao("propose-node", "0x1234")
    assert bad.returncode == 2 and "not an address" in bad.stderr, bad.stderr
    # The ledger itself refuses anyone but the DAO (its governor is the registry).
    from zoo.registry.chain import ContractRevert

    with pytest.raises(ContractRevert) as refused:
        LedgerClient(chain.w3, chain.info.ledger_address, dev_account(0)).register_node(node)
    assert refused.value.error == "NotGovernor"


def test_proposals_are_canceled_by_their_proposer_or_the_dao_and_stale_calls_say_why(chain: Chain) -> None:
    from zoo.registry.chain import LedgerClient

    ledger = LedgerClient(chain.w3, chain.info.ledger_address)
    voters = [RegistryClient(chain.w3, chain.info.registry_address, dev_account(i)) for i in (0, 1)]
    node, other = dev_account(8).address, dev_account(9).address
    first = proposal_id_in(chain.dao("propose-node", node).stdout)
    leftover = proposal_id_in(chain.dao("propose-node", node).stdout)  # the same call again
    unwanted = proposal_id_in(chain.dao("propose-node", other).stdout)
    mine = proposal_id_in(chain.dao("propose-node", other).stdout)
    proposed = chain.dao("propose-cancel", unwanted[:12], "--key", "dev1")
    assert proposed.returncode == 0, proposed.stderr
    cancel = proposal_id_in(proposed.stdout)
    assert f"proposed {cancel}: cancel({unwanted})" in proposed.stdout
    warp(chain.w3, 1)

    # Only the proposer cancels directly, while voting is open; the refusal points to the DAO's route.
    stranger = chain.dao("cancel", mine, "--key", "dev1")
    assert stranger.returncode == 1 and "did not make proposal" in stranger.stderr, stranger.stderr
    assert "dao propose-cancel" in stranger.stderr
    own = chain.dao("cancel", mine[:12])
    assert own.returncode == 0, own.stderr
    assert f"canceled {mine}" in own.stdout
    assert chain.registry.state(mine) == ProposalState.CANCELED
    again = chain.dao("cancel", mine)
    assert again.returncode == 1 and "is canceled" in again.stderr, again.stderr
    unknown = chain.dao("cancel", "0x" + "f" * 64)
    assert unknown.returncode == 1 and "there is no proposal" in unknown.stderr, unknown.stderr

    voted = chain.dao("vote", cancel, "--for", "--key", "dev0")
    assert voted.returncode == 0, voted.stderr
    assert f"it calls cancel({unwanted}) on the registry" in voted.stdout
    voters[1].vote(cancel, True)
    for pid in (first, leftover, unwanted):
        for voter in voters:
            voter.vote(pid, True)
    settings = chain.info.settings
    warp(chain.w3, settings["voting_period_s"] + settings["execution_delay_s"] + 1)
    late = chain.dao("cancel", first)
    assert late.returncode == 1 and "is succeeded" in late.stderr and "DAO still can" in late.stderr

    # The DAO cancels a passed proposal; it can no longer be executed.
    executed = chain.dao("execute", cancel)
    assert executed.returncode == 0, executed.stderr
    assert f"called cancel({unwanted}) on the registry" in executed.stdout
    assert chain.registry.state(unwanted) == ProposalState.CANCELED
    shown = chain.dao("show", unwanted)
    assert re.search(r"state\s+canceled", shown.stdout) and re.search(r"canceled\s+True", shown.stdout)
    refused = chain.dao("execute", unwanted)
    assert refused.returncode == 1 and "was canceled" in refused.stderr, refused.stderr
    assert not ledger.is_registered(other)
    nothing = chain.dao("propose-cancel", unwanted)
    assert nothing.returncode == 1 and "nothing left to cancel" in nothing.stderr, nothing.stderr

    # Of two identical calls the first executed wins; the other says why it is stale and cannot run.
    assert chain.dao("execute", first).returncode == 0
    assert ledger.is_registered(node)
    shown = chain.dao("show", leftover)
    assert "stale: an identical call was executed since it was proposed (0 executions of it then, 1 now)" in (
        shown.stdout
    ), shown.stdout
    listed = chain.dao("proposals", "--limit", "50").stdout
    row = row_of(listed, leftover)
    assert re.search(r"\bstale\b", row) and "(an identical call was executed since)" in row, row
    rows = {line.split()[1]: line for line in listed.splitlines() if line.startswith("│ 0x")}
    assert re.search(r"\bcanceled\b", rows[unwanted[:14] + "…"]), listed
    assert f"call: cancel({unwanted[:18]}…)" in rows[cancel[:14] + "…"], listed
    stale = chain.dao("execute", leftover)
    assert stale.returncode == 1 and "an identical call was executed since it was proposed" in stale.stderr


def test_a_challenge_from_the_cli_stakes_a_bond_the_dao_awards_on_resolving(chain: Chain) -> None:
    """`credits challenge` stakes the ledger's bond; `dao propose-resolve --dismiss`, voted and executed,
    gives it to the node, which withdraws it with `credits withdraw`; bad input is refused in words."""
    from zoo.devnet.dev_dao import DevDao
    from zoo.registry.chain import LedgerClient
    from zoo.registry.merkle import MerkleTree

    node = dev_account(9)
    ledger = LedgerClient(chain.w3, chain.info.ledger_address, node)
    DevDao.of(chain.info).call(chain.info.ledger_address, ledger.governor_call("registerNode", node.address))
    length = ledger.params().epoch_length
    epoch = int(chain.w3.eth.get_block("latest")["timestamp"]) // length
    warp(chain.w3, length)
    tree = MerkleTree.from_leaves(
        [b"\x00" + bytes.fromhex(dev_account(2).address[2:]) + (5).to_bytes(32, "big")]
    )
    ledger.post_report(
        epoch,
        tree.root,
        tree_size=1,
        earned_units=5,
        cid="bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy",
    )

    def credits(*args: str) -> Run:
        return zoo("credits", *args, "--data-dir", str(chain.data_dir))

    early = chain.dao("propose-resolve", node.address, str(epoch), "--dismiss")
    assert early.returncode == 1 and "not under challenge" in early.stderr, early.stderr
    bond = ledger.params().challenge_bond
    challenged = credits("challenge", node.address, str(epoch), "--reason", "invented", "--key", "dev1")
    assert challenged.returncode == 0, challenged.stderr
    assert f"staking {bond / 10**18:g} ETH" in challenged.stdout and "propose-resolve" in challenged.stdout
    assert chain.w3.eth.get_balance(chain.info.ledger_address) == bond
    again = credits("challenge", node.address, str(epoch), "--reason", "again", "--key", "dev1")
    assert again.returncode != 0 and "ReportUnderChallenge" in again.stderr + again.stdout, again.stderr
    proposed = chain.dao("propose-resolve", node.address, str(epoch), "--dismiss")
    assert proposed.returncode == 0, proposed.stderr
    pid = proposal_id_in(proposed.stdout)
    assert f"resolveChallenge({node.address}, {epoch}, False)" in proposed.stdout
    warp(chain.w3, 1)
    for voter in ("dev0", "dev1"):
        assert chain.dao("vote", pid, "--for", "--key", voter).returncode == 0
    settings = chain.info.settings
    warp(chain.w3, settings["voting_period_s"] + settings["execution_delay_s"] + 1)
    assert chain.dao("execute", pid).returncode == 0
    assert ledger.withdrawable(node.address) == bond and not ledger.report(node.address, epoch).challenged  # type: ignore[union-attr]
    nothing = credits("withdraw", "--key", "dev1")  # the dismissed challenger lost its bond
    assert nothing.returncode == 1 and "no awarded bonds" in nothing.stderr, nothing.stderr
    before = chain.w3.eth.get_balance(node.address)
    withdrawn = credits("withdraw", "--key", "dev9")
    assert withdrawn.returncode == 0 and f"withdrew {bond / 10**18:g} ETH" in withdrawn.stdout, (
        withdrawn.stderr
    )
    assert chain.w3.eth.get_balance(node.address) > before and ledger.withdrawable(node.address) == 0
    bad = credits("challenge", "0x1234", "1", "--reason", "x", "--key", "dev1")
    assert bad.returncode == 2 and "not an address" in bad.stderr, bad.stderr


def test_a_challenge_the_dao_leaves_unresolved_is_settled_from_the_cli(chain: Chain) -> None:
    """`credits settle-challenge` is refused while the DAO may still resolve (saying until when); once the
    ledger's resolution period has passed `dao propose-resolve` is refused, the settlement releases the
    report and the challenger withdraws its bond."""
    from zoo.devnet.dev_dao import DevDao
    from zoo.registry.chain import LedgerClient
    from zoo.registry.merkle import MerkleTree

    node, challenger = dev_account(8), dev_account(1)
    ledger = LedgerClient(chain.w3, chain.info.ledger_address, node)
    if not ledger.is_registered(node.address):
        DevDao.of(chain.info).call(
            chain.info.ledger_address, ledger.governor_call("registerNode", node.address)
        )
    params = ledger.params()
    epoch = int(chain.w3.eth.get_block("latest")["timestamp"]) // params.epoch_length
    warp(chain.w3, params.epoch_length)
    leaf = b"\x00" + bytes.fromhex(dev_account(2).address[2:]) + (5).to_bytes(32, "big")
    cid = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
    ledger.post_report(epoch, MerkleTree.from_leaves([leaf]).root, tree_size=1, earned_units=5, cid=cid)

    def credits(*args: str) -> Run:
        return zoo("credits", *args, "--data-dir", str(chain.data_dir))

    target = (node.address, str(epoch))
    assert credits("challenge", *target, "--reason", "silence", "--key", "dev1").returncode == 0
    owed_before = ledger.withdrawable(challenger.address)
    early = credits("settle-challenge", *target, "--key", "dev5")
    assert early.returncode == 1 and "it lapses only then" in early.stderr, early.stderr
    warp(chain.w3, params.resolution_period)
    late = chain.dao("propose-resolve", *target, "--dismiss")
    assert late.returncode == 1 and f"credits settle-challenge {node.address} {epoch}" in late.stderr, (
        late.stderr
    )
    settled = credits("settle-challenge", *target, "--key", "dev5")  # anyone
    assert settled.returncode == 0, settled.stderr
    assert f"the bond returned to {challenger.address}" in settled.stdout, settled.stdout
    report = ledger.report(node.address, epoch)
    assert report is not None and not report.challenged and not report.voided
    assert ledger.withdrawable(challenger.address) == owed_before + params.challenge_bond
    again = credits("settle-challenge", *target, "--key", "dev5")
    assert again.returncode == 1 and "ReportNotChallenged" in again.stderr, again.stderr
    assert credits("withdraw", "--key", "dev1").returncode == 0
