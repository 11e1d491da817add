"""A metered receipt: one answer as an epoch's receipts log keeps it (node/credits/receipt_log.py).

The node's signed receipt of the answer (node/provenance/receipts.py), the experiences it credited (id
and author: those it cited, else every one it was served) and the credits it cost its client. Its
canonical JSON is its leaf in the epoch's receipts tree. Metering makes one per answer
(node/components/inference.py), so this module imports nothing of the chain (no web3 on the daemon's
start-up path).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zoo.node.credits.meter import Served, shares_of
from zoo.node.provenance.receipts import ZERO_ADDRESS, Receipt, parse
from zoo.registry.errors import ValidationError

MAX_CREDITED = 1024  # experiences one answer can credit (the prompt holds far fewer)


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


@dataclass(frozen=True)
class MeteredReceipt:
    """One metered answer: the node's signed receipt, the (experience id, author) pairs it credited (by
    id), and the credits it cost its client."""

    receipt: Receipt
    credited: tuple[tuple[str, str], ...]
    spent: int = 0

    @classmethod
    def of(cls, receipt: Receipt, credited: Sequence[Served], spent: int) -> MeteredReceipt:
        return cls(receipt, tuple(sorted((s.id, s.author) for s in credited)), spent)

    @property
    def units(self) -> int:
        """The answer's tokens, prompt and completion: what the meter shares among the credited."""
        return self.receipt.prompt_tokens + self.receipt.completion_tokens

    def shares(self) -> dict[str, int]:
        """The units each author earned from this answer, by the meter's rule."""
        return shares_of(self.units, [Served(i, a, True) for i, a in self.credited])

    def to_json(self) -> dict[str, Any]:
        return {
            "receipt": self.receipt.to_json(),
            "credited": [list(c) for c in self.credited],
            "spent": self.spent,
        }

    def leaf(self) -> bytes:
        """Its leaf in the epoch's receipts tree: its canonical JSON."""
        return canonical_json(self.to_json())

    @classmethod
    def parse(cls, data: Any, where: str = "receipt") -> MeteredReceipt:
        """From its JSON (untrusted: fetched from IPFS); ValidationError naming what is wrong."""
        if not isinstance(data, dict) or set(data) != {"receipt", "credited", "spent"}:
            raise ValidationError(where, "must be an object with receipt, credited and spent")
        receipt = parse(data["receipt"])
        credited = data["credited"]
        if not isinstance(credited, list) or len(credited) > MAX_CREDITED:
            raise ValidationError(f"{where}.credited", f"must be a list of at most {MAX_CREDITED} pairs")
        pairs = []
        for i, pair in enumerate(credited):
            ok = isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
            if not ok or not 0 < len(pair[0]) <= 256 or not 0 < len(pair[1]) <= 256:
                raise ValidationError(
                    f"{where}.credited[{i}]", "must be [experience id, author], 1-256 chars"
                )
            pairs.append((pair[0], pair[1]))
        if pairs != sorted(set(pairs)):
            raise ValidationError(f"{where}.credited", "must be sorted by experience id, each once")
        spent = data["spent"]
        if type(spent) is not int or not 0 <= spent < 2**63:
            raise ValidationError(f"{where}.spent", "must be an integer from 0 to 2**63 - 1")
        if spent and receipt.client == ZERO_ADDRESS:
            raise ValidationError(f"{where}.spent", "an anonymous answer spends no credits")
        return cls(receipt, tuple(pairs), spent)
