"""Greedy answers computed along different arithmetic paths (one row alone or in a batch, copies of one
cache, AVX2 or AVX-512 kernels) compared as far as the arithmetic lets them agree.

Two such answers must choose the same token, with log-probabilities within `LOGPROB_TOL`, until the first
position where the two best tokens are within twice that of each other: there a rounding difference can
reorder them, and after it the answers' contexts differ, so nothing more is promised. A row given another
row's logits, or a copy of the wrong cache, differs by far more than the tolerance at its first token.

The bound is measured, not hoped (`./zoo bench near_ties`, 2 rounds: every prompt alone, then in batches
of 2, 4 and 8 rows, then as 5 copies of one prefilled cache; 48 tokens each, the bundled Q4_1 model):
most shared tokens are bit-identical (median and batched p99 0), but a row whose neighbours change how
its step is computed can move by a tenth of a nat, at its first token too:

  CPU (llama.cpp build)        tokens   max |difference|   p99 (copies)   parted at a lead of
  AMD EPYC Zen 3, AVX2 only     8,088   0.147              0.021          0.014, 0.165
  AVX-512 (Zen 4, Intel)        the AVX2 pass and the main pass of such a machine run these tests under
                                both sets; the tests passed there on exact text before this bound

The differences are llama.cpp's own, not the scheduler's: its raw C API alone (no zoo code) gives the
same numbers to four decimals. Its CPU flash attention (on by default, kept by the scheduler) takes a
tiled kernel in f32 for a sequence with 64 or more query rows in a ubatch and a one-row kernel that
rounds Q to f16 and sums V in f16 for fewer, so a token's output and the K/V it leaves depend on how many
tokens of its own sequence shared its step: a whole prompt prefilled alone, a copy whose last token is
fed on its own, a prompt cut into pieces beside other sequences, a cached prefix. With flash attention
off the three paths above agree bit for bit; identical inputs decoded the same way always do.

LOGPROB_TOL leaves 1.7x that largest difference; a pair of tokens whose log-probabilities may each move
by it may swap when their gap is at most twice it.
"""

from __future__ import annotations

from zoo.inference.backend_protocol import GenerationResult

LOGPROB_TOL = 0.25


def disagreement(
    reference: GenerationResult, other: GenerationResult, tol: float = LOGPROB_TOL
) -> str | None:
    """Why `other` does not answer as `reference` would (None when it does, up to a near-tie). Both must
    have been asked for log-probabilities with at least two alternatives."""
    ref, oth = reference.logprobs, other.logprobs
    assert ref is not None and oth is not None, "ask both for logprobs (top 2 at least)"
    for i, (r, o) in enumerate(zip(ref, oth, strict=False)):
        if r.bytes == o.bytes and r.eos == o.eos:
            assert r.logprob is not None and o.logprob is not None
            if abs(r.logprob - o.logprob) > tol:
                return f"token {i} {r.token!r}: log-probability {r.logprob:.5f} here, {o.logprob:.5f} there"
            continue
        assert r.logprob is not None
        runners_up = {(token, raw): lp for token, raw, lp in r.top}
        lead = r.logprob - runners_up.get((o.token, o.bytes), float("-inf"))
        if lead <= 2 * tol:
            return None  # a near-tie: they part here, and their contexts differ from now on
        return (
            f"token {i}: {r.token!r} here, {o.token!r} there, which the first led by {lead:.4f} "
            f"(a near-tie is at most {2 * tol:.4f})"
        )
    if len(ref) != len(oth):
        return f"{len(ref)} tokens here, {len(oth)} there, agreeing on all they share"
    return None
