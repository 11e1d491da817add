"""`zoo-node dao ...` as an operator runs it: subprocesses against one real devnet for the whole module.

A proposal's parent must be the current root when it is made, so every test proposes a fresh random root on
top of whatever `current()` is then, and the tests do not depend on each other's order.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from web3 import Web3

from tests.devnet import tear_down, zoo
from zoo.devnet.manager import Devnet, DevnetInfo, warp
from zoo.registry.chain import ProposalState, RegistryClient, TokenClient
from zoo.registry.keys import dev_account

TOKEN = 10**18
Run = subprocess.CompletedProcess[str]
CID = "bafkreif7mj3riqa7oiyf4da5lvx5epsszua32bcnfzccykznwxn75gnaaa"


class Chain:
    def __init__(self, data_dir: Path, info: DevnetInfo) -> None:
        self.data_dir = data_dir
        self.info = info
        self.w3 = Web3(Web3.HTTPProvider(info.rpc_url))
        self.registry = RegistryClient(self.w3, info.registry_address)
        self.token = TokenClient(self.w3, info.token_address)

    def dao(self, *args: str, env: dict[str, str] | None = None):
        return zoo("dao", *args, "--data-dir", str(self.data_dir), env=env)

    def propose(self, *extra: str, key: str = "dev0", env: dict[str, str] | None = None) -> tuple[str, Run]:
        """Propose a fresh random root; on success, step the chain clock into its voting window."""
        root = "0x" + os.urandom(32).hex()
        result = self.dao("propose", "--root", root, "--cid", CID, "--key", key, *extra, env=env)
        if result.returncode == 0:
            # Voting opens one second after the proposal's block: do not depend on how fast the CLI starts.
            warp(self.w3, 1)
        return root, result


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


def row_of(table: str, root: str) -> str:
    """The line of `dao proposals` for `root` (shown as its first 12 hex digits)."""
    lines = [line for line in table.splitlines() if root[:14] in line]
    assert len(lines) == 1, table
    return lines[0]


def test_propose_vote_execute_round(chain: Chain) -> None:
    before = chain.registry.current()
    root, proposed = chain.propose()
    assert proposed.returncode == 0, proposed.stderr
    assert f"proposed {root}" in proposed.stdout
    assert f"signing as {dev_account(0).address}" in proposed.stderr
    prop = chain.registry.proposal(root)
    assert prop is not None and prop.cid == CID and prop.parent_root == before.root

    for voter in ("dev0", "dev1"):
        voted = chain.dao("vote", root, "--for", "--key", voter)
        assert voted.returncode == 0, voted.stderr
        assert "voted for" in voted.stdout
    assert "tally: for 2,000,000,000,000 against 0" in voted.stdout

    listed = chain.dao("proposals")
    assert listed.returncode == 0, listed.stderr
    row = row_of(listed.stdout, root)
    assert re.search(r"\bactive\b", row) and "2,000,000,000,000/2,000,000,000,000" in row, row

    tally = chain.registry.tallies(root)
    again = chain.dao("vote", root, "--for", "--key", "dev1")
    assert again.returncode == 1
    assert "already voted" in again.stderr
    assert dev_account(1).address in again.stderr
    assert chain.registry.tallies(root) == tally

    early = chain.dao("execute", root)
    assert early.returncode == 1
    assert "refused:" in early.stderr and "cannot be executed before" in early.stderr
    assert "Traceback" not in early.stderr
    assert chain.registry.current() == before

    warped = zoo("devnet", "warp", "400", "--data-dir", str(chain.data_dir))
    assert warped.returncode == 0, warped.stderr
    assert "chain time is now" in warped.stdout
    assert chain.registry.state(root) == ProposalState.SUCCEEDED

    executed = chain.dao("execute", root)
    assert executed.returncode == 0, executed.stderr
    assert f"library version {before.version + 1} is now {root}" in executed.stdout
    now = chain.registry.current()
    assert (now.version, "0x" + now.root.hex(), now.cid) == (before.version + 1, root, CID)

    shown = chain.dao("show", root)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"state\s+executed", shown.stdout), shown.stdout
    assert re.search(r"executed\s+True", shown.stdout), shown.stdout
    assert "2,000,000,000,000 / 0" in shown.stdout
    assert re.search(r"\bexecuted\b", row_of(chain.dao("proposals").stdout, root))


def test_propose_on_a_wrong_parent_is_refused_in_words(chain: Chain) -> None:
    wrong = "0x" + os.urandom(32).hex()
    current = "0x" + chain.registry.current_root().hex()
    root, result = chain.propose("--parent", wrong)
    assert result.returncode == 1
    assert "refused: wrong parent" in result.stderr
    assert wrong in result.stderr and current in result.stderr
    assert "Traceback" not in result.stderr
    assert chain.registry.proposal(root) is None


@pytest.mark.parametrize("bad", ["0x1234", "0x" + "zz" * 32, "0x" + "00" * 33, "not-a-root"])
def test_propose_with_an_invalid_root_exits_2(chain: Chain, bad: str) -> None:
    events = len(chain.registry.proposal_created_events())
    result = chain.dao("propose", "--root", bad, "--cid", CID)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "root must be 0x followed by 64 hex digits" in result.stderr
    assert len(chain.registry.proposal_created_events()) == events


def test_env_key_signs_as_its_account_and_is_never_printed(chain: Chain) -> None:
    signer = dev_account(5)
    key = signer.account.key.hex()
    bare = key.removeprefix("0x")
    root, result = chain.propose(key="env:MYKEY", env={"MYKEY": key})
    assert result.returncode == 0, result.stderr
    assert f"signing as {signer.address}" in result.stderr
    prop = chain.registry.proposal(root)
    assert prop is not None and prop.proposer == signer.address
    voted = chain.dao("vote", root, "--against", "--key", "env:MYKEY", env={"MYKEY": key})
    assert voted.returncode == 0, voted.stderr
    assert chain.registry.has_voted(root, signer.address)
    assert chain.registry.tallies(root).against_weight == 10**12

    # A damaged key is refused without echoing it either.
    damaged = bare[:-1] + ("0" if bare[-1] != "0" else "1") + "f"
    refused = chain.dao("vote", root, "--for", "--key", "env:MYKEY", env={"MYKEY": damaged})
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
