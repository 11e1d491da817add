"""The GSPO loss fused with the LM head: per-token log-probs from the last hidden states, vocabulary chunk by
vocabulary chunk, without ever holding the (tokens × vocab) logits.

The unfused loss computes logits = hidden @ weightᵀ, a (N, V) tensor (8k tokens × 49152 entries is 1.6 GB in
fp32, plus its log-softmax and their gradients), only to read one entry per row. Here ``chosen_logprobs``
computes log p(target) = logit[target] - logsumexp(logits) with an online logsumexp over vocabulary chunks
and a backward that recomputes each chunk's logits from the saved hidden states, so the extra memory is
O(N·chunk) (torch) or O(tile) (Triton) instead of O(N·V). ``fused_gspo_loss`` feeds those log-probs to the
plain-torch ``gspo_loss`` of loss.py, so the ratio, clipping and masked means are the checked ones.

Two implementations sit behind one autograd Function:
- Triton (the default on CUDA; on CPU under ``TRITON_INTERPRET=1`` set before this module is imported,
  which is how the tests check it): a forward kernel and a backward kernel, see ``_forward_kernel``;
- chunked torch (the fallback wherever Triton cannot run), which is also the readable statement of the
  algorithm.
Both compute in fp32 whatever the input dtype and return fp32 log-probs. The full log-softmax in fp64
(tests/trainer/gspo/test_fused.py) is the oracle for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from zoo.trainer.gspo.loss import GspoLossConfig, gspo_loss

try:  # Triton is optional: without it the chunked-torch path does everything.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with the torch wheels this project installs
    triton = None
    tl = None

__all__ = ["Backend", "chosen_logprobs", "fused_gspo_loss", "triton_available"]

Backend = Literal["auto", "triton", "torch"]
_BACKENDS = ("auto", "triton", "torch")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TORCH_CHUNK = 4096  # vocabulary entries per chunk of the torch path: its scratch is ~2·N·4096 fp32

# ------------------------------------------------------------------------------------------- Triton kernels

if triton is not None:

    @triton.jit
    def _logits_tile(
        h_ptr,
        w_ptr,
        rows,
        cols,
        row_ok,
        col_ok,
        H,
        BLOCK_N: tl.constexpr,
        BLOCK_V: tl.constexpr,
        BLOCK_H: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        UPCAST: tl.constexpr,
    ):
        """fp32 logits of rows × cols, hidden · weightᵀ accumulated over BLOCK_H-wide slices of H."""
        acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            ks = h0 + tl.arange(0, BLOCK_H)
            k_ok = ks < H
            h = tl.load(
                h_ptr + rows[:, None] * H + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
            )
            w = tl.load(
                w_ptr + cols[:, None] * H + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0
            )
            # Either way the logits are fp32 sums of exact products: a bf16/fp16 tensor-core dot multiplies
            # exactly and accumulates in fp32. UPCAST (mixed dtypes, fp32, or the interpreter, which can't
            # multiply bf16) takes the fp32 dot at DOT_PRECISION instead, at half the tensor-core rate.
            if UPCAST:
                h = h.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(h, tl.trans(w), acc, input_precision=DOT_PRECISION)
        return acc

    @triton.jit
    def _forward_kernel(
        h_ptr,
        w_ptr,
        t_ptr,
        max_ptr,
        sum_ptr,
        target_ptr,
        N,
        V,
        H,
        SPLIT_V,
        BLOCK_N: tl.constexpr,
        BLOCK_V: tl.constexpr,
        BLOCK_H: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        UPCAST: tl.constexpr,
    ):
        """Partial logsumexp of BLOCK_N rows over one split of the vocabulary.

        Grid (row blocks, vocabulary splits). Program (i, j) walks the BLOCK_V-wide chunks of vocabulary
        split j ([j·SPLIT_V, (j+1)·SPLIT_V) ∩ [0, V)) for rows i·BLOCK_N..., keeping per row a running max
        m and a running sum s = Σ exp(logit - m) (the online logsumexp: when a chunk raises the max, the sum
        so far is rescaled by exp(m_old - m_new), so no exp overflows and nothing wider than a tile is kept).
        It writes m, s and the target's logit if the target lies in its split (else 0); the host combines
        the splits. Every split holds at least one vocabulary entry, so m is finite when written.
        """
        pid_n = tl.program_id(0)
        pid_v = tl.program_id(1)
        rows = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        row_ok = rows < N
        targets = tl.load(t_ptr + rows, mask=row_ok, other=-1)
        run_max = tl.full((BLOCK_N,), float("-inf"), dtype=tl.float32)
        run_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
        target_logit = tl.zeros((BLOCK_N,), dtype=tl.float32)
        v_start = pid_v * SPLIT_V
        v_end = tl.minimum(v_start + SPLIT_V, V)
        for v0 in range(v_start, v_end, BLOCK_V):
            cols = (v0 + tl.arange(0, BLOCK_V)).to(tl.int64)
            col_ok = cols < V
            logits = _logits_tile(
                h_ptr, w_ptr, rows, cols, row_ok, col_ok, H, BLOCK_N, BLOCK_V, BLOCK_H, DOT_PRECISION, UPCAST
            )
            logits = tl.where(col_ok[None, :], logits, float("-inf"))  # past V: exp(-inf) = 0
            new_max = tl.maximum(run_max, tl.max(logits, axis=1))
            run_sum = run_sum * tl.exp(run_max - new_max) + tl.sum(tl.exp(logits - new_max[:, None]), axis=1)
            run_max = new_max
            hit = cols[None, :] == targets[:, None]
            target_logit += tl.sum(tl.where(hit, logits, 0.0), axis=1)
        out = pid_v * N + rows
        tl.store(max_ptr + out, run_max, mask=row_ok)
        tl.store(sum_ptr + out, run_sum, mask=row_ok)
        tl.store(target_ptr + out, target_logit, mask=row_ok)

    @triton.jit
    def _backward_kernel(
        h_ptr,
        w_ptr,
        t_ptr,
        lse_ptr,
        g_ptr,
        grad_h_ptr,
        grad_w_ptr,
        N,
        V,
        H,
        SPLIT_V,
        BLOCK_N: tl.constexpr,
        BLOCK_V: tl.constexpr,
        BLOCK_H: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        UPCAST: tl.constexpr,
        GRAD_HIDDEN: tl.constexpr,
        GRAD_WEIGHT: tl.constexpr,
    ):
        """Gradients of Σₙ gₙ·log p(targetₙ) for BLOCK_N rows over one split of the vocabulary.

        Same grid as the forward. For each chunk the program recomputes the logits tile from hidden and
        weight, turns it into coef = g·(onehot(target) - softmax) with the saved logsumexp (softmax =
        exp(logit - lse): no second pass over the vocabulary), and adds coef @ W[chunk] to grad_hidden[rows]
        and coefᵀ @ hidden[rows] to grad_weight[chunk], one BLOCK_H slice at a time. The tile is the only
        (rows × vocab) object that ever exists. Both gradients are fp32 buffers updated with atomic adds:
        grad_hidden rows are shared by the vocabulary splits of a row block (uncontended with one split),
        grad_weight rows by all row blocks; the summation order, hence the last bits, can vary run to run.
        """
        pid_n = tl.program_id(0)
        pid_v = tl.program_id(1)
        rows = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        row_ok = rows < N
        targets = tl.load(t_ptr + rows, mask=row_ok, other=-1)
        lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
        g = tl.load(g_ptr + rows, mask=row_ok, other=0.0)  # 0 past N: those rows contribute nothing
        v_start = pid_v * SPLIT_V
        v_end = tl.minimum(v_start + SPLIT_V, V)
        for v0 in range(v_start, v_end, BLOCK_V):
            cols = (v0 + tl.arange(0, BLOCK_V)).to(tl.int64)
            col_ok = cols < V
            logits = _logits_tile(
                h_ptr, w_ptr, rows, cols, row_ok, col_ok, H, BLOCK_N, BLOCK_V, BLOCK_H, DOT_PRECISION, UPCAST
            )
            probs = tl.where(col_ok[None, :], tl.exp(logits - lse[:, None]), 0.0)
            onehot = tl.where(cols[None, :] == targets[:, None], 1.0, 0.0)
            coef = g[:, None] * (onehot - probs)  # d(g·log p_t)/d logit_v = g·(1[v = t] - p_v)
            if not UPCAST:
                # Rounded to the inputs' dtype for the tensor-core dots, as the unfused bf16 path rounds
                # its logits' gradient; the products are exact and the sums fp32.
                coef = coef.to(h_ptr.dtype.element_ty)
            for h0 in range(0, H, BLOCK_H):
                ks = h0 + tl.arange(0, BLOCK_H)
                k_ok = ks < H
                if GRAD_HIDDEN:
                    w = tl.load(
                        w_ptr + cols[:, None] * H + ks[None, :],
                        mask=col_ok[:, None] & k_ok[None, :],
                        other=0.0,
                    )
                    if UPCAST:
                        w = w.to(tl.float32)
                    part = tl.dot(coef, w, input_precision=DOT_PRECISION)
                    tl.atomic_add(
                        grad_h_ptr + rows[:, None] * H + ks[None, :],
                        part,
                        mask=row_ok[:, None] & k_ok[None, :],
                        sem="relaxed",
                    )
                if GRAD_WEIGHT:
                    h = tl.load(
                        h_ptr + rows[:, None] * H + ks[None, :],
                        mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0,
                    )
                    if UPCAST:
                        h = h.to(tl.float32)
                    part = tl.dot(tl.trans(coef), h, input_precision=DOT_PRECISION)
                    tl.atomic_add(
                        grad_w_ptr + cols[:, None] * H + ks[None, :],
                        part,
                        mask=col_ok[:, None] & k_ok[None, :],
                        sem="relaxed",
                    )

    # The interpreter flag is read when @triton.jit decorates, i.e. when this module is imported.
    _TRITON_INTERPRETED = not isinstance(_forward_kernel, triton.runtime.JITFunction)
else:  # pragma: no cover
    _TRITON_INTERPRETED = False


def triton_available(device: torch.device) -> bool:
    """Whether the Triton kernels can run on tensors of ``device``: a CUDA device, or the interpreter."""
    return triton is not None and (_TRITON_INTERPRETED or device.type == "cuda")


@dataclass(frozen=True)
class Tiles:
    """Tile shape and launch settings of both kernels; block_v is the default chunk."""

    block_n: int  # rows per program (fewer when there are fewer rows); tl.dot needs >= 16
    block_v: int  # vocabulary entries per tile
    block_h: int  # width of the hidden-size slices the dots accumulate over
    num_warps: int
    num_stages: int  # software-pipelining depth: shared memory grows with it


# Chosen by a sweep on an H200 (H = 576, V = 49152, 2k and 8k tokens; .gpu notes in the README's GSPO
# section). Native bf16/fp16 dots take large tiles; fp32 operands (3xTF32) need twice the shared memory per
# tile and would not fit with those. The interpreter runs the fp32 ones.
TILES = {
    "native": Tiles(block_n=256, block_v=128, block_h=32, num_warps=8, num_stages=3),
    "fp32": Tiles(block_n=128, block_v=128, block_h=32, num_warps=8, num_stages=3),
}


def _dot_settings(hidden: torch.Tensor, weight: torch.Tensor) -> tuple[str, bool]:
    """(tl.dot's input precision, whether to upcast to fp32 before the dots).

    bf16 (or fp16) hidden and weight on a GPU take the tensor cores' native dot: exact products, fp32 sums,
    the backward's coefficients rounded to the inputs' dtype (as the unfused path rounds its bf16 logits'
    gradient). Otherwise the dot is fp32: at torch's matmul precision "highest" (the default) exact under
    the interpreter and 3xTF32 on a GPU (fp32 accuracy on tensor cores; a plain fp32 Triton dot runs on
    the slow FMA units), else TF32, as torch's own matmuls would be."""
    low = hidden.dtype == weight.dtype and hidden.dtype != torch.float32
    if low and not _TRITON_INTERPRETED:
        return "tf32", False  # the precision is not used by bf16/fp16 dots
    if low:
        return "tf32", True  # bf16/fp16 values are exact in tf32
    if torch.get_float32_matmul_precision() != "highest":
        return "tf32", True
    return ("ieee" if _TRITON_INTERPRETED else "tf32x3"), True


def _num_splits(row_blocks: int, chunks: int, device: torch.device) -> int:
    """Vocabulary splits per row block: enough programs to fill a GPU (~4 per SM); 1 on CPU (interpreter),
    where programs run one after the other anyway."""
    if device.type != "cuda":
        return 1
    programs = 4 * torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(chunks, -(-programs // row_blocks)))


def _launch(
    hidden: torch.Tensor, weight: torch.Tensor, chunk: int
) -> tuple[tuple[int, int], tuple[int, int, int], dict[str, Any]]:
    """Both kernels' grid (row blocks, splits), sizes (N, V, H) and keyword arguments: the dot's settings
    and the tile sizes (``TILES``; chunk 0: the tiles' block_v). tl.dot needs every tile dimension >= 16."""
    n, h = hidden.shape
    v = weight.shape[0]
    precision, upcast = _dot_settings(hidden, weight)
    tiles = TILES["fp32" if upcast else "native"]
    block_v = chunk or tiles.block_v
    block_n = min(tiles.block_n, max(16, triton.next_power_of_2(n)))
    block_h = min(tiles.block_h, max(16, triton.next_power_of_2(h)))
    chunks = triton.cdiv(v, block_v)
    row_blocks = triton.cdiv(n, block_n)
    per_split = triton.cdiv(chunks, _num_splits(row_blocks, chunks, hidden.device))
    splits = triton.cdiv(chunks, per_split)  # recomputed so that no split is empty
    return (
        (row_blocks, splits),
        (n, v, h),
        {
            "DOT_PRECISION": precision,
            "UPCAST": upcast,
            "SPLIT_V": per_split * block_v,
            "BLOCK_N": block_n,
            "BLOCK_V": block_v,
            "BLOCK_H": block_h,
            "num_warps": tiles.num_warps,
            "num_stages": tiles.num_stages,
        },
    )


def _triton_forward(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), logsumexp) per row, fp32, by ``_forward_kernel`` and a host-side merge of splits."""
    grid, sizes, settings = _launch(hidden, weight, chunk)
    parts = (hidden.new_empty((grid[1], sizes[0]), dtype=torch.float32) for _ in range(3))
    part_max, part_sum, part_target = parts
    _forward_kernel[grid](hidden, weight, targets, part_max, part_sum, part_target, *sizes, **settings)
    # Merging partial logsumexps: lse = M + log Σⱼ sⱼ·exp(mⱼ - M), M = maxⱼ mⱼ (each sⱼ is relative to mⱼ).
    top = part_max.amax(dim=0)
    lse = top + torch.log((part_sum * torch.exp(part_max - top)).sum(dim=0))
    return part_target.sum(dim=0) - lse, lse  # only the target's split wrote a nonzero target logit


def _triton_backward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    grad: torch.Tensor,
    chunk: int,
    need_hidden: bool,
    need_weight: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """fp32 gradients w.r.t. hidden and weight (None where not needed) by ``_backward_kernel``."""
    grid, sizes, settings = _launch(hidden, weight, chunk)
    grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_hidden else None
    grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=hidden.device) if need_weight else None
    dummy = lse  # a pointer the kernel never touches when the matching GRAD_* flag is off
    _backward_kernel[grid](
        hidden,
        weight,
        targets,
        lse,
        grad,
        grad_h if grad_h is not None else dummy,
        grad_w if grad_w is not None else dummy,
        *sizes,
        GRAD_HIDDEN=need_hidden,
        GRAD_WEIGHT=need_weight,
        **settings,
    )
    return grad_h, grad_w


# -------------------------------------------------------------------------------------- chunked torch path


def _torch_forward(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), logsumexp) per row, fp32, one (N, chunk) logits block at a time."""
    h = hidden.float()  # fp32 throughout: a bf16 logsumexp over 49k entries would lose ~3 significant digits
    lse = h.new_full((h.shape[0],), float("-inf"))
    for v0 in range(0, weight.shape[0], chunk):
        logits = h @ weight[v0 : v0 + chunk].float().T
        # Online logsumexp at chunk granularity: logaddexp(a, b) = max + log(exp(a - max) + exp(b - max)),
        # so the running value never overflows; torch's fused logsumexp does the max-shift within the chunk.
        lse = torch.logaddexp(lse, torch.logsumexp(logits, dim=1))
    target_logit = (h * weight[targets].float()).sum(dim=1)  # O(N·H): one weight row per token
    return target_logit - lse, lse


def _torch_backward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    grad: torch.Tensor,
    chunk: int,
    need_hidden: bool,
    need_weight: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """fp32 gradients of Σ gₙ·log p(targetₙ): the softmax part chunk by chunk, the one-hot part by rows.

    With coef = g·(onehot - softmax): grad_hidden = coef @ W and grad_weight = coefᵀ @ hidden. The softmax
    part of a chunk is exp(logits - lse) with the saved lse, recomputed from hidden; the one-hot part is
    g·W[target] for hidden and g·hidden scattered onto the target rows for weight.
    """
    h = hidden.float()
    grad_h = torch.zeros_like(h) if need_hidden else None
    grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if need_weight else None
    for v0 in range(0, weight.shape[0], chunk):
        w = weight[v0 : v0 + chunk].float()
        # g·softmax over this chunk, in place on the recomputed logits: the chunk's only (N, chunk) buffer.
        scaled = (h @ w.T).sub_(lse[:, None]).exp_().mul_(grad[:, None])
        if grad_h is not None:
            grad_h.addmm_(scaled, w, alpha=-1.0)
        if grad_w is not None:
            grad_w[v0 : v0 + chunk].addmm_(scaled.T, h, alpha=-1.0)
    if grad_h is not None:
        grad_h += grad[:, None] * weight[targets].float()
    if grad_w is not None:
        grad_w.index_add_(0, targets, grad[:, None] * h)
    return grad_h, grad_w


# ------------------------------------------------------------------------------------------ autograd glue

_FORWARD = {"triton": _triton_forward, "torch": _torch_forward}
_BACKWARD = {"triton": _triton_backward, "torch": _torch_backward}


class _ChosenLogprobs(torch.autograd.Function):
    """log p(target) from hidden states and the LM head; saves only hidden, weight, targets and lse."""

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, backend: str, chunk: int
    ) -> torch.Tensor:
        logp, lse = _FORWARD[backend](hidden, weight, targets, chunk)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.backend, ctx.chunk = backend, chunk
        return logp

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, targets, lse = ctx.saved_tensors
        grad_h, grad_w = _BACKWARD[ctx.backend](
            hidden,
            weight,
            targets,
            lse,
            grad.float().contiguous(),
            ctx.chunk,
            ctx.needs_input_grad[0],
            ctx.needs_input_grad[1],
        )
        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None,
            None,
            None,
        )


