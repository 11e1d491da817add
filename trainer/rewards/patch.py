"""patch_similarity (SWE-RL-style reward of the GSPO thesis, eq. 3.1), and the patch parsing it needs:

    R = (1 / max(|F_c|, |F_r|)) · Σ_{f ∈ F_c ∩ F_r} ratio(s_c(f), s_r(f))

F_c, F_r: files touched by the completion and by the reference; a file on one side only adds 0.
s(f) for a unified diff is the file's changed lines in order, each with its "+" or "-" sign (hunk headers
and context lines dropped: they depend on diff settings, not on the change); for a file map
({"path": "content"} JSON) it is the content; when one side is a diff and the other a file map, the
diff's added lines (without signs) are compared with the content. ratio is
difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() over characters when both strings are at most
4,000 characters, else over lines (character matching is quadratic: ~1 s at 10k characters). autojunk is
off because its "popular element" heuristic wrecks character-level ratios of long texts.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field

from zoo.registry.errors import ValidationError
from zoo.trainer.rewards.base import _FENCE_RE, BaseReward, RewardResult, _clip, _require_answer, register
from zoo.trainer.tasks.schema import Task

CHAR_RATIO_LIMIT = 4000


@dataclass
class FileChange:
    """What a patch or file map says about one file: signed changed lines, or the new content."""

    changes: list[str] = field(default_factory=list)  # "+line" / "-line" in order (diffs only)
    content: str | None = None  # file maps only

    def added(self) -> str:
        if self.content is not None:
            return self.content
        return "\n".join(line[1:] for line in self.changes if line.startswith("+"))


def _diff_path(header: str) -> str | None:
    path = header[4:].split("\t", 1)[0].strip()
    if path == "/dev/null":
        return None
    if path.startswith('"') and path.endswith('"'):
        path = path[1:-1]
    return path[2:] if path.startswith(("a/", "b/")) else path


def _fenced(text: str, tags: set[str]) -> str | None:
    blocks = [m.group(2) for m in _FENCE_RE.finditer(text) if m.group(1).lower() in tags]
    return blocks[-1] if blocks else None


def parse_file_map(text: str) -> dict[str, FileChange] | None:
    """A JSON object of path -> content (bare or in a ```json block), or None when `text` is not one."""
    for candidate in (text.strip(), _fenced(text, {"json"})):
        if not candidate:
            continue
        try:
            data = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if (
            isinstance(data, dict)
            and data
            and all(isinstance(k, str) and isinstance(v, str) for k, v in data.items())
        ):
            return {k: FileChange(content=v) for k, v in data.items()}
    return None


def parse_unified_diff(text: str) -> dict[str, FileChange]:
    """Files of a unified diff (git or plain): "+++ b/path" names the file ("--- a/path" for a deletion).

    Hunk line counts are not trusted (model-written diffs often get them wrong): inside a file, lines
    starting with "+" or "-" are changes, except a "--- " line directly followed by "+++ ", which starts
    the next file.
    """
    fenced = _fenced(text, {"diff", "patch", "udiff"})
    lines = (fenced if fenced is not None else text).splitlines()
    files: dict[str, FileChange] = {}
    current: FileChange | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            match = re.match(r"diff --git a/(.+) b/(.+)$", line)
            current = files.setdefault(match.group(2), FileChange()) if match else None
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            path = _diff_path(lines[i + 1]) or _diff_path(line)
            current = files.setdefault(path, FileChange()) if path else None
            i += 1
        elif current is not None and line[:1] in "+-" and line:
            current.changes.append(line)
        i += 1
    return files


def parse_patch(text: str) -> tuple[str, dict[str, FileChange]]:
    """("files", map) for a JSON file map, else ("diff", files of the unified diff)."""
    file_map = parse_file_map(text)
    if file_map is not None:
        return "files", file_map
    return "diff", parse_unified_diff(text)


def similarity(a: str, b: str) -> float:
    """difflib ratio over characters for short strings, over lines for long ones (see module docstring)."""
    if len(a) <= CHAR_RATIO_LIMIT and len(b) <= CHAR_RATIO_LIMIT:
        return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
    return difflib.SequenceMatcher(None, a.splitlines(), b.splitlines(), autojunk=False).ratio()


def patch_similarity(completion: str, reference: str) -> tuple[float, dict[str, float], int, int]:
    """Eq. 3.1 of the GSPO thesis: (R, per-file ratios of shared files, |F_c|, |F_r|)."""
    kind_c, files_c = parse_patch(completion)
    kind_r, files_r = parse_patch(reference)
    both_diffs = kind_c == kind_r == "diff"
    per_file: dict[str, float] = {}
    for path in sorted(files_c.keys() & files_r.keys()):
        c, r = files_c[path], files_r[path]
        if both_diffs:
            per_file[path] = similarity("\n".join(c.changes), "\n".join(r.changes))
        else:
            per_file[path] = similarity(c.added(), r.added())
    denominator = max(len(files_c), len(files_r))
    score = sum(per_file.values()) / denominator if denominator else 0.0
    return score, per_file, len(files_c), len(files_r)


@register("patch_similarity")
class PatchSimilarity(BaseReward):
    """Similarity of the completion's patch (unified diff or file map) to the reference patch."""

    needs_answer = True

    @classmethod
    def check_task(cls, task: Task) -> None:
        super().check_task(task)
        if task.answer is not None and not parse_patch(task.answer)[1]:
            raise ValidationError(
                "answer", "the reference patch names no file (need a unified diff or file map)"
            )

    def score(self, task: Task, completion: str) -> RewardResult:
        reference = _require_answer(task, self.name)
        score, per_file, n_c, n_r = patch_similarity(completion, reference)
        details = {"per_file": per_file, "files_completion": n_c, "files_reference": n_r}
        if n_c == 0:
            return RewardResult(
                0.0, "no file changes found in the completion (expected a unified diff)", details
            )
        shown = ", ".join(f"{p} {r:.2f}" for p, r in list(per_file.items())[:4]) or "none"
        reason = f"similarity {score:.2f} over max({n_c}, {n_r}) files; shared files: {shown}"
        return RewardResult(min(1.0, score), _clip(reason), details)
