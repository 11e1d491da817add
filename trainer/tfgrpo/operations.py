"""Stage 3 of a TF-GRPO step: consolidate a batch's proposed operations and apply them to a library.

Deterministic given the proposals, the embeddings and the merge replies:

0. Before any of this, `screen_lesson` turns away a critic text that cannot be a lesson however it is
   worded: an unfilled template ("When [insert text here]") or a restatement of the group's own question
   ("When the fence is 1 m long" for "A fence is 1 m long. ..."), which teaches nothing beyond that task.
1. modify/delete naming an id the library lacks are rejected; several deletes of one id are one delete.
2. Conflicts: delete beats modify (an id anyone deletes is not modified).
3. Duplicates are found by embedding similarity (cosine ≥ threshold), never by string equality alone:
   the new texts of a batch (adds and modify texts) are grouped into clusters (connected components of
   the similarity graph); a cluster that also resembles an existing, surviving lesson becomes a modify of
   that lesson; several texts in one cluster are merged into one lesson by the LLM (`merge`), falling back
   to the first valid text when the LLM gives nothing usable.
4. Every resulting text must make a valid experience (trigger word first, ≤ 32 words): an invalid one
   gets one LLM rewrite, and is rejected (and reported) when that fails too.
5. Worked-example candidates (an `add` of kind "example": a question, its answer and optional reasoning)
   are added by `add_examples` as they are unless the library already holds that example; they are never
   clustered or merged with lessons.
6. The new library = survivors + modified + added; ids are content-derived, so unchanged lessons keep
   their ids across steps and nothing is renumbered.
7. `prune` keeps the library sharp: it drops an experience whose rollouts did worse than their groups on
   average (mean advantage below HARMFUL_MEAN_ADVANTAGE) once it has been used `min_uses` times, then the
   lowest-valued ones while the library is over its size cap. Each drop is reported like an operation.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zoo.registry.errors import ValidationError
from zoo.registry.experience import Experience
from zoo.registry.expert_factors import ExpertFactors

EmbedFn = Callable[[Sequence[str]], np.ndarray]  # unit-length rows
MergeFn = Callable[[Sequence[str]], Awaitable[str | None]]
FactorsFn = Callable[["Proposal"], ExpertFactors | None]


@dataclass(frozen=True)
class Proposal:
    """One operation a group proposed (stage 2), with where it came from."""

    op: str  # add | modify | delete
    text: str = ""
    target: str = ""  # the id modified or deleted
    domain: str = "general"
    source: str = ""  # the task id of the group
    group: int = -1  # index of the group in the step (to find its rollouts for factor distillation)
    kind: str = "lesson"  # "example": `text` is the question, `answer` its answer, `reasoning` its working
    answer: str = ""
    reasoning: str = ""


# Text a model left as a template: bracketed or angled slots, ellipses, "insert ..." instructions.
_PLACEHOLDER = re.compile(
    r"\[[^\]]*\]|<[A-Za-z_][^<>]{0,40}>|\.\.\.|…|\binsert\b|\bplaceholder\b", re.IGNORECASE
)
_WORD = re.compile(r"[a-z0-9]+")
# Words that carry no content, so "When the fence is 1 m long" is compared on {fence, 1, m, long}.
_FILLER = frozenset(
    ["a", "an", "the", "is", "are", "was", "were", "be", "been", "it", "its", "this", "that", "these",
     "those", "of", "in", "on", "at", "to", "for", "by", "with", "as", "and", "or", "if", "when", "whenever",
     "while", "so", "then", "than", "there", "here", "what", "which", "who", "how", "do", "does", "did",
     "has", "have", "had", "ask", "asks", "asked"]
)  # fmt: skip
RESTATEMENT_SHARE = 0.8  # at least this share of a lesson's content words appear in the question
# Where the condition ends and the rule begins: "When X, do Y", "If X: Y", "When X then Y".
_CONDITION_END = re.compile(r"[,:;]|\bthen\b|\s[-\u2013\u2014]\s")
# A lesson that ends on one of these stops mid-phrase (cut by a token or word limit).
_DANGLING = frozenset(
    ["a", "an", "the", "of", "in", "on", "at", "to", "for", "by", "with", "as", "and", "or", "but", "if",
     "when", "then", "than", "that", "from", "into", "is", "are", "be", "its", "their", "your", "each",
     "every", "this", "these", "not", "no", "so"]
)  # fmt: skip
_OPENERS = {"(": ")", "[": "]", "{": "}"}


def _cut_off(text: str) -> bool:
    stripped = text.rstrip()
    if stripped[-1:] in {",", ";", ":", "-", "\u2013", "\u2014", "(", "/"}:
        return True
    words = _WORD.findall(stripped.lower())
    if words and words[-1] in _DANGLING and stripped[-1:].isalnum():
        return True
    if any(stripped.count(o) != stripped.count(c) for o, c in _OPENERS.items()):
        return True
    return stripped.count('"') % 2 == 1


def _content(words: list[str]) -> list[str]:
    return [w for w in words if w not in _FILLER]


def _asked(word: str, asked: set[str]) -> bool:
    """Whether a lesson's word is the question's, up to an inflection ("fences" for "fence")."""
    return word in asked or (len(word) > 4 and any(a[:5] == word[:5] for a in asked if len(a) > 4))


def screen_lesson(text: str, question: str) -> str | None:
    """Why a critic's lesson text is no lesson at all, or None when it may be one: an unfilled template; a
    text cut off mid-phrase; a condition with no rule after it ("When this is a mistake", "When the fence
    is 5 meters long": a rule follows its condition after a comma, colon or "then", with at least two
    content words); or a restatement of the question it was drawn from (nearly all its content words, or
    all of its rule's, are the question's). Validation would keep such a text when it merely does no harm,
    and it then takes a retrieval slot a real lesson or example could use."""
    if _PLACEHOLDER.search(text):
        return "an unfilled template, not a lesson"
    if _cut_off(text):
        return "cut off mid-phrase"
    after_trigger = text.split(None, 1)[1] if len(text.split(None, 1)) > 1 else ""
    end = _CONDITION_END.search(after_trigger)
    rule = _content(_WORD.findall(after_trigger[end.end() :].lower())) if end else []
    asked = set(_WORD.findall(question.lower()))
    content = _content(_WORD.findall(after_trigger.lower()))
    if len(content) >= 2 and sum(_asked(w, asked) for w in content) >= RESTATEMENT_SHARE * len(content):
        return "restates the question instead of teaching something beyond it"
    if len(rule) < 2:
        return "states a condition but no rule to follow after it"
    if all(_asked(w, asked) for w in rule):
        return "restates the question instead of teaching something beyond it"
    return None


@dataclass
class Outcome:
    experiences: list[Experience]
    applied: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)  # old id -> new id of modified lessons


def _components(vectors: np.ndarray, threshold: float) -> list[list[int]]:
    """Connected components of the graph "cosine ≥ threshold", each sorted, in order of first member."""
    n = len(vectors)
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    if n:
        sims = vectors @ vectors.T
        for i in range(n):
            for j in range(i + 1, n):
                if sims[i, j] >= threshold:
                    parent[find(j)] = find(i)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def _valid(text: str, domain: str, make: Callable[[str, str], Experience]) -> Experience | None:
    try:
        return make(text, domain)
    except ValidationError:
        return None


async def consolidate(
    library: Sequence[Experience],
    proposals: Sequence[Proposal],
    *,
    embed: EmbedFn,
    merge: MergeFn,
    make: Callable[[str, str], Experience],
    threshold: float,
    factors_for: FactorsFn | None = None,
) -> Outcome:
    """Consolidate `proposals` against `library` and return the new experience list (see module doc).

    `make(text, domain)` builds a new experience (raising ValidationError for a bad text); a modified
    lesson keeps its confidence and provenance except the text (and its factors when new ones are given).
    Proposals are the critic's lesson operations; worked examples need no merging (see add_examples).
    """
    by_id = {e.id: e for e in library}
    outcome = Outcome(experiences=[])
    deletes, changes = _sort_proposals(proposals, by_id, outcome)

    survivors = [e for e in library if e.id not in deletes]
    # Cluster the new texts together with the surviving lessons they might duplicate (never with a worked
    # example: a rule that resembles a question is not that question's duplicate).
    lessons = [e for e in survivors if e.kind == "lesson"]
    new_texts = [p.text for p in changes]
    vectors = embed(new_texts + [e.text for e in lessons]) if new_texts else np.zeros((0, 1))

    modified: dict[str, Experience] = {}
    added: list[Experience] = []
    for members in _components(vectors, threshold):
        cluster = _cluster(members, changes, lessons, by_id)
        if cluster is None:
            continue  # only existing lessons (they may resemble each other; not this batch's business)
        exp = await _cluster_lesson(cluster, merge, make, outcome)
        if exp is None:
            continue
        factors = factors_for(cluster.first) if factors_for is not None else None
        if cluster.target is not None:
            _modify(cluster, cluster.target, exp, factors, modified, outcome)
        else:
            _add(cluster, exp, factors, by_id, added, outcome)
    _report_deletes(deletes, by_id, outcome)
    outcome.experiences = _new_library(survivors, modified, added)
    return outcome


def _sort_proposals(
    proposals: Sequence[Proposal], by_id: Mapping[str, Experience], outcome: Outcome
) -> tuple[dict[str, list[Proposal]], list[Proposal]]:
    """Stages 1 and 2: the deletes by id, and the lesson adds and modifies in proposal order; the rest,
    and a modify of an id the batch deletes, go to outcome.rejected."""
    deletes: dict[str, list[Proposal]] = {}
    changes: list[Proposal] = []  # adds and modifies of lessons, in proposal order
    for p in proposals:
        if p.kind == "example":
            raise ValueError("consolidate() takes lesson operations; add worked examples with add_examples()")
        if p.op in ("modify", "delete") and p.target not in by_id:
            outcome.rejected.append({"op": p.op, "id": p.target, "source": p.source, "reason": "unknown id"})
        elif p.op in ("modify", "delete") and by_id[p.target].kind != "lesson":
            # A critic edits rules. A worked example is a reference or a verified solution: validation
            # credit (prune) or the size cap may remove it, a small model's opinion may not.
            reason = "a worked example is not the critic's to rewrite or delete"
            outcome.rejected.append({"op": p.op, "id": p.target, "source": p.source, "reason": reason})
        elif p.op == "delete":
            deletes.setdefault(p.target, []).append(p)
        elif p.op in ("add", "modify") and p.text.strip():
            changes.append(p)
        else:
            outcome.rejected.append({"op": p.op, "source": p.source, "reason": "no text"})
    for p in list(changes):
        if p.op == "modify" and p.target in deletes:
            changes.remove(p)
            outcome.rejected.append(
                {"op": "modify", "id": p.target, "source": p.source, "reason": "deleted in the same batch"}
            )
    return deletes, changes


@dataclass(frozen=True)
class _Cluster:
    """One similarity cluster with at least one of the batch's new texts, and the lesson it joins."""

    target: Experience | None  # the lesson a modify names, else the most similar existing lesson
    texts: list[str]  # the distinct texts to merge, whitespace folded
    absorbed: int  # 1 when texts[0] is the target's own text (no modify named it: the cluster joins it)
    domain: str
    sources: list[str]
    first: Proposal  # the cluster's first proposal


