"""The devnet's genesis library: a handful of real lessons across domains, with fixed provenance so that
every machine builds byte-identical content and the same Merkle root."""

from __future__ import annotations

from zoo.registry.experience import Experience
from zoo.registry.library import Library

GENESIS_TIME = "2026-01-01T00:00:00Z"
GENESIS_AUTHOR = "job:devnet-genesis"
BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"

_LESSONS: tuple[tuple[str, str, float], ...] = (
    ("math.arithmetic", "When adding or subtracting multi-digit numbers, align the digits by place value and "
     "carry or borrow one column at a time.", 0.9),
    ("math.arithmetic", "When a word problem asks for a total, list every quantity with its unit before "
     "combining them.", 0.8),
    ("math.geometry", "When finding the area of a triangle, multiply base by height and halve the product; "
     "check the height is perpendicular to the base.", 0.9),
    ("math.geometry", "When a problem involves a right triangle, test whether the Pythagorean theorem links "
     "the known sides.", 0.85),
    ("finance.interest", "When computing compound interest, apply the rate once per period to the growing "
     "balance instead of multiplying the rate by the years.", 0.85),
    ("units.conversion", "When converting units, write the conversion factor as a fraction that cancels the "
     "old unit.", 0.8),
    ("code.python", "When a function must handle an empty input, return early with the neutral value before "
     "the main loop.", 0.75),
)  # fmt: skip


def genesis_library(version: int = 1) -> Library:
    experiences = [
        Experience.create(
            text=text,
            domain=domain,
            confidence=conf,
            author=GENESIS_AUTHOR,
            base_model=BASE_MODEL,
            created_at=GENESIS_TIME,
        )
        for domain, text, conf in _LESSONS
    ]
    return Library.create(
        version=version,
        base_model=BASE_MODEL,
        experiences=experiences,
        description="zoo-node devnet genesis library",
    )
