"""`zoo-node dao …`: contributors propose library versions, KEEPER holders vote and execute.

Signing keys come from --key: "devN" (a devnet dev account), "env:VAR" (hex private key in VAR) or
"keystore:PATH" (password from ZOO_NODE_KEYSTORE_PASSWORD). On the devnet --key defaults to dev0.
Keys are never printed or logged. Reverts are shown as the contract's custom error in words.

The group's commands live in modules by job and are added here, in the order `zoo-node dao --help` lists
them: proposals of library versions and what every proposal goes through (dao_proposals.py), the DAO's
call proposals (dao_calls.py) and its approved base models (dao_models.py), the review of a proposal's
content (dao_review.py) and KEEPER voting power (dao_voting_power.py); what they share is in dao_lookup.py.
"""

from __future__ import annotations

import typer

from zoo.node.cli import dao_calls, dao_models, dao_proposals, dao_review, dao_voting_power

app = typer.Typer(
    help="Governance: propose, vote on and execute library versions and the DAO's calls (node registration, "
    "base models).",
    no_args_is_help=True,
)

app.command()(dao_proposals.propose)
app.command("propose-node")(dao_calls.propose_node)
app.command("propose-resolve")(dao_calls.propose_resolve)
app.command()(dao_proposals.cancel)
app.command("propose-cancel")(dao_calls.propose_cancel)
app.command("propose-model")(dao_models.propose_model)
app.command("models")(dao_models.models)
app.command()(dao_proposals.vote)
app.command()(dao_proposals.execute)
app.command("review")(dao_review.review_cmd)
app.command()(dao_proposals.proposals)
app.command()(dao_proposals.show)
app.command()(dao_voting_power.balance)
app.command()(dao_voting_power.delegate)