def _resolve_backend(backend: str, device: torch.device) -> str:
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(_BACKENDS)} (got {backend!r})")
    if backend == "auto":
        return "triton" if triton_available(device) else "torch"
    if backend == "triton" and not triton_available(device):
        raise RuntimeError(
            "the Triton backend needs CUDA tensors, or TRITON_INTERPRET=1 set before "
            f"{__name__} is imported (tensors are on {device}"
            f"{'' if triton is not None else ', and triton is not installed'})"
        )
    return backend


def _resolve_chunk(chunk_size: int | None, backend: str) -> int:
    if chunk_size is None:
        return 0 if backend == "triton" else TORCH_CHUNK  # Triton: 0 = the tiles' own (see _launch)
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer (got {chunk_size!r})")
    if backend == "triton" and (chunk_size < 16 or chunk_size > 1024 or chunk_size & (chunk_size - 1)):
        raise ValueError(
            f"the Triton backend needs chunk_size a power of two in [16, 1024] (got {chunk_size})"
        )
    return chunk_size


def _check_targets(targets: torch.Tensor, vocab: int, name: str = "targets") -> None:
    if targets.dtype == torch.bool or targets.is_floating_point() or targets.is_complex():
        raise ValueError(f"{name} must hold integer token ids (got dtype {targets.dtype})")
    if not targets.numel():
        return
    low, high = torch.stack(torch.aminmax(targets)).tolist()  # one device sync for both ends
    if low < 0 or high >= vocab:
        raise ValueError(
            f"{name} must lie in [0, {vocab}) for a vocabulary of {vocab} (got values in [{low}, {high}])"
        )


