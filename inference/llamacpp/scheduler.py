"""Continuous batching on llama.cpp: one context whose KV cache holds one sequence per running request;
requests join and leave between steps, and one `llama_decode` per step (per adapter in use) feeds every
running request its next token, and joining requests a chunk of their prompt.

Written by hand, and why: llama-cpp-python's `Llama` object runs one sequence at a time, and llama.cpp's
own server is a separate process with its own HTTP API. Here each request keeps its own sampling, seed,
stop strings, expert factors, grammar and adapter, as in the transformers batcher
(transformers_scheduler.py), and shares its per-request bookkeeping (decoding.py).

- KV cache: one stream per slot (`kv_unified = false`), each `context_length` tokens: a request's attention
  reads only its own keys, so a step costs what its rows need, not the whole cache. The cache is allocated
  (and resident) up front: slots x context_length x the model's bytes per token.
- Prefill shares steps with decoding: running requests each feed one token, and joining requests fill the
  rest of the step's token budget with their prompts (chunked across steps when long).
- LoRA adapters are set on the context, not per sequence (llama.cpp's own server batches only requests
  with the same adapters together): a step decodes each adapter's rows in a call of their own.
- Priority: while any running request is a priority one (a credit holder's), steps decode only those; the
  others keep their caches and resume after.
- Prompt caching: a finished request's keys and values stay in its slot; a new request takes the free
  slot whose cached tokens share the longest prefix with its prompt (same adapter) and prefills only the
  rest, as llama.cpp's server does. A request whose start a running row is about to prefill (TF-GRPO's
  group rollouts of one question) waits that step and then copies the row's KV stream. Repeated system
  prompts and lessons skip most of their prefill.
- Sampling runs on the row's logits in numpy (greedy, temperature, top-p with transformers' rule), from a
  per-request generator seeded by the request's seed; expert factors and grammar masks are applied first,
  exactly as the transformers backend applies them.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zoo.inference.adapters import AdapterLoadError
from zoo.inference.backend_protocol import GenerationRequest
from zoo.inference.decoding import (
    DecodingState,
    Detokenizer,
    Emit,
    log_softmax,
    token_logprob,
    unscored,
)
from zoo.inference.llamacpp.gguf import GgufLoadError, GgufModel
from zoo.inference.llamacpp.prefill import PROOF_UBATCH
from zoo.inference.scheduler_thread import SchedulerThread

logger = logging.getLogger(__name__)

BASE = ""  # the adapter key of the base model
# Prompt tokens two requests must share for one to wait a step and copy the other's prefilled cache.
SHARED_PREFIX = 32


@dataclass
class Slot(DecodingState):
    """One request in the scheduler: its decoding state, KV sequence, sampler and adapter."""

    seq_id: int = -1
    rng: np.random.Generator | None = None
    fed: int = 0  # prompt tokens already in the KV cache
    adapter_key: str = BASE
    scored: list[Any] | None = None  # the prompt's log-probabilities so far (request.echo)

    @property
    def scores_prompt(self) -> bool:
        return self.request.echo

    @property
    def proving(self) -> bool:
        """Whether its answer carries a proof: it is decoded as a verifier's prefill computes it
        (LlamaCppScheduler._decode_for_proofs), and takes a cached prefix only from a cache made that way (a
        prefix computed in a large ubatch gives states that differ from the verifier's by up to 1 % on this
        model's outliers, as much as another quantization does: ./zoo bench provenance)."""
        return self.states is not None

    adapter_file: Path | None = None  # the converted GGUF adapter (llamacpp.lora), loaded at admission

    @property
    def prefilling(self) -> bool:
        return self.fed < len(self.prompt_ids)


def sample(scores: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator | None) -> int:
    """A token from next-token scores: argmax when temperature is 0, else softmax(scores / temperature)
    restricted to the nucleus (transformers' TopPLogitsWarper rule: drop the low tail whose mass is at
    most 1 - top_p, keeping at least one token)."""
    if temperature <= 0 or rng is None:
        return int(np.argmax(scores))
    z = scores.astype(np.float64) / temperature
    if top_p < 1.0:
        order = np.argsort(z, kind="stable")
        ordered = np.exp(z[order] - z[order[-1]])
        cumulative = np.cumsum(ordered / ordered.sum())
        remove = cumulative <= 1 - top_p
        remove[-1] = False
        z[order[remove]] = -np.inf
    p = np.exp(z - z.max())
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))