def _cluster(
    members: list[int],
    changes: Sequence[Proposal],
    lessons: Sequence[Experience],
    by_id: Mapping[str, Experience],
) -> _Cluster | None:
    """The cluster of `members` (indexes: first the new texts of `changes`, then `lessons`), or None when
    it holds no new text."""
    n = len(changes)
    news = [i for i in members if i < n]
    if not news:
        return None
    olds = [lessons[i - n] for i in members if i >= n]
    targets = [changes[i].target for i in news if changes[i].op == "modify"]
    target = by_id[targets[0]] if targets else (olds[0] if olds else None)
    absorbed = [target.text] if target is not None and not targets else []  # the lesson a cluster joins
    # Identical texts (several groups proposing the same lesson) need no merge call.
    texts = list(dict.fromkeys(" ".join(t.split()) for t in absorbed + [changes[i].text for i in news]))
    domain = target.domain if target is not None else changes[news[0]].domain
    sources = sorted({changes[i].source for i in news})
    return _Cluster(target, texts, len(absorbed), domain, sources, changes[news[0]])


async def _cluster_lesson(
    cluster: _Cluster, merge: MergeFn, make: Callable[[str, str], Experience], outcome: Outcome
) -> Experience | None:
    """Stages 3 and 4: the cluster's texts merged into one valid experience (else its first valid new
    text, else one rewrite), or None with the rejection in outcome."""
    texts, domain = cluster.texts, cluster.domain
    text = texts[0] if len(texts) == 1 else await merge(texts)
    exp = _valid(text, domain, make) if text else None
    if exp is None and len(texts) > 1:
        exp = next((x for t in texts[cluster.absorbed :] if (x := _valid(t, domain, make)) is not None), None)
    if exp is None:
        rewritten = await merge([text or texts[-1]])  # one rewrite to meet the rules
        exp = _valid(rewritten, domain, make) if rewritten else None
    if exp is None:
        outcome.rejected.append(
            {"op": cluster.first.op, "text": (text or texts[-1])[:300], "sources": cluster.sources,
             "reason": "not a valid lesson (trigger word first, at most 32 words) even after a rewrite"}
        )  # fmt: skip
    return exp