def _check_inputs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ids: bool = True
) -> None:
    """Shapes, dtypes and devices; with ``ids`` also that every target is a token id (a device sync)."""
    if hidden.dim() != 2:
        raise ValueError(f"hidden must have shape (N, H) (got {tuple(hidden.shape)})")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[1] or weight.shape[0] == 0:
        raise ValueError(
            f"weight must have shape (V, H={hidden.shape[1]}) with V >= 1 (got {tuple(weight.shape)})"
        )
    if hidden.shape[1] == 0:
        raise ValueError("hidden size H must be >= 1")
    for name, tensor in (("hidden", hidden), ("weight", weight)):
        if tensor.dtype not in _DTYPES:
            raise ValueError(f"{name} must be float32, bfloat16 or float16 (got {tensor.dtype})")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"targets must have shape ({hidden.shape[0]},), one id per row of hidden "
            f"(got {tuple(targets.shape)})"
        )
    if not hidden.device == weight.device == targets.device:
        raise ValueError(
            f"hidden, weight and targets must be on one device (got {hidden.device}, {weight.device}, "
            f"{targets.device})"
        )
    if ids:
        _check_targets(targets, weight.shape[0])


def chosen_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    backend: Backend = "auto",
    chunk_size: int | None = None,
) -> torch.Tensor:
    """log softmax(hidden @ weightᵀ)[n, targets[n]] for every row n, without the (N, V) logits.

    Args:
        hidden: (N, H) last hidden states (float32, bfloat16 or float16).
        weight: (V, H) LM-head weight, same dtypes; a head with a bias is not supported.
        targets: (N,) integer token ids in [0, V).
        backend: "triton", "torch" (chunked), or "auto": Triton where it can run (CUDA tensors, or the
            interpreter), else torch.
        chunk_size: vocabulary entries per chunk; default 4096 for torch; for Triton the tile's BLOCK_V,
            a power of two in [16, 1024], by default 128 (``TILES``).

    Returns (N,) float32 log-probabilities, differentiable w.r.t. hidden and weight (gradients come back in
    their dtypes). Everything is computed in fp32.
    """
    _check_inputs(hidden, weight, targets)
    return _chosen_logprobs(hidden, weight, targets, backend, chunk_size)