class LlamaCppScheduler(SchedulerThread[Slot]):
    """Owns one llama.cpp context in one thread; `submit` hands it a request from any thread."""

    def __init__(
        self,
        model: GgufModel,
        *,
        max_batch_size: int = 16,
        context_length: int = 2048,
        threads: int = 0,
        step_tokens: int = 512,
        adapters: Any = None,
        kv_cache_type: str = "f16",
    ) -> None:
        import os

        lib = model.lib
        self.lib = lib
        self.model = model
        self.max_batch_size = max_batch_size
        self.context_length = context_length
        self.step_tokens = step_tokens
        self.adapters = adapters  # a GgufAdapters (llamacpp.lora) or None
        threads = threads or len(os.sched_getaffinity(0))
        params = lib.llama_context_default_params()
        params.n_ctx = context_length * max_batch_size
        params.n_seq_max = max_batch_size
        params.kv_unified = False
        params.n_batch = params.n_ubatch = step_tokens
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        if kv_cache_type != "f16":  # a quantised V cache needs flash attention
            params.type_k = params.type_v = {"q8_0": lib.GGML_TYPE_Q8_0}[kv_cache_type]
            params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
        self.ctx = lib.llama_init_from_model(model.model, params)
        if not self.ctx:
            raise GgufLoadError(
                f"llama.cpp could not create a context of {max_batch_size} x {context_length} tokens "
                "(lower model.context_length or inference.max_batch_size)"
            )
        self.memory = lib.llama_get_memory(self.ctx)
        self.batch = lib.llama_batch_init(step_tokens, 0, 1)
        self.eos_ids = set(model.eos_ids)
        self._adapter_in_context = BASE
        self._free: deque[int] = deque(range(max_batch_size))
        # What each free slot's KV cache still holds: (adapter key, tokens from position 0, whether a proving
        # row computed it: Slot.proving).
        self._cached: dict[int, tuple[str, list[int], bool]] = {}
        self.reused_tokens = 0  # prompt tokens taken from cached prefixes instead of prefilled
        self._used: dict[int, int] = {}  # slot -> when its cache was last written (released)
        self._clock = 0
        # Partial reuse needs a cache whose cells past a position can be dropped and that keeps every
        # position: not so for recurrent state or sliding-window layers, whose caches start over instead.
        self._reuse = not (
            lib.llama_model_is_recurrent(model.model)
            or lib.llama_model_is_hybrid(model.model)
            or lib.llama_model_n_swa(model.model) > 0
        )
        self._rows: list[Slot] = []
        self.n_embd = int(lib.llama_model_n_embd(model.model))
        self._embeddings = False  # whether the context outputs hidden states (rows asking for proofs)
        self._scratch: Any = None  # a second batch: the calls of a step with proofs (_decode_for_proofs)
        self._start("llamacpp-scheduler")

    # -- public --------------------------------------------------------------------------------------

    def submit(
        self,
        request: GenerationRequest,
        prompt_ids: list[int],
        emit: Emit,
        constraint: Any = None,
        adapter: tuple[str, Path] | None = None,
    ) -> None:
        """adapter: (key, GGUF file) of the request's converted adapter (GgufAdapters.converted)."""
        if len(prompt_ids) >= self.context_length:
            raise ValueError(
                f"the prompt takes {len(prompt_ids)} tokens; a request's context is {self.context_length}"
            )
        slot = Slot(request, prompt_ids, emit, Detokenizer(self.model), constraint)
        if adapter is not None:
            if self.adapters is None:
                raise AdapterLoadError("this llama.cpp backend was started without adapters")
            slot.adapter_key, slot.adapter_file = adapter
        if request.temperature > 0:
            slot.rng = np.random.Generator(np.random.PCG64(request.seed % (2**63)))
        self._enqueue(slot)

    def _closed_thread(self, stopped: bool) -> None:
        if not stopped:
            logger.warning("the llama.cpp scheduler did not stop within 30 s; its context stays allocated")
        elif self.ctx:
            self.lib.llama_batch_free(self.batch)
            if self._scratch is not None:
                self.lib.llama_batch_free(self._scratch)
            self.lib.llama_free(self.ctx)
            self.ctx = None

    # -- the scheduler thread ------------------------------------------------------------------------

    def _running(self) -> list[Slot]:
        return self._rows

    def _step(self, admitted: list[Slot]) -> None:
        self._load_adapters(admitted)
        self._decode_step()

    def _fail_running(self, error: Exception, admitted: list[Slot]) -> None:
        for slot in list(self._rows):
            slot.fail(error)
            self._release(slot)

    def _admit(self) -> list[Slot]:
        """Give waiting requests free slots (under the lock: nothing slow here). A request whose prompt
        start another row is about to prefill waits a step, then copies it; the ones behind it go on."""
        admitted: list[Slot] = []
        held: list[Slot] = []
        while self._waiting and self._free:
            slot = self._waiting.popleft()
            if slot.request.cancel.is_set():
                slot.end("cancelled")
                continue
            if self._worth_waiting(slot):
                held.append(slot)
                continue
            self._place(slot)
            self._rows.append(slot)
            admitted.append(slot)
        self._waiting.extendleft(reversed(held))  # still first in line
        self.stats.waiting = len(self._waiting)
        return admitted

    def _load_adapters(self, admitted: list[Slot]) -> None:
        for slot in admitted:
            if slot.adapter_file is None:
                continue
            in_use = frozenset({s.adapter_key for s in self._rows} | {self._adapter_in_context})
            try:
                self.adapters.ensure(slot.request.adapter.name, slot.adapter_key, slot.adapter_file, in_use)
            except Exception as e:  # a bad adapter fails its own request
                slot.fail(e)
                self._release(slot)

    def _cached_start(self, slot: Slot) -> tuple[int | None, int]:
        """The free sequence whose cache holds the longest prefix of the prompt, and that length; counted
        only from SHARED_PREFIX tokens (None, 0 when none holds that much)."""
        best, common = None, 0
        for seq in sorted(self._free):
            key, tokens, canonical = self._cached.get(seq, (BASE, [], False))
            if key == slot.adapter_key and (canonical or not slot.proving):
                n = _common_prefix(tokens, slot.prompt_ids)
                if n > common and n >= min(SHARED_PREFIX, len(slot.prompt_ids) - 1):
                    best, common = seq, n
        return best, common

    def _worth_waiting(self, slot: Slot) -> bool:
        """Whether a row that runs next step will then hold, prefilled, at least SHARED_PREFIX more of this
        prompt than any free slot's cache does now (TF-GRPO's group rollouts of one question). Never for a
        row that waits on priority rows, nor a priority request behind another request."""
        if not self._reuse or slot.scores_prompt or slot.proving:
            return False
        urgent = any(r.request.priority for r in self._rows)
        cached = self._cached_start(slot)[1]
        for row in self._rows:
            if not row.prefilling or row.adapter_key != slot.adapter_key:
                continue
            if (urgent or slot.request.priority) and not row.request.priority:
                continue
            shared = min(_common_prefix(row.prompt_ids, slot.prompt_ids), len(slot.prompt_ids) - 1)
            if shared >= cached + _worth_copying(row, slot) and row.fed < shared:
                return True
        return False

    def _place(self, slot: Slot) -> None:
        """Give the slot a free sequence holding as much of its prompt as can be had: the free sequence whose
        cached tokens share the longest prefix with it, or, when a running row's cache shares clearly more,
        a copy of that row's KV stream into the least recently used free sequence. The rest is dropped; at
        least one prompt token is always fed (its logits are needed)."""
        lru = min(self._free, key=lambda seq: self._used.get(seq, -1))
        reuse = self._reuse and not slot.scores_prompt  # a scored prompt needs every position's logits
        cached, common = self._cached_start(slot) if reuse else (None, 0)
        best = cached if cached is not None else lru
        source, shared = None, 0
        for row in self._rows if reuse and not slot.proving else ():
            if row.adapter_key == slot.adapter_key:
                n = _common_prefix(_in_cache(row), slot.prompt_ids)
                if n > shared:
                    source, shared = row, n
        mem, lib = self.memory, self.lib
        if source is not None and shared >= common + _worth_copying(source, slot):
            # A whole-stream copy (one KV stream per sequence), done by llama.cpp before its next decode,
            # into the least recently used sequence so a useful cache survives; the copied cells past the
            # shared prefix are then dropped.
            best, common = lru, shared
            lib.llama_memory_seq_cp(mem, source.seq_id, best, -1, -1)
        self._free.remove(best)
        self._cached.pop(best, None)
        common = min(common, len(slot.prompt_ids) - 1)
        if not common or not lib.llama_memory_seq_rm(mem, best, common, -1):
            lib.llama_memory_seq_rm(mem, best, -1, -1)
            common = 0
        slot.seq_id, slot.fed = best, common
        self.reused_tokens += common

    def _decode_step(self) -> None:
        for slot in [s for s in self._rows if s.request.cancel.is_set()]:
            slot.end("cancelled")
            self._release(slot)
        urgent = [s for s in self._rows if s.request.priority]
        rows = urgent or self._rows
        groups: dict[str, list[Slot]] = {}
        # In seq id order: with one KV stream per sequence, llama.cpp splits a batch into equal-length
        # ubatches of consecutive ascending sequence ids, so any other order costs extra graph runs.
        for slot in sorted(rows, key=lambda s: s.seq_id):
            groups.setdefault(slot.adapter_key, []).append(slot)
        decoded = 0
        for key, group in groups.items():
            try:
                decoded += self._decode(key, group)
            except Exception as e:  # a failed decode fails that call's requests, not the node
                logger.exception("llama.cpp decode failed")
                for slot in group:
                    if not slot.finish:
                        slot.fail(e)
                        self._release(slot)
        if decoded:
            self.stats.steps += 1
            self.stats.last_batch = decoded
            self.stats.tokens += decoded

    def _decode(self, adapter_key: str, group: list[Slot]) -> int:
        """One llama_decode for these rows; returns how many decoding rows it advanced."""
        t0 = time.perf_counter()
        lib, batch = self.lib, self.batch
        if adapter_key != self._adapter_in_context:
            self.adapters.apply(self.ctx, adapter_key)
            self._adapter_in_context = adapter_key
        batch.n_tokens = 0
        readers: list[tuple[Slot, int]] = []  # (slot, batch index whose logits it samples from)
        scorers: list[tuple[Slot, int, int]] = []  # (slot, its first prompt position here, batch index)
        prefilled = 0

        def add(token: int, pos: int, seq: int, logits: bool) -> None:
            i = batch.n_tokens
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = logits
            batch.n_tokens = i + 1

        for slot in group:  # every decoding row feeds its last token
            if not slot.prefilling:
                readers.append((slot, batch.n_tokens))
                add(slot.generated[-1], slot.length - 1, slot.seq_id, True)
        decoding = batch.n_tokens
        proofs = any(slot.proving for slot in group)
        for slot in group:  # joining rows fill what is left of the step with their prompts
            if not slot.prefilling or (proofs and slot.scores_prompt):  # scored: a step without proofs
                continue
            room = self.step_tokens - batch.n_tokens
            if room <= 0:
                break
            take = min(room, len(slot.prompt_ids) - slot.fed)
            if slot.scores_prompt:
                scorers.append((slot, slot.fed, batch.n_tokens))
            for j in range(slot.fed, slot.fed + take):
                last = j == len(slot.prompt_ids) - 1
                if last:
                    readers.append((slot, batch.n_tokens))
                add(slot.prompt_ids[j], j, slot.seq_id, last or slot.scores_prompt)
            slot.fed += take
            prefilled += take
        if not batch.n_tokens:
            return 0
        if proofs:
            self._decode_for_proofs(readers, scorers)
        else:
            self._set_embeddings(False)
            rc = lib.llama_decode(self.ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed (code {rc})")
            self._consume(readers, scorers)
        elapsed = time.perf_counter() - t0
        total = decoding + prefilled
        self.stats.prefill_seconds += elapsed * prefilled / total
        self.stats.decode_seconds += elapsed * decoding / total
        return decoding

    def _set_embeddings(self, on: bool) -> None:
        if on != self._embeddings:
            self.lib.llama_set_embeddings(self.ctx, on)
            self._embeddings = on

    def _consume(self, readers: list[tuple[Slot, int]], scorers: list[tuple[Slot, int, int]]) -> None:
        """Score prompts and choose next tokens from the outputs of the last llama_decode (at these
        indices of its batch)."""
        for slot, first, index in scorers:
            try:
                self._score_prompt(slot, first, index)
            except Exception as e:
                slot.fail(e)
                self._release(slot)
        for slot, index in readers:
            if slot.finish:  # failed while its prompt was scored
                continue
            try:
                if slot.proving:
                    slot.states.append(self._hidden_state(index))
                token, entry = self._choose(slot, index)
                done = not slot.accept(token, self.eos_ids, self.context_length, entry)
            except Exception as e:  # one bad request (a processor or grammar that raises) fails alone
                slot.fail(e)
                done = True
            if done:
                self._release(slot)

    def _decode_for_proofs(
        self, readers: list[tuple[Slot, int]], scorers: list[tuple[Slot, int, int]]
    ) -> None:
        """A step with rows whose answers carry proofs: the batch decoded in llama_decode calls a verifier's
        prefill (inference.llamacpp.prefill) reproduces bit for bit.

        llama.cpp's CPU kernels give the same numbers for every ubatch of 1 to PROOF_UBATCH rows, and other
        numbers (by up to 1 % of this model's outlier channels, as much as another quantization moves them)
        for larger ones. So a proving row's prompt goes in calls of its own, one per block of PROOF_UBATCH
        positions, as the verifier prefills it; the other rows' prompts in one call; and the tokens whose
        outputs are read (one per row) in calls of at most PROOF_UBATCH, with embeddings on: llama.cpp then
        outputs the hidden state beside the logits (it outputs every token of a call, so none without a
        reader goes in).
        """
        batch = self.batch
        proving = {s.seq_id for s in self._rows if s.proving}
        silent: dict[tuple[int, int], list[int]] = {}  # one call's rows: (proving seq, block) or (-1, 0)
        outputs: list[int] = []
        for i in range(batch.n_tokens):
            if batch.logits[i]:
                outputs.append(i)
            else:  # a proving row's prompt by blocks of PROOF_UBATCH positions (prefill.blocks)
                seq = batch.seq_id[i][0]
                key = (seq, batch.pos[i] // PROOF_UBATCH) if seq in proving else (-1, 0)
                silent.setdefault(key, []).append(i)
        if silent:
            self._set_embeddings(False)
            for rows in silent.values():
                self._decode_rows(rows)
        self._set_embeddings(True)
        for at in range(0, len(outputs), PROOF_UBATCH):
            rows = outputs[at : at + PROOF_UBATCH]
            where = {i: j for j, i in enumerate(rows)}
            self._decode_rows(rows)
            self._consume(
                [(slot, where[i]) for slot, i in readers if i in where],
                [(slot, first, where[i]) for slot, first, i in scorers if i in where],
            )

    def _decode_rows(self, rows: list[int]) -> None:
        """llama_decode of these entries of the step's batch, copied into a scratch batch."""
        lib, batch = self.lib, self.batch
        if self._scratch is None:
            self._scratch = lib.llama_batch_init(self.step_tokens, 0, 1)
        scratch = self._scratch
        for j, i in enumerate(rows):
            scratch.token[j], scratch.pos[j], scratch.n_seq_id[j] = batch.token[i], batch.pos[i], 1
            scratch.seq_id[j][0] = batch.seq_id[i][0]
            scratch.logits[j] = batch.logits[i]
        scratch.n_tokens = len(rows)
        rc = lib.llama_decode(self.ctx, scratch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed (code {rc})")

    def _hidden_state(self, index: int) -> np.ndarray:
        row = self.lib.llama_get_embeddings_ith(self.ctx, index)
        if not row:
            raise RuntimeError("llama.cpp kept no hidden state for a row that asked for a proof")
        return np.ctypeslib.as_array(row, shape=(self.n_embd,)).copy()

    def _logits(self, index: int) -> np.ndarray:
        row = self.lib.llama_get_logits_ith(self.ctx, index)
        return np.ctypeslib.as_array(row, shape=(self.model.n_vocab,))

    def _choose(self, slot: Slot, index: int) -> tuple[int, Any]:
        """The next token, and its log-probability entry when the request asks for them."""
        req = slot.request
        logits = self._logits(index)
        if req.logits_processor is None and slot.constraint is None and req.temperature <= 0:
            token = int(np.argmax(logits))
            return token, self._entry(req, logits, token)
        scores = logits.copy()
        if req.logits_processor is not None:
            scores = apply_processor(req.logits_processor, slot.prompt_ids + slot.generated, scores)
        if slot.constraint is not None:
            scores = slot.constraint.mask_array(scores)
        token = sample(scores, req.temperature, req.top_p, slot.rng)
        return token, self._entry(req, scores, token)

    def _entry(self, req: GenerationRequest, scores: np.ndarray, token: int) -> Any:
        if req.logprobs is None:
            return None
        return token_logprob(log_softmax(scores), token, req.logprobs, self.model.token_bytes)

    def _score_prompt(self, slot: Slot, first: int, index: int) -> None:
        """Log-probabilities of the prompt tokens this step's logits predict (position j scores token j+1);
        once the whole prompt is in, they go out before any text."""
        ids, top = slot.prompt_ids, slot.request.logprobs or 0
        if slot.scored is None:
            slot.scored = [unscored(ids[0], self.model.token_bytes)]
        for j in range(first, min(slot.fed, len(ids) - 1)):
            logprobs = log_softmax(self._logits(index + j - first))
            slot.scored.append(token_logprob(logprobs, ids[j + 1], top, self.model.token_bytes))
        if not slot.prefilling:
            slot.scored_prompt(slot.scored)

    def _release(self, slot: Slot) -> None:
        """Free the slot's sequence, keeping what its cache holds for a later prompt that starts the same
        (after an error, nothing is kept)."""
        if slot not in self._rows:
            return
        self._rows.remove(slot)
        if slot.finish == "error":
            self.lib.llama_memory_seq_rm(self.memory, slot.seq_id, -1, -1)
        else:
            self._cached[slot.seq_id] = (slot.adapter_key, _in_cache(slot), slot.proving)
        self._clock += 1
        self._used[slot.seq_id] = self._clock  # its cache is the freshest
        self._free.append(slot.seq_id)


def _worth_copying(source: Slot, slot: Slot) -> int:
    """Tokens a row's cache must hold beyond what a free slot holds for the slot to copy it: any for a
    choice of the same request (n > 1: one prefill for all), else SHARED_PREFIX."""
    group = slot.request.group
    return 1 if group is not None and source.request.group is group else SHARED_PREFIX


def _in_cache(slot: Slot) -> list[int]:
    """The tokens a slot's KV stream holds: its prompt as far as fed, and every generated token but the
    last (sampled, not yet fed)."""
    return slot.prompt_ids[: slot.fed] + (slot.generated[:-1] if not slot.prefilling else [])


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def apply_processor(processor: Any, ids: list[int], scores: np.ndarray) -> np.ndarray:
    """Run a transformers-style logits processor (expert factors) on one row of numpy scores. torch is
    imported here, by the first request that uses factors, never on the serving path without them."""
    import torch

    out = processor(torch.tensor([ids]), torch.from_numpy(scores)[None])
    return out[0].numpy()
