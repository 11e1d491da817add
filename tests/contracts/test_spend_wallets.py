"""A spend consent names its client: the attack an adversarial run found on a live devnet, refused.

SpendAuthorization(node, epoch, units) was signed by a key, and the ledger checks contract clients through
ERC-1271, which for a plain wallet means "did my owner sign this digest". So the same 65 bytes an owner
signed were accepted for every wallet it controls: its consent for one account charged all of them. The
consent is now SpendAuthorization(client, node, epoch, units): a signature serves only the client named in
it. Tested with a real ERC-1271 wallet (tests/contracts/sol, compiled by zoo.contracts.build) owned by
one key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.contracts.ledger_support import CLIENT, GOVERNOR, NODE, Report, posted
from tests.contracts.support import DAY, TOKEN, World, refused
from zoo.contracts.build import Artifacts, build
from zoo.registry.chain import SpendAuthorization, deploy_contract, deploy_ledger, sign_spend_authorization
from zoo.registry.chain.ledger import SPENT
from zoo.registry.keys import dev_account

OWNER = CLIENT  # one key owns both wallets
UNITS = 500


@pytest.fixture(scope="module")
def test_artifacts() -> Artifacts:
    """The test-only contracts, compiled by the project's build path."""
    return build(sources_dir=Path(__file__).parent / "sol")


@pytest.fixture(scope="module")
def setup(deployed: World, test_artifacts: Artifacts) -> tuple[str, str, str]:
    """(ledger, wallet A, wallet B): two OwnedWallets of one owner key, beside a fresh ledger."""
    deployer = dev_account(0)
    ledger = deploy_ledger(
        deployed.w3, deployer, governor=deployed.address(GOVERNOR), keeper_token=deployed.token_address,
        epoch_length=DAY, challenge_window=DAY, challenge_threshold=TOKEN, artifacts=deployed.artifacts,
    )  # fmt: skip
    owner = deployed.address(OWNER)
    a, b = (
        deploy_contract(deployed.w3, deployer, "OwnedWallet", owner, artifacts=test_artifacts) for _ in "ab"
    )
    return ledger, a, b


def test_a_wallet_owners_consent_for_one_account_never_charges_another(
    world: World, setup: tuple[str, str, str]
) -> None:
    ledger, wallet_a, wallet_b = setup
    owner_key, owner = dev_account(OWNER), world.address(OWNER)
    report = Report([(SPENT, wallet_a, UNITS), (SPENT, wallet_b, UNITS), (SPENT, owner, UNITS)])
    epoch = posted(world, ledger, report)
    world.advance(DAY)
    node, chain, anyone = world.address(NODE), world.w3.eth.chain_id, world.ledger(ledger, 9)

    def signed_for(client: str) -> SpendAuthorization:
        return sign_spend_authorization(owner_key, chain, ledger, node, epoch, UNITS, client=client)

    def presented(client: str, consent: SpendAuthorization) -> SpendAuthorization:
        return SpendAuthorization(client, node, epoch, UNITS, consent.signature)

    for_a, for_self = signed_for(wallet_a), signed_for(owner)
    # The attack: the owner's consent for its own account, then for wallet A, presented for the others.
    for client, consent in ((wallet_a, for_self), (wallet_b, for_self), (wallet_b, for_a)):
        refusal = {"node": node, "epoch": epoch, "client": client, "authorized": UNITS}
        with refused("InvalidSpendAuthorization", **refusal):
            anyone.apply_spent(node, epoch, *report.proof(SPENT, client), presented(client, consent))
    assert anyone.spent(wallet_b) == 0 and anyone.spent(wallet_a) == 0
    # Control: each consent charges the account it names, a wallet through ERC-1271 and the key itself.
    anyone.apply_spent(node, epoch, *report.proof(SPENT, wallet_a), for_a)
    anyone.apply_spent(node, epoch, *report.proof(SPENT, owner), for_self)
    assert anyone.spent(wallet_a) == UNITS and anyone.spent(owner) == UNITS and anyone.spent(wallet_b) == 0
    # Wallet B pays only once its owner consents for it.
    anyone.apply_spent(node, epoch, *report.proof(SPENT, wallet_b), signed_for(wallet_b))
    assert anyone.spent(wallet_b) == UNITS
