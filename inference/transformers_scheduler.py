"""Continuous batching for a local transformers model: requests join and leave the running batch between
decode steps, and one forward pass per step serves every running request.

Written by hand, and why: transformers' `generate` runs a fixed batch to its end, and its continuous-
batching manager shares one GenerationConfig (sampling, seed, processors) across requests and needs
paged-attention kernels. Here every request keeps its own sampling parameters, seed, stop strings,
logits processors and grammar, and a request's output must not depend on what else is in the batch.
The KV cache is transformers' DynamicCache; this module does the scheduling (who is in the batch, how
their caches are merged and cut) and per-row sampling.

Batch invariance (greedy output alone == inside any batch, bit for bit, measured on CPU in bf16):
- every request is prefilled alone, so its prompt's keys and values never depend on other requests;
- decode attention runs per row over that row's own keys (the `zoo_ragged` attention below): the left
  padding that keeps the cache rectangular is never read, so no padded softmax changes a sum;
- CPU bf16 matmuls give a row the same result whatever else is in the batch for M >= 2 rows, but a
  single row takes a different kernel; so a lone request decodes beside a shadow copy of itself.
On GPUs, matmul kernels are not batch-invariant in general; there the guarantee does not hold.

Proofs (a request with `proof`): the states an answer's proof commits to are computed as a verifier
recomputes them (`head_inputs`): the prompt's prefill alone (the one the row starts with: its last
position's state and its cache are kept), then, once the answer is done, the answer's tokens fed at once over
that cache. Decode steps compute the same states otherwise: in bf16 the two differ in their last bits (TOPLOC
mantissa means up to 9.6 over a 64-token answer, where another prompt's start near 2), which no threshold
tells from a cheat on this model; these are the verifier's bit for bit, for any thread count or batch
(tests/inference/test_transformers_proofs.py), at the price of one prefill of the answer's tokens.

Priority: while any running request is a priority one (a credit holder's), each step decodes only the
priority rows. The other rows' cache rows are set aside (parked) with the cache width they had and merged
back, left-padded like newly prefilled rows, once no priority row is left; parked rows keep their
requests' slots. On a compute-bound CPU a decode step over a full batch costs several single-row steps,
so this is what keeps a holder's answer near its idle latency under load.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from zoo.inference.adapters import BASE, LoadedAdapters
from zoo.inference.backend_protocol import ChoiceGroup, GenerationRequest
from zoo.inference.decoding import (
    DecodingState,
    Detokenizer,
    Emit,
    log_softmax,
    logprob_entry,
    token_logprob,
    unscored,
)
from zoo.inference.scheduler_thread import SchedulerThread

logger = logging.getLogger(__name__)

RAGGED_ATTENTION = "zoo_ragged"
_ROW_STARTS = "zoo_row_starts"  # forward kwarg: per row, the first cache position that row may attend to
_register_lock = threading.Lock()
PROMPT_SCORE_BLOCK = 256  # prompt positions scored at once (a block's log-softmax is positions x vocab)
_registered = False


def _ragged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    starts = kwargs.pop(_ROW_STARTS, None)
    if starts is None:  # not a batched decode step (a prefill, or any other use of the model): sdpa
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    rows = [
        sdpa_attention_forward(
            module, query[b : b + 1], key[b : b + 1, :, s:], value[b : b + 1, :, s:], None, dropout, scaling
        )[0]
        for b, s in enumerate(starts)
    ]
    return torch.cat(rows), None


def register_ragged_attention() -> None:
    """Make `zoo_ragged` a transformers attention implementation. Without row starts it is exactly sdpa,
    masks included, so anything else that runs the model (padded batches, training) is unaffected."""
    global _registered
    with _register_lock:
        if _registered:
            return
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        AttentionInterface.register(RAGGED_ATTENTION, _ragged_attention)
        AttentionMaskInterface.register(RAGGED_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
        _registered = True


def supports_ragged(config: Any) -> bool:
    """Whether the model's layers all keep full caches (sliding-window layers cannot be left-padded)."""
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return False
    return not getattr(config, "sliding_window", None) or getattr(config, "use_sliding_window", True) is False


# -- per-request state --------------------------------------------------------------------------------


