"""Final-answer extraction and matching, shared by exact_match and majority_vote.

The answer is the last \\boxed{...} (nested braces allowed), else the last "answer is X" / "Answer: X" /
"#### X", else the last number in the text. When the reference is a number, the value the extracted
answer states (the last side of an equation chain, "9 * 100 = 900 m" is 900; else its first number) is
compared exactly as a fractions.Fraction (so "1,000" == "1000", "2.50" == "2.5" == "5/2", "\\frac{3}{4}"
== "0.75", and unit words such as "km" are ignored); otherwise the normalised strings are compared (case,
whitespace, LaTeX wrappers, a trailing full stop ignored).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_MARKER_RE = re.compile(
    r"(?:\banswer\s*(?:is\b\s*[:=]?|[:=])|^[ \t]*####)[ \t]*(?:\n[ \t]*)?\**[ \t]*(?P<ans>[^\n]*)",
    re.IGNORECASE | re.MULTILINE,
)
# A number: optional minus, digits with optional thousands commas, optional decimals, optional "/denominator".
# The lookbehind keeps "x5" and the "5" of "3.5" from counting as numbers on their own.
_NUMBER_RE = re.compile(
    r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+(?:\.\d+)?)?|(?<![\w.])-?\.\d+"
)
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_WRAPPER_RE = re.compile(
    r"\\(?:boxed|fbox|text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}"
)
_LATEX_NOISE = (
    "\\left",
    "\\right",
    "\\displaystyle",
    "\\!",
    "\\,",
    "\\;",
    "\\:",
    "\\ ",
    "\\(",
    "\\)",
    "\\[",
    "\\]",
)


def _last_boxed(text: str) -> str | None:
    # The content of the last top-level \boxed{...}; a \boxed nested inside it is part of its content.
    found: str | None = None
    end = 0
    for match in _BOXED_RE.finditer(text):
        if match.start() < end:
            continue
        depth, i = 1, match.end()
        while i < len(text) and depth:
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
            i += 1
        if depth == 0:
            found, end = text[match.end() : i - 1], i
    return found


def _cut_sentence(text: str) -> str:
    # "12 apples. Then..." / "12, since 7 + 5 = 12" -> "12 apples" / "12". A decimal point or a thousands
    # comma is followed by a digit, not by a space, so "3.5" and "1,000" stay whole.
    return re.split(r"[.,;](?=\s|$)|\n", text.strip(), maxsplit=1)[0]


def _latex_plain(text: str) -> str:
    for _ in range(3):  # nested \frac / \text: peel a few levels
        text = _FRAC_RE.sub(r"\1/\2", text)
        text = _WRAPPER_RE.sub(r"\1", text)
    for noise in _LATEX_NOISE:
        text = text.replace(noise, " ")
    return text.replace("\u2212", "-").replace("$", " ")


@dataclass(frozen=True)
class Extracted:
    """A completion's final answer as written (`text`) and how it was found (boxed, marker or last_number)."""

    text: str
    method: str


def extract_answer(completion: str) -> Extracted | None:
    """The final answer of a completion, or None when it has none (see the module docstring for the order).

    What follows a marker ("answer is ...") is cut at the end of its sentence or clause. Without a digit
    it only counts when no number follows it in the text: "the answer is not obvious, ... so 12" is prose,
    and the last number is the better guess, while "The answer is Paris." stands.
    """
    boxed = _last_boxed(completion)
    if boxed is not None and boxed.strip():
        return Extracted(boxed.strip(), "boxed")
    for match in reversed(list(_MARKER_RE.finditer(completion))):
        cut = _cut_sentence(match.group("ans"))
        answer = cut.strip(" \t*`'\"")
        if not answer:
            continue
        after = match.group("ans")[len(cut) :] + completion[match.end() :]
        if re.search(r"\d", answer) or not _NUMBER_RE.search(_latex_plain(after)):
            return Extracted(answer, "marker")
        break  # prose after the last marker: earlier markers are older still, use the last number
    numbers = _NUMBER_RE.findall(_latex_plain(completion))
    if numbers:
        return Extracted(numbers[-1], "last_number")
    return None


def parse_number(text: str) -> Fraction | None:
    """The exact value of a number written as "1,234.50", "-3/4", "1e3" or "5."; None if it is not one."""
    text = text.strip().replace("\u2212", "-")
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            value = Fraction(num.strip()) / Fraction(den.strip())
        else:
            value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None
    return value


def normalise_answer(text: str) -> str:
    """Normalised text form: LaTeX wrappers and $ removed, lower case, whitespace collapsed, no final '.'."""
    text = _latex_plain(text).replace("**", "").replace("`", "")
    text = " ".join(text.lower().split())
    return text.strip(" .'\"")


# "=" of an equation chain, not of "<=", ">=", "!=", "==" or "=>"; also the word "equals".
_EQUALS_RE = re.compile(r"(?<![<>=!])=(?![=>])|\bequals\b|\bis equal to\b", re.IGNORECASE)
_PARENTHESISED = re.compile(r"\([^()]*\)")
# What makes the text before the first "=" a computation (or a variable) whose result comes last.
# (Operators include the multiplication, division and middle-dot signs and LaTeX's times, cdot and div.)
_COMPUTATION = re.compile(r"[-+*/\u00d7\u00f7^\u00b7]|\\(?:times|cdot|div)\b|^\s*[A-Za-z]\w{0,2}\s*$")


def answer_value(text: str) -> Fraction | None:
    """The value an extracted answer states, as a person reads it. A computation chain states its result
    last ("9 * 100 = 900 meters" -> 900, "x = -3" -> -3); otherwise the first number counts ("1,000
    meters" -> 1000, "12 = 3 * 4" -> 12, "2 km (= 2000 m)" -> 2: asides in parentheses are ignored)."""
    plain = _latex_plain(text)
    while _PARENTHESISED.search(plain):
        plain = _PARENTHESISED.sub(" ", plain)
    sides = _EQUALS_RE.split(plain)
    if len(sides) > 1 and _COMPUTATION.search(sides[0]):
        for side in reversed(sides):
            match = _NUMBER_RE.search(side)
            if match:
                return parse_number(match.group())
    match = _NUMBER_RE.search(plain)
    return parse_number(match.group()) if match else None


def _fmt_number(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return str(value)


def answer_key(text: str) -> tuple[int, Fraction | str]:
    """A comparable key for an extracted answer: (0, value) when it holds a number, else (1, normalised)."""
    number = answer_value(text)
    if number is not None:
        return (0, number)
    return (1, normalise_answer(text))


def _key_text(key: tuple[int, Fraction | str]) -> str:
    value = key[1]
    return _fmt_number(value) if isinstance(value, Fraction) else str(value)


def answers_match(candidate: str, expected: str) -> bool:
    """True when an extracted answer equals the reference (numerically when the reference is a number)."""
    expected_value = parse_number(normalise_answer(expected))
    if expected_value is not None:
        return answer_value(candidate) == expected_value
    return normalise_answer(candidate) == normalise_answer(expected)
