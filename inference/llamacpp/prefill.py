"""Teacher-forced prefill on llama.cpp: the last hidden states and logits a GGUF model gives at chosen
positions of a token sequence, in one pass. What a verifier of an answer's proof computes
(inference.provenance.answer_proof): the answer's prompt and tokens fed at once, never generated.

A context of its own beside the serving scheduler's (llama.cpp contexts on one model are independent), with
embeddings on: llama.cpp then returns, for every position whose output is asked for, both the logits and
the hidden state after the final norm (the LM head's input: what the serving scheduler commits to). It is
made on first use and kept; one sequence at a time (callers hold `lock` through `run`).

Every llama_decode here holds at most PROOF_UBATCH tokens, as the serving scheduler decodes a row whose answer
carries a proof: llama.cpp's CPU kernels give the same numbers for any ubatch of 1 to 32 rows and other ones
above (by up to 1 % of this model's outlier channels), so the verifier recomputes, bit for bit on the same
build, the states the prover committed to.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

import numpy as np

from zoo.inference.llamacpp.gguf import GgufLoadError, GgufModel

PROOF_UBATCH = 32  # the most tokens of one llama_decode that computes a proof's states (module docstring)


class Prefill:
    """One llama.cpp context of `context_length` tokens that prefills a sequence and reads its outputs."""

    def __init__(
        self, model: GgufModel, context_length: int, *, threads: int = 0, batch_tokens: int = PROOF_UBATCH
    ) -> None:
        lib = model.lib
        self.lib, self.model, self.context_length = lib, model, context_length
        self.batch_tokens = batch_tokens
        self.n_embd = int(lib.llama_model_n_embd(model.model))
        params = lib.llama_context_default_params()
        params.n_ctx = context_length
        params.n_batch = params.n_ubatch = batch_tokens
        params.n_seq_max = 1
        params.embeddings = True
        params.n_threads = params.n_threads_batch = threads or len(os.sched_getaffinity(0))
        params.no_perf = True
        self.ctx = lib.llama_init_from_model(model.model, params)
        if not self.ctx:
            raise GgufLoadError(f"llama.cpp could not create a prefill context of {context_length} tokens")
        self.memory = lib.llama_get_memory(self.ctx)
        self.batch = lib.llama_batch_init(batch_tokens, 0, 1)
        self.lock = threading.Lock()

    def run(self, ids: list[int], first: int) -> tuple[np.ndarray, np.ndarray]:
        """(states, logits) at positions first .. len(ids) - 1 of `ids`: float32 arrays of shape
        (positions, n_embd) and (positions, n_vocab)."""
        if not 0 <= first < len(ids) <= self.context_length:
            raise ValueError(
                f"positions {first}..{len(ids) - 1} do not fit a context of {self.context_length}"
            )
        lib = self.lib
        lib.llama_memory_clear(self.memory, True)
        states = np.empty((len(ids) - first, self.n_embd), dtype=np.float32)
        logits = np.empty((len(ids) - first, self.model.n_vocab), dtype=np.float32)
        # With embeddings on, llama.cpp outputs every position of a batch (it overrides the flags): the
        # positions before `first` go in with embeddings off and no outputs, the rest with them on.
        lib.llama_set_embeddings(self.ctx, False)
        for start, end in blocks(0, first, self.batch_tokens):
            self._decode(ids, start, end, outputs=False)
        lib.llama_set_embeddings(self.ctx, True)
        for start, end in blocks(first, len(ids), self.batch_tokens):
            self._decode(ids, start, end, outputs=True)
            for i in range(end - start):
                states[start - first + i] = _row(lib.llama_get_embeddings_ith(self.ctx, i), self.n_embd)
                logits[start - first + i] = _row(lib.llama_get_logits_ith(self.ctx, i), self.model.n_vocab)
        return states, logits

    def _decode(self, ids: list[int], start: int, end: int, *, outputs: bool) -> None:
        batch = self.batch
        batch.n_tokens = end - start
        for i, pos in enumerate(range(start, end)):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = ids[pos], pos, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = outputs
        rc = self.lib.llama_decode(self.ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed (code {rc})")

    def close(self) -> None:
        if self.ctx:
            self.lib.llama_batch_free(self.batch)
            self.lib.llama_free(self.ctx)
            self.ctx = None


def blocks(start: int, end: int, size: int) -> list[tuple[int, int]]:
    """Positions start .. end - 1 in ranges that never cross a multiple of `size`: the blocks in which both
    this prefill and the serving scheduler (a proving row's prompt) feed a sequence, so their ubatches hold
    the same rows. (Past position 256 the outputs still differ from a lone decode's by a few roundings,
    mantissa means up to 0.99, in ubatches of 8 to 32 rows alike: measured, not removed.)"""
    cuts = [start, *range((start // size + 1) * size, end, size), end]
    return [(a, b) for a, b in itertools.pairwise(cuts) if a < b]


def kernels() -> str:
    """What computes a proof's states: the llama-cpp-python release and the CPU features its build uses
    (llama.cpp's own system info). Two builds that differ here give different numbers (the portable
    build with AVX-512 and the one without differ by up to 3.5 % of the outlier channels' bf16 mantissas,
    as much as another quantization: ./zoo bench provenance), so a proof is checked by the same kernels."""
    from importlib.metadata import version

    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    features = [part.split("=")[0].strip() for part in info.split("|") if part.strip().endswith("= 1")]
    return f"llama-cpp-python {version('llama_cpp_python')}; " + " ".join(
        f.removeprefix("CPU : ") for f in features
    )


def _row(pointer: Any, n: int) -> np.ndarray:
    if not pointer:
        raise RuntimeError("llama.cpp returned no output for a position that asked for one")
    return np.ctypeslib.as_array(pointer, shape=(n,))