@dataclass
class Sequence(DecodingState):
    """One request in the batcher: its decoding state, sampling generator and adapter row."""

    generator: torch.Generator | None = None
    adapter_key: str = BASE  # the loaded LoRA adapter this row decodes with
    # With request.proof: the prompt's cache and last state as a proof takes them (set at its prefill), and
    # what computes the answer's states over them when it is done (ContinuousBatcher._answer_states).
    proof_prompt: tuple[Any, torch.Tensor] | None = None
    prove: Callable[[Sequence], list[np.ndarray]] | None = None

    def end(self, reason: str) -> bool:
        if self.prove is not None and self.states is not None and self.generated and reason != "cancelled":
            try:
                self.states = self.prove(self)
            except Exception:  # the answer stands; it goes without a proof (the engine says so)
                logger.exception("the prefill for an answer's proof failed")
                self.states = None
        self.proof_prompt = None
        return super().end(reason)


class ContinuousBatcher(SchedulerThread[Sequence]):
    """Owns the model in one scheduler thread; `submit` hands it a request from any thread."""

    noun = "batcher"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        device: str = "cpu",
        max_batch_size: int = 16,
        prefill_budget_tokens: int = 1024,
        context_length: int = 2048,
        max_adapters: int = 8,
        token_bytes: Any = None,
    ) -> None:
        """token_bytes: a token id's bytes (what log-probability entries name tokens by)."""
        self.model = model
        self.token_bytes = token_bytes or (lambda i: tokenizer.decode([i]).encode())
        self.adapters = LoadedAdapters(model, max_adapters)
        self.tokenizer = tokenizer
        self.device = device
        self.context_length = context_length
        self.ragged = supports_ragged(model.config)
        # Models that can compute the last position's logits alone (most current HF causal LMs) skip the
        # LM head over every other prompt token at prefill.
        self._last_logits = (
            {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
        )
        if self.ragged:
            register_ragged_attention()
            model.set_attn_implementation(RAGGED_ATTENTION)
        elif max_batch_size > 1:
            logger.warning("model has sliding-window attention: continuous batching is off (batch size 1)")
        self.max_batch_size = max_batch_size if self.ragged else 1
        self.prefill_budget_tokens = prefill_budget_tokens
        self.eos_ids = _eos_ids(model, tokenizer)
        self._rows: list[Sequence] = []  # running sequences, in cache row order
        # Rows set aside while priority rows decode: (rows, their cache layers, the cache width then).
        self._parked: list[tuple[list[Sequence], list[tuple[torch.Tensor, torch.Tensor]], int]] = []
        self._shadow = False  # the cache holds one extra row copying row 0 (see the module docstring)
        # A prefilled prompt kept for the other choices of its request (n > 1), however late they join;
        # dropped once they all have, or with the request.
        self._prefilled: weakref.WeakKeyDictionary[ChoiceGroup, _Prefilled] = weakref.WeakKeyDictionary()
        self._cache: Any = None
        # What outputs the LM head's input at every position (Llama-style decoders' `norm`), for proofs.
        norm = getattr(model.get_decoder(), "norm", None) if hasattr(model, "get_decoder") else None
        self._final_norm = norm if isinstance(norm, torch.nn.Module) else None
        self._start("batcher")

    # -- public --------------------------------------------------------------------------------------

    def submit(
        self, request: GenerationRequest, prompt_ids: list[int], emit: Emit, constraint: Any = None
    ) -> None:
        seq = Sequence(request, prompt_ids, emit, Detokenizer(self.tokenizer), constraint)
        if request.proof:
            seq.prove = self._answer_states
        if request.temperature > 0:
            seq.generator = torch.Generator(device=self.device).manual_seed(request.seed % (2**63))
        self._enqueue(seq)

    def head_inputs(self, ids: list[int], first: int) -> tuple[np.ndarray, np.ndarray]:
        """(LM head inputs, logits) at positions first .. len(ids) - 1 of `ids`, as float32 arrays: the last
        hidden states (after the final norm) a proof commits to, computed as the prover computed them
        (the module docstring): ids[: first + 1] prefilled alone, then the rest fed at once over its cache.
        A verifier's, with `first` the prompt's last position. On the batcher's thread only (`call`)."""
        from transformers import DynamicCache

        if not 0 <= first < len(ids):
            raise ValueError(f"position {first} is outside the {len(ids)} tokens")
        cache = DynamicCache()
        with torch.inference_mode():
            with self._head_input() as seen:
                out = self._base(ids[: first + 1], cache, **self._last_logits)
            states, logits = [seen[-1][0, -1:]], [out.logits[0, -1:]]
            if first + 1 < len(ids):
                answer, answer_logits = self._over(cache, ids[first + 1 :])
                states.append(answer)
                logits.append(answer_logits)
        return _host(torch.cat(states)), _host(torch.cat(logits))

    def _answer_states(self, seq: Sequence) -> list[np.ndarray]:
        """A finished proving row's states: its prompt's last (kept at prefill), then its answer's tokens but
        the last fed at once over its prompt's cache."""
        if seq.proof_prompt is None:
            raise RuntimeError("the row kept no prompt state for its proof")
        cache, last = seq.proof_prompt
        rows = [last[None]]
        if len(seq.generated) > 1:
            with torch.inference_mode():
                rows.append(self._over(cache, seq.generated[:-1], logits=False)[0])
        return list(_host(torch.cat(rows)))

    def _base(self, ids: list[int], cache: Any, **kwargs: Any) -> Any:
        return self.adapters.forward(
            [BASE], input_ids=torch.tensor([ids], device=self.device), past_key_values=cache, use_cache=True,
            **kwargs,
        )  # fmt: skip

    def _over(self, cache: Any, tokens: list[int], logits: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(LM head inputs, logits) of `tokens` fed at once after what `cache` holds (which grows by them).
        logits=False: the prover's, who needs none (the LM head then runs on the last position alone, when
        the final norm's output gives every position's state: a fifth of the pass for this model)."""
        keep = {} if logits or self._final_norm is None else self._last_logits
        with self._head_input() as seen:
            out = self._base(tokens, cache, **keep).logits[0]
        return seen[-1][0], out

    @contextlib.contextmanager
    def _head_input(self, on: bool = True) -> Iterator[list[torch.Tensor]]:
        """Within: each forward pass's LM head input (hidden states after the final norm) is appended, as
        the final norm outputs it (every position, whatever the LM head is asked for), or else as the LM
        head takes it."""
        seen: list[torch.Tensor] = []
        if not on:
            yield seen
            return
        if self._final_norm is not None:
            hook = self._final_norm.register_forward_hook(lambda _m, _a, out: seen.append(out))
        else:
            head = self.model.get_output_embeddings()
            hook = head.register_forward_pre_hook(lambda _m, a: seen.append(a[0]))
        try:
            yield seen
        finally:
            hook.remove()

    # -- the scheduler thread ------------------------------------------------------------------------

    def _running(self) -> list[Sequence]:
        return self._rows + self._parked_rows()

    def _step(self, admitted: list[Sequence]) -> None:
        with torch.inference_mode():
            if admitted:
                self._prefill(admitted)
            self._prioritise()
            if self._rows:
                self._decode_step()

    def _fail_running(self, error: Exception, admitted: list[Sequence]) -> None:
        for seq in [*self._rows, *admitted, *self._parked_rows()]:
            if not seq.finish:
                seq.fail(error)
        self._rows, self._cache, self._shadow, self._parked = [], None, False, []

    def _admit(self) -> list[Sequence]:
        """Take waiting requests while there are free rows and the prefill budget lasts (at least one)."""
        taken: list[Sequence] = []
        budget = self.prefill_budget_tokens
        while self._waiting and len(self._rows) + len(self._parked_rows()) + len(taken) < self.max_batch_size:
            seq = self._waiting[0]
            if taken and len(seq.prompt_ids) > budget:
                break
            self._waiting.popleft()
            if seq.request.cancel.is_set():
                seq.end("cancelled")
                continue
            budget -= len(seq.prompt_ids)
            taken.append(seq)
        self.stats.waiting = len(self._waiting)
        return taken

    def _prefill(self, seqs: list[Sequence]) -> None:
        from transformers import DynamicCache

        t0 = time.perf_counter()
        joined: list[tuple[Sequence, Any]] = []
        for seq in seqs:
            try:
                if seq.request.adapter is not None:
                    in_use = {s.adapter_key for s in self._rows} | {s.adapter_key for s, _ in joined}
                    seq.adapter_key = self.adapters.ensure(seq.request.adapter, in_use)
                group = seq.request.group
                sibling = self._prefilled.get(group) if group is not None else None
                # (A choice that scores the prompt prefills it itself: it needs every position's logits.)
                if sibling is not None and sibling.serves(seq) and not seq.request.echo:
                    # Copies: processors and grammar masks may change a row's logits in place.
                    cache, logits = copy.deepcopy(sibling.cache), sibling.logits.clone()
                    sibling.left -= 1
                    if not sibling.left:
                        del self._prefilled[group]
                else:
                    cache = DynamicCache()
                    ids = torch.tensor([seq.prompt_ids], device=self.device)
                    scores_prompt = seq.request.echo
                    with self._head_input(seq.states is not None) as seen:  # (a proof's: head_inputs)
                        out = self.adapters.forward(
                            [seq.adapter_key],
                            input_ids=ids,
                            past_key_values=cache,
                            use_cache=True,
                            **({} if scores_prompt else self._last_logits),  # scoring needs every position's
                        )
                    if seen:
                        seq.proof_prompt = (cache, seen[-1][0, -1])  # the cache is not changed by merging
                    if scores_prompt:
                        seq.scored_prompt(self._prompt_logprobs(seq, out.logits[0, :-1]))
                    logits = out.logits[0, -1]
                    if group is not None and group.n > 1 and group not in self._prefilled:
                        kept = _Prefilled(
                            seq.prompt_ids, seq.adapter_key, copy.deepcopy(cache), logits.clone(), group.n - 1
                        )
                        self._prefilled[group] = kept
                token, entry = self._sample(seq, logits)
            except Exception as e:  # one bad request (a processor that raises) fails alone
                seq.fail(e)
                continue
            if seq.accept(token, self.eos_ids, self.context_length, entry):
                joined.append((seq, cache))
        if joined:
            self._merge(joined)
        self.stats.prefill_seconds += time.perf_counter() - t0

    def _decode_step(self) -> None:
        t0 = time.perf_counter()
        rows = self._rows
        if self.ragged and len(rows) == 1 and not self._shadow:
            self._set_cache([(k.repeat(2, 1, 1, 1), v.repeat(2, 1, 1, 1)) for k, v in self._layers()])
            self._shadow = True
        feed = [*rows, rows[0]] if self._shadow else rows
        width = self._cache.get_seq_length()
        tokens = torch.tensor([[s.generated[-1]] for s in feed], device=self.device)
        positions = torch.tensor([[s.length - 1] for s in feed], device=self.device)
        kwargs: dict[str, Any] = {}
        if self.ragged:
            kwargs[_ROW_STARTS] = [width - (s.length - 1) for s in feed]
        logits = self.adapters.forward(
            [s.adapter_key for s in feed],
            input_ids=tokens,
            position_ids=positions,
            past_key_values=self._cache,
            use_cache=True,
            **kwargs,
        ).logits[:, -1]
        keep: list[int] = []
        for i, seq in enumerate(rows):
            if seq.request.cancel.is_set():
                seq.end("cancelled")
                continue
            try:
                token, entry = self._sample(seq, logits[i])
            except Exception as e:
                seq.fail(e)
                continue
            if seq.accept(token, self.eos_ids, self.context_length, entry):
                keep.append(i)
        self.stats.steps += 1
        self.stats.last_batch = len(rows)
        self.stats.tokens += len(rows)
        if len(keep) < len(rows):
            self._evict(keep)
        self.stats.decode_seconds += time.perf_counter() - t0

    # -- sampling and finishing ----------------------------------------------------------------------

    def _prompt_logprobs(self, seq: Sequence, logits: torch.Tensor) -> list[Any]:
        """Position j's logits score prompt token j+1 (the first token has no log-probability). Worked out
        on the model's device a block of positions at a time; only each position's token and its best
        alternatives come back to the host."""
        top, ids = seq.request.logprobs or 0, seq.prompt_ids
        targets = torch.tensor(ids[1:], device=logits.device)
        entries = [unscored(ids[0], self.token_bytes)]
        for start in range(0, len(targets), PROMPT_SCORE_BLOCK):
            rows = torch.log_softmax(logits[start : start + PROMPT_SCORE_BLOCK].float(), -1)
            block = targets[start : start + PROMPT_SCORE_BLOCK]
            chosen = rows.gather(1, block[:, None])[:, 0].tolist()
            best = rows.topk(top, -1) if top else None
            for j, token in enumerate(block.tolist()):
                pairs = (
                    zip(best.indices[j].tolist(), best.values[j].tolist(), strict=True)
                    if best is not None
                    else ()
                )
                entries.append(logprob_entry(token, chosen[j], pairs, self.token_bytes))
        return entries

    def _sample(self, seq: Sequence, logits: torch.Tensor) -> tuple[int, Any]:
        """The next token, and its log-probability entry when the request asks for them."""
        req = seq.request
        scores = logits.float()
        if req.logits_processor is not None:
            ids = torch.tensor([seq.prompt_ids + seq.generated], device=scores.device)
            scores = req.logits_processor(ids, scores[None])[0]
        if seq.constraint is not None:
            scores = seq.constraint.mask_logits(scores)
        token = self._choose(seq, scores)
        if req.logprobs is None:
            return token, None
        row = log_softmax(scores.cpu().numpy())
        return token, token_logprob(row, token, req.logprobs, self.token_bytes)

    def _choose(self, seq: Sequence, scores: torch.Tensor) -> int:
        req = seq.request
        if req.temperature <= 0:
            return int(scores.argmax())
        scores = scores / req.temperature
        if req.top_p < 1.0:
            # Nucleus filtering as transformers' TopPLogitsWarper does it: drop the low tail whose mass is
            # at most 1 - top_p, keeping at least one token.
            sorted_scores, order = torch.sort(scores, descending=False)
            cumulative = sorted_scores.softmax(-1).cumsum(-1)
            remove = cumulative <= (1 - req.top_p)
            remove[-1] = False
            scores = scores.masked_fill(remove.scatter(0, order, remove), float("-inf"))
        probs = scores.softmax(-1)
        return int(torch.multinomial(probs, 1, generator=seq.generator))

    # -- the cache -----------------------------------------------------------------------------------

    def _layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.keys, layer.values) for layer in self._cache.layers]

    def _set_cache(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        from transformers import DynamicCache

        self._cache = DynamicCache(ddp_cache_data=layers)

    def _merge(self, joined: list[tuple[Sequence, Any]]) -> None:
        """Add prefilled sequences as new rows."""
        self._join([([seq], [(layer.keys, layer.values) for layer in cache.layers], len(seq.prompt_ids))
                    for seq, cache in joined])  # fmt: skip

    def _join(self, parts: list[tuple[list[Sequence], list[tuple[torch.Tensor, torch.Tensor]], int]]) -> None:
        """Append rows with their cache layers (each part as wide as given): every row left-padded to the
        widest, then stacked after the running rows."""
        if self._rows:
            self._drop_shadow()
            parts = [(self._rows, self._layers(), self._cache.get_seq_length()), *parts]
        width = max(w for _, _, w in parts)

        def padded(t: torch.Tensor, w: int) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, 0, width - w, 0)) if w < width else t

        n_layers = len(parts[0][1])
        self._set_cache(
            [
                (
                    torch.cat([padded(layers[i][0], w) for _, layers, w in parts]),
                    torch.cat([padded(layers[i][1], w) for _, layers, w in parts]),
                )
                for i in range(n_layers)
            ]
        )
        self._rows = [seq for rows, _, _ in parts for seq in rows]

    def _parked_rows(self) -> list[Sequence]:
        return [seq for rows, _, _ in self._parked for seq in rows]

    def _prioritise(self) -> None:
        """Park the other rows while a priority row runs; bring them back when none is left."""
        urgent = [i for i, seq in enumerate(self._rows) if seq.request.priority]
        if urgent and len(urgent) < len(self._rows):
            self._drop_shadow()
            others = [i for i, seq in enumerate(self._rows) if not seq.request.priority]
            index = torch.tensor(others, dtype=torch.long, device=self.device)
            layers = [(k[index], v[index]) for k, v in self._layers()]
            self._parked.append(([self._rows[i] for i in others], layers, self._cache.get_seq_length()))
            self._evict(urgent)
        elif not urgent and self._parked:
            parked, self._parked = self._parked, []
            self._join(parked)

    def _drop_shadow(self) -> None:
        if self._shadow:
            self._set_cache([(k[:1], v[:1]) for k, v in self._layers()])
            self._shadow = False

    def _evict(self, keep: list[int]) -> None:
        """Drop finished rows and the leading columns no remaining row reads."""
        self._rows = [self._rows[i] for i in keep]
        self._shadow = False
        if not self._rows:
            self._cache = None
            return
        width = self._cache.get_seq_length()
        trim = width - max(s.length - 1 for s in self._rows)
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        self._set_cache([(k[index, :, trim:], v[index, :, trim:]) for k, v in self._layers()])


@dataclass
class _Prefilled:
    """(Not the sequence itself: it refers to its group, which must be free to go.)"""

    prompt_ids: list[int]
    adapter_key: str
    cache: Any
    logits: torch.Tensor
    left: int  # choices still to join

    def serves(self, seq: Sequence) -> bool:
        return self.prompt_ids == seq.prompt_ids and self.adapter_key == seq.adapter_key


def _host(rows: torch.Tensor) -> np.ndarray:
    return rows.detach().float().cpu().numpy().copy()  # a copy, not a view of the model's tensors


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return ids