def _modify(
    cluster: _Cluster,
    target: Experience,
    exp: Experience,
    factors: ExpertFactors | None,
    modified: dict[str, Experience],
    outcome: Outcome,
) -> None:
    """The cluster's lesson replaces `target`'s text (and factors), recorded as a modify or a merge."""
    if target.id in modified:
        return  # two clusters resolved to one lesson: the first wins, deterministically
    changed = exp if exp.id != target.id or factors is not None else target
    new = target.replace(text=changed.text, factors=factors or target.factors)
    if new == target:
        return
    modified[target.id] = new
    kind = "merge" if len(cluster.texts) > 1 else "modify"
    outcome.applied.append(
        {"op": kind, "id": new.id, "old_id": target.id, "text": new.text, "sources": cluster.sources}
    )
    if new.id != target.id:
        outcome.renamed[target.id] = new.id


def _add(
    cluster: _Cluster,
    exp: Experience,
    factors: ExpertFactors | None,
    by_id: Mapping[str, Experience],
    added: list[Experience],
    outcome: Outcome,
) -> None:
    """The cluster's lesson joins the library as new, unless the library or the batch has it already."""
    if exp.id in by_id or any(a.id == exp.id for a in added):
        return
    new = exp if factors is None else exp.replace(factors=factors)
    added.append(new)
    kind = "merge" if len(cluster.texts) > 1 else "add"
    outcome.applied.append({"op": kind, "id": new.id, "text": new.text, "sources": cluster.sources})


