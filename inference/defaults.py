"""How a node serves unless its config says otherwise, in one place: the node's config (inference.*) and
learning jobs both start from these, so a library is validated under the conditions it is served in.

Light on purpose (no torch): the config and the CLI import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DEFAULT_K = 5  # experiences retrieved into a prompt
DEFAULT_MAX_TOKENS = 256  # tokens generated when a request does not say
DEFAULT_EXPERIENCE_BUDGET = 512  # prompt tokens the experiences may take

LessonPosition = Literal["system", "user"]
LESSON_POSITIONS: tuple[LessonPosition, ...] = ("system", "user")
DEFAULT_LESSON_POSITION: LessonPosition = "system"

# The relevance gate: a retrieved experience whose cosine similarity to the query is below this stays out
# of the prompt, so a query the library has nothing for is answered as with no library. Measured with the
# bundled embedder: the shipped convention families' test questions score 0.52-0.97 against their own
# training questions, the shipped coding tasks 0.03-0.22 and arithmetic 0.20-0.65 (median 0.28) against them.
DEFAULT_MIN_SIMILARITY = 0.35

DEFAULT_FACTOR_ETA = 1.0  # η: the scale of every expert factor's log-odds weight
DEFAULT_FACTOR_CAP = 4.0  # the bound of one expert factor's weight, either way


@dataclass(frozen=True)
class ServingDefaults:
    """The prompt and decode settings a learning job takes from the node when its spec leaves them unset."""

    k: int = DEFAULT_K
    experience_budget_tokens: int = DEFAULT_EXPERIENCE_BUDGET
    lesson_position: LessonPosition = DEFAULT_LESSON_POSITION
    min_similarity: float = DEFAULT_MIN_SIMILARITY
    factor_eta: float = DEFAULT_FACTOR_ETA
    factor_cap: float = DEFAULT_FACTOR_CAP
