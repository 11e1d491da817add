"""A call proposal's calldata is its call's one encoding: the attack an adversarial run found, refused.

`hashCall(target, data)` hashed the bytes, and Solidity's decoder ignores bytes after a call's arguments. So
`registerNode(N)` proposed twice, once with 32 zero bytes appended, passed twice: the canonical one ran,
the padded one was another call to the staleness rule and stayed executable; after the DAO deregistered N,
anyone executed it and N was registered again with no vote. The registry now takes only the DAO's calls
(the ledger's governor functions, its own cancel) and only as `abi.encodeWithSelector(selector, args...)`
of the arguments they hold, refusing anything else with the calldata and its canonical form."""

from __future__ import annotations

import pytest
from web3 import Web3

from tests.contracts.ledger_support import GOVERNOR
from tests.contracts.support import DAY, World, pass_call, pass_ids, refused
from zoo.registry.chain import ContractRevert, ProposalState, deploy_ledger
from zoo.registry.keys import dev_account

NODE = 6


@pytest.fixture(scope="module")
def ledger_address(deployed: World) -> str:
    """A ledger whose governor is the registry: only a passed call proposal registers nodes."""
    return deploy_ledger(
        deployed.w3, dev_account(0), governor=deployed.registry_address, keeper_token=deployed.token_address,
        epoch_length=DAY, challenge_window=DAY, artifacts=deployed.artifacts,
    )  # fmt: skip


@pytest.fixture(scope="module")
def direct_ledger(deployed: World) -> str:
    """A ledger whose governor is an account, to send it raw calldata and see what its decoder does."""
    return deploy_ledger(
        deployed.w3, dev_account(0), governor=deployed.address(GOVERNOR), keeper_token=deployed.token_address,
        epoch_length=DAY, challenge_window=DAY, artifacts=deployed.artifacts,
    )  # fmt: skip


def word(value: int) -> bytes:
    return value.to_bytes(32, "big")


def variants(world: World, ledger_address: str) -> dict[str, tuple[bytes, bytes]]:
    """name -> (non-canonical calldata, the canonical calldata of what it holds)."""
    ledger = world.ledger(ledger_address)
    node = world.address(NODE)
    register = ledger.governor_call("registerNode", node)
    deregister = ledger.governor_call("deregisterNode", node)
    dismiss = ledger.governor_call("resolveChallenge", node, 7, False)
    uphold = ledger.governor_call("resolveChallenge", node, 7, True)
    dirty_address = bytearray(register)
    dirty_address[4] = 0x01  # a high bit of the address word
    high_bool = bytearray(uphold)
    high_bool[4 + 64] = 0x80  # the bool word's top byte: true to `!= 0`, not 1
    return {
        **{f"appended {n}": (register + bytes(n), register) for n in (1, 3, 31, 32, 64)},
        "appended nonzero 32": (register + b"\xff" * 32, register),
        "deregister appended 3": (deregister + b"\x00\x00\x01", deregister),
        "dismissal appended 32": (dismiss + bytes(32), dismiss),
        "dismissal appended 1": (dismiss + b"\x00", dismiss),
        "address high bits": (bytes(dirty_address), register),
        "bool word 2": (dismiss[:-32] + word(2), uphold),
        "bool high byte": (bytes(high_bool), uphold),
        "argument cut short": (register[:-1], ledger.governor_call("registerNode", "0x" + "00" * 20)),
        "selector only": (register[:4], ledger.governor_call("registerNode", "0x" + "00" * 20)),
    }


VARIANTS = [
    "appended 1", "appended 3", "appended 31", "appended 32", "appended 64", "appended nonzero 32",
    "deregister appended 3", "dismissal appended 32", "dismissal appended 1", "address high bits",
    "bool word 2", "bool high byte", "argument cut short", "selector only",
]  # fmt: skip


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_non_canonical_encoding_of_a_dao_call_is_refused(
    world: World, ledger_address: str, variant: str
) -> None:
    data, canonical = variants(world, ledger_address)[variant]
    target = Web3.to_checksum_address(ledger_address)
    with refused("NonCanonicalCall", "not the one encoding", target=target, data=data, canonical=canonical):
        world.registry().propose_call(ledger_address, data)
    # Control: the canonical call is accepted.
    pid = world.registry().propose_call(ledger_address, canonical).proposal_id
    assert world.registry().proposed_call(pid) == (target, canonical)