def _report_deletes(
    deletes: Mapping[str, list[Proposal]], by_id: Mapping[str, Experience], outcome: Outcome
) -> None:
    for old_id, ps in sorted(deletes.items()):
        outcome.applied.append(
            {
                "op": "delete",
                "id": old_id,
                "kind": by_id[old_id].kind,
                "text": by_id[old_id].text,
                "sources": sorted({p.source for p in ps}),
            }
        )


def _new_library(
    survivors: Sequence[Experience], modified: Mapping[str, Experience], added: Sequence[Experience]
) -> list[Experience]:
    """Stage 6: survivors (modified where modified) and the added, by id."""
    result: dict[str, Experience] = {}
    for e in survivors:
        new = modified.get(e.id, e)
        result[new.id] = new
    for e in added:
        result.setdefault(e.id, e)
    return sorted(result.values(), key=lambda e: e.id)


def add_examples(
    outcome: Outcome,
    proposals: Sequence[Proposal],
    make_example: Callable[[Proposal], Experience],
    *,
    deleted: Collection[str] = (),
) -> Outcome:
    """A new Outcome: `outcome` (a consolidated library, possibly with nothing applied yet) plus the
    worked-example candidates among `proposals`, each added unless the library already holds it or
    `deleted` names it (the batch deletes it). Needs no LLM call, so a step can build the library with
    and without its examples from one consolidation of its lessons."""
    result = {e.id: e for e in outcome.experiences}
    applied, rejected = list(outcome.applied), list(outcome.rejected)
    for p in proposals:
        if p.kind != "example":
            continue
        try:
            worked = make_example(p)
        except ValidationError as err:
            rejected.append({"op": "add", "kind": "example", "text": p.text[:300], "source": p.source,
                             "reason": f"not a valid example: {err}"})  # fmt: skip
            continue
        if worked.id in result or worked.id in deleted:
            continue  # the library has it already (or this batch deletes it)
        result[worked.id] = worked
        applied.append({"op": "add", "kind": "example", "id": worked.id, "text": worked.text,
                        "answer": worked.answer, "sources": [p.source]})  # fmt: skip
    experiences = sorted(result.values(), key=lambda e: e.id)
    return Outcome(experiences, applied, rejected, dict(outcome.renamed))