def _chosen_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, backend: str, chunk_size: int | None
) -> torch.Tensor:
    """``chosen_logprobs`` on inputs already checked."""
    chosen = _resolve_backend(backend, hidden.device)
    chunk = _resolve_chunk(chunk_size, chosen)
    if hidden.shape[0] == 0:
        chosen = "torch"  # no rows: nothing to launch; the torch path returns an empty result
    return _ChosenLogprobs.apply(
        hidden.contiguous(), weight.contiguous(), targets.long().contiguous(), chosen, chunk
    )


def fused_gspo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: GspoLossConfig,
    ref_logp: torch.Tensor | None = None,
    *,
    backend: Backend = "auto",
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``gspo_loss`` on log-probs computed by ``chosen_logprobs`` from the hidden states and the LM head.

    Args:
        hidden: (B, T, H) last hidden states at the positions that predict ``targets``.
        weight: (V, H) LM-head weight.
        targets: (B, T) the sampled completion tokens. Only positions where ``mask`` is set are read, so
            padding may hold any id (-100, the pad id...).
        old_logp, advantages, mask, config, ref_logp: as for ``gspo_loss``.
        backend, chunk_size: as for ``chosen_logprobs``.

    Log-probs are computed for the masked positions only and scattered into a (B, T) fp32 tensor (0 on
    padding, which gspo_loss never reads). Returns what ``gspo_loss`` returns.
    """
    if hidden.dim() != 3:
        raise ValueError(f"hidden must have shape (B, T, H) (got {tuple(hidden.shape)})")
    for name, tensor in (("targets", targets), ("mask", mask)):
        if tensor.shape != hidden.shape[:2]:
            raise ValueError(
                f"{name} must have shape (B, T) = {tuple(hidden.shape[:2])} (got {tuple(tensor.shape)})"
            )
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must be boolean or hold only 0 and 1")
    # Index once (one device sync, for the number of positions): boolean indexing would sync per tensor.
    valid = mask.bool().nonzero(as_tuple=True)
    rows, ids = hidden[valid], targets[valid]
    _check_inputs(rows, weight, ids, ids=False)
    _check_targets(ids, weight.shape[0], "targets at masked positions")
    logp = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    logp = logp.index_put(valid, _chosen_logprobs(rows, weight, ids, backend, chunk_size))
    return gspo_loss(logp, old_logp, advantages, mask, config, ref_logp)