def test_the_padded_leftover_cannot_re_register_a_deregistered_node(
    world: World, ledger_address: str
) -> None:
    """The attack end to end: only the canonical registerNode(N) can be proposed, so the second proposal
    of it is the same call, stale once the first ran, and N stays deregistered."""
    node, reg = world.address(NODE), world.registry()
    ledger = world.ledger(ledger_address)
    register = ledger.governor_call("registerNode", node)
    for padding in (bytes(32), bytes(3)):
        with refused("NonCanonicalCall", data=register + padding, canonical=register):
            reg.propose_call(ledger_address, register + padding)
    first = reg.propose_call(ledger_address, register).proposal_id
    leftover = world.registry(2).propose_call(ledger_address, register).proposal_id
    pass_ids(world, first, leftover)
    assert reg.state(first) is reg.state(leftover) is ProposalState.SUCCEEDED
    reg.execute(first)
    assert reg.state(leftover) is ProposalState.STALE
    reg.execute(pass_call(world, ledger_address, ledger.governor_call("deregisterNode", node)))
    with refused("CallProposalStale", proposalId=leftover, executionsAtProposal=0, executionsNow=1):
        world.registry(9).execute(leftover)
    assert not ledger.is_registered(node)


def test_only_the_daos_calls_may_be_proposed(world: World, ledger_address: str) -> None:
    ledger, reg = world.ledger(ledger_address), world.registry()
    target = Web3.to_checksum_address(ledger_address)
    node = world.address(NODE)
    calls = {
        "withdraw": ledger.contract.encode_abi("withdraw", args=[]),
        "challenge": ledger.contract.encode_abi("challenge", args=[node, 1, "x"]),
        "settleLapsedChallenge": ledger.contract.encode_abi("settleLapsedChallenge", args=[node, 1]),
        "cancel on the ledger": reg.cancel_call(1).hex(),
        "unknown selector": "0xdeadbeef" + "00" * 32,
    }
    for name, hex_data in calls.items():
        data = bytes.fromhex(hex_data.removeprefix("0x"))
        with refused("CallNotAllowed", target=target, selector=data[:4]):
            reg.propose_call(ledger_address, data)
        assert name
    # The token is a contract too, and still no target for a transfer.
    token = world.token()
    transfer = bytes.fromhex(token.contract.encode_abi("transfer", args=[node, 1])[2:])
    with refused("CallNotAllowed", target=Web3.to_checksum_address(world.token_address)):
        reg.propose_call(world.token_address, transfer)
    # On the registry itself, cancel is the only call, and only canonically encoded.
    registry = Web3.to_checksum_address(world.registry_address)
    cancel = reg.cancel_call(1)
    with refused("NonCanonicalCall", target=registry, data=cancel + bytes(32), canonical=cancel):
        reg.propose_call(world.registry_address, cancel + bytes(32))
    reg.propose_call(world.registry_address, cancel)  # control


def test_what_the_ledgers_decoder_accepts_directly(world: World, direct_ledger: str) -> None:
    """Why appended bytes were the hole: the target runs them as the call; dirty padding it refuses (so such
    a proposal could never have run, and is refused now at proposal time all the same)."""
    gov = world.ledger(direct_ledger, GOVERNOR)
    node = world.address(NODE)
    register = gov.governor_call("registerNode", node)
    gov._sender.send(gov.address, register + bytes(32), 0)
    assert gov.is_registered(node)  # 32 appended bytes: the same call
    deregister = gov.governor_call("deregisterNode", node)
    gov._sender.send(gov.address, deregister + b"\x00\x00\x01", 0)
    assert not gov.is_registered(node)  # 3 appended bytes too
    dirty = bytearray(register)
    dirty[4] = 0x01
    resolve = gov.governor_call("resolveChallenge", node, 7, False)
    for data in (bytes(dirty), resolve[:-32] + word(2), register[:-1]):
        with pytest.raises(ContractRevert) as info:
            gov._sender.send(gov.address, data, 0)
        assert info.value.error is None, str(info.value)  # the decoder's own revert, without data
    assert not gov.is_registered(node)


def test_dao_show_says_when_calldata_is_not_canonical(world: World, ledger_address: str) -> None:
    """What an older registry (before DaoCalls) may hold: `dao show` must not print a padded call as the
    plain one."""
    ledger = world.ledger(ledger_address)
    node = world.address(NODE)
    register = ledger.governor_call("registerNode", node)
    assert ledger.describe_call(register) == f"registerNode({node})"
    shown = ledger.describe_call(register + bytes(32))
    assert shown.startswith(f"registerNode({node}), NOT canonically encoded (68 bytes"), shown
    dirty = bytearray(register)
    dirty[4] = 0x01
    for refused_by_the_ledger in (bytes(dirty), register[:-1]):
        shown = ledger.describe_call(refused_by_the_ledger)
        assert shown.startswith("registerNode(…) with arguments the ledger refuses"), shown
