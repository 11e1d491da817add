"""The DAO's approved base models on a real anvil: the ExperienceRegistry's list of model weights (by their
SHA-256) that a library may name, kept only by passed call proposals of its own `setBaseModel`, each in its
one encoding; nobody else can change it, and a change that would change nothing reverts."""

from __future__ import annotations

from web3 import Web3
from web3.logs import DISCARD

from tests.contracts.support import World, pass_call, refused
from tests.contracts.test_dao_canonical import word

MODEL = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
OTHER = "ab" * 32


def test_the_dao_approves_and_withdraws_base_models(world: World) -> None:
    reg = world.registry()
    assert reg.base_models() == [] and not reg.base_model_approved(MODEL)
    for model in (MODEL, OTHER):
        tx = reg.execute(pass_call(world, world.registry_address, reg.base_model_call(model)))
    receipt = world.w3.eth.get_transaction_receipt(tx.tx_hash)
    events = reg.contract.events.BaseModelSet().process_receipt(receipt, errors=DISCARD)
    assert [(bytes(e["args"]["modelHash"]).hex(), e["args"]["approved"]) for e in events] == [(OTHER, True)]
    assert reg.base_models() == sorted([MODEL, OTHER]) and reg.base_model_approved(MODEL)
    # Withdrawing the first keeps the list whole (the last one moves into its place).
    reg.execute(pass_call(world, world.registry_address, reg.base_model_call(MODEL, approve=False)))
    assert reg.base_models() == [OTHER] and not reg.base_model_approved(MODEL)
    # And it can be approved again later, by a fresh proposal.
    reg.execute(pass_call(world, world.registry_address, reg.base_model_call(MODEL)))
    assert reg.base_models() == sorted([MODEL, OTHER])


def test_a_change_that_changes_nothing_reverts_and_nobody_but_the_dao_may_make_one(world: World) -> None:
    reg = world.registry()
    with refused("OnlyDao", caller=world.address(0)):
        reg._transact("setBaseModel", bytes.fromhex(MODEL), True)
    withdraw = pass_call(world, world.registry_address, reg.base_model_call(MODEL, approve=False))
    with refused("BaseModelUnchanged", modelHash=bytes.fromhex(MODEL), approved=False):
        reg.execute(withdraw)  # not approved: nothing to withdraw
    zero = pass_call(world, world.registry_address, reg.base_model_call("00" * 32))
    with refused("ZeroModelHash"):
        reg.execute(zero)
    assert reg.base_models() == []


def test_only_the_canonical_encoding_of_set_base_model_may_be_proposed(world: World) -> None:
    reg = world.registry()
    target = Web3.to_checksum_address(world.registry_address)
    approve = reg.base_model_call(MODEL)
    for data, canonical in (
        (approve + bytes(32), approve),
        (approve[:-32] + word(2), approve),  # a bool word other than 0 or 1
        (approve[:-1], reg.base_model_call(MODEL, approve=False)),  # its bool word cut short
    ):
        with refused("NonCanonicalCall", target=target, data=data, canonical=canonical):
            reg.propose_call(world.registry_address, data)
    reg.propose_call(world.registry_address, approve)  # control