# A mean advantage per use below this is "mostly harmful". Every rollout of a group usually sees the same
# uncited experiences, and a group's advantages sum to zero, so an experience that made no difference
# averages 0 whatever the group's success rate; counting helpful vs harmful uses instead would condemn
# every experience offered to groups that mostly fail.
HARMFUL_MEAN_ADVANTAGE = -0.25


def prune(
    experiences: Sequence[Experience],
    credit: Mapping[str, Sequence[float]],
    *,
    cap: int,
    min_uses: int,
    protected: Collection[str] = (),
    renamed: Mapping[str, str] | None = None,
) -> tuple[list[Experience], list[dict[str, Any]]]:
    """(kept, drops). `credit` maps an id to (sum of the advantages of the rollouts that used it, uses).
    First drop experiences used at least `min_uses` times whose mean advantage is below
    HARMFUL_MEAN_ADVANTAGE, then, over `cap`, the lowest mean advantages (an unused experience counts 0;
    ties keep the smaller id). `protected` ids (this step's additions, not yet tried in a rollout) are
    crowded out by the cap last. `renamed` (old id -> new id, from this batch's rewrites) carries a
    rewritten lesson's record over: a harmful lesson the critic keeps rewording cannot escape under each
    new id."""
    merged: dict[str, list[float]] = {k: [float(v[0]), float(v[1])] for k, v in credit.items()}
    for old, new in (renamed or {}).items():
        if old in credit:
            into = merged.setdefault(new, [0.0, 0.0])
            into[0] += float(credit[old][0])
            into[1] += float(credit[old][1])

    def mean(e: Experience) -> float:
        total, uses = merged.get(e.id, (0.0, 0.0))
        return total / uses if uses else 0.0

    drops: list[dict[str, Any]] = []
    kept: list[Experience] = []
    for e in experiences:
        uses = int(merged.get(e.id, (0.0, 0.0))[1])
        if uses >= min_uses and mean(e) < HARMFUL_MEAN_ADVANTAGE:
            drops.append({"op": "drop", "id": e.id, "kind": e.kind, "text": e.text,
                          "reason": f"mean advantage {mean(e):+.2f} over {uses} uses"})  # fmt: skip
        else:
            kept.append(e)
    if len(kept) > cap:
        # Best first: protected (new) ones, then by mean advantage; the tail over the cap goes.
        ranked = sorted(kept, key=lambda e: (e.id not in protected, -mean(e), e.id))
        for e in ranked[cap:]:
            drops.append({"op": "drop", "id": e.id, "kind": e.kind, "text": e.text,
                          "reason": f"over the cap of {cap} with mean advantage {mean(e):+.2f}"})  # fmt: skip
        keep = {e.id for e in ranked[:cap]}
        kept = [e for e in kept if e.id in keep]
    return kept, drops
