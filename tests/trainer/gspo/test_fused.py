"""The fused (LM head + log-softmax + GSPO) loss against the unfused oracle.

The oracle is the full log_softmax(hidden @ weightᵀ) gathered at the targets, in fp64, differentiated by
autograd. Both backends of zoo.trainer.gspo.fused are checked against it, values and gradients w.r.t.
hidden and weight: the chunked-torch one directly, the Triton one under the Triton interpreter on CPU.

Triton picks the interpreter when @triton.jit decorates a function, and triton.language decorates its own
helpers (tl.max, tl.sum...) when triton is first imported, so TRITON_INTERPRET=1 must be set before the
process imports triton (loading a second copy of fused.py with the variable set is not enough: its kernels
are interpreted but call compiled-mode tl.max). Hence the Triton checks are plain functions that
``test_triton_backend_under_interpreter`` reports one by one, run in one subprocess started with the
variable set, which is also the route a CPU user takes; a run started with TRITON_INTERPRET=1 calls them
directly. On a CUDA machine ``test_triton_backend_on_cuda`` checks the compiled kernels too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from zoo.trainer.gspo import fused
from zoo.trainer.gspo.fused import chosen_logprobs, fused_gspo_loss
from zoo.trainer.gspo.loss import GspoLossConfig, gspo_loss

pytestmark = pytest.mark.numerics

ROOT = Path(__file__).resolve().parents[3]

# fp32 compute against the fp64 oracle, logits of magnitude ~10: a few fp32 ulps of the logsumexp.
FP32_TOL = {"rtol": 1e-5, "atol": 2e-5}


def make_inputs(
    n: int, h: int, v: int, dtype: torch.dtype = torch.float32, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden (n, h), weight (v, h) in ``dtype``, targets (n,), and an upstream gradient g (n,) in fp64."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen).to(dtype)
    weight = (torch.randn(v, h, generator=gen) * 0.5).to(dtype)
    targets = torch.randint(0, v, (n,), generator=gen)
    grad = torch.randn(n, generator=gen, dtype=torch.float64)
    return hidden, weight, targets, grad


def oracle(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp64 log p(target) from the full log-softmax, and the gradients of Σ grad·logp."""
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    logp = torch.log_softmax(h @ w.T, dim=-1).gather(1, targets[:, None]).squeeze(1)
    (logp * grad).sum().backward()
    assert h.grad is not None and w.grad is not None
    return logp.detach(), h.grad, w.grad


def run(
    module: ModuleType,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    grad: torch.Tensor,
    **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``module.chosen_logprobs`` and its gradients w.r.t. hidden and weight, in fp64 for comparison."""
    h = hidden.detach().clone().requires_grad_()
    w = weight.detach().clone().requires_grad_()
    logp = module.chosen_logprobs(h, w, targets, **kwargs)
    assert logp.dtype == torch.float32 and logp.shape == targets.shape
    (logp * grad.float()).sum().backward()
    assert h.grad is not None and w.grad is not None
    assert h.grad.dtype == hidden.dtype and w.grad.dtype == weight.dtype
    return logp.double(), h.grad.double(), w.grad.double()


def assert_matches_oracle(
    got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], rtol: float, atol: float
) -> None:
    for name, actual, expected in zip(("logp", "grad_hidden", "grad_weight"), got, want, strict=True):
        # Gradients are compared on the scale of their largest entry (most grad_weight rows are tiny).
        scale = 1.0 if name == "logp" else max(1.0, float(expected.abs().max()))
        torch.testing.assert_close(
            actual, expected, rtol=rtol, atol=atol * scale, msg=lambda m, n=name: f"{n}: {m}"
        )


# ------------------------------------------------------------------------------------- chunked torch path

TORCH_SHAPES = [
    pytest.param(7, 16, 100, 32, id="V-not-a-multiple-of-chunk"),
    pytest.param(5, 8, 50, 64, id="chunk-larger-than-V"),
    pytest.param(1, 12, 37, 8, id="one-row"),
    pytest.param(16, 32, 256, 64, id="V-a-multiple-of-chunk"),
    pytest.param(6, 24, 300, 1, id="chunk-of-one"),
]


@pytest.mark.parametrize(("n", "h", "v", "chunk"), TORCH_SHAPES)
def test_torch_backend_matches_oracle(n: int, h: int, v: int, chunk: int) -> None:
    hidden, weight, targets, grad = make_inputs(n, h, v)
    got = run(fused, hidden, weight, targets, grad, backend="torch", chunk_size=chunk)
    assert_matches_oracle(got, oracle(hidden, weight, targets, grad), **FP32_TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_backend_low_precision_inputs(dtype: torch.dtype) -> None:
    hidden, weight, targets, grad = make_inputs(9, 32, 200, dtype=dtype)
    got = run(fused, hidden, weight, targets, grad, backend="torch", chunk_size=64)
    logp, grad_h, grad_w = oracle(hidden, weight, targets, grad)  # on the same low-precision values
    # The log-probs are computed in fp32 from the rounded inputs, so they match at fp32 accuracy; only the
    # gradients are rounded, when they are returned in the inputs' dtype (bf16 keeps 8 significant bits).
    torch.testing.assert_close(got[0], logp, **FP32_TOL)
    assert_matches_oracle((logp, *got[1:]), (logp, grad_h, grad_w), rtol=1e-2, atol=1e-2)


def test_torch_backend_frozen_head_gives_no_weight_gradient() -> None:
    hidden, weight, targets, grad = make_inputs(4, 8, 30)
    h = hidden.clone().requires_grad_()
    logp = chosen_logprobs(h, weight, targets, backend="torch", chunk_size=7)
    (logp * grad.float()).sum().backward()
    assert weight.grad is None and h.grad is not None
    torch.testing.assert_close(h.grad.double(), oracle(hidden, weight, targets, grad)[1], **FP32_TOL)


def test_large_logits_do_not_overflow() -> None:
    # Logits around ±1e4: exp would overflow without the running max of the online logsumexp.
    hidden, weight, targets, grad = make_inputs(5, 8, 90)
    hidden = hidden * 2000.0
    got = run(fused, hidden, weight, targets, grad, backend="torch", chunk_size=16)
    want = oracle(hidden, weight, targets, grad)
    assert all(bool(torch.isfinite(t).all()) for t in got)
    assert_matches_oracle(got, want, rtol=1e-5, atol=2e-2)  # fp32 ulps at 1e4


def _peak_cpu_bytes(fn: object) -> int:
    """Peak bytes the CPU allocator held above the start while ``fn()`` ran (torch profiler's alloc/free
    records, replayed in time order; tracemalloc does not see torch's allocator)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()  # type: ignore[operator]
    records = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]"
    )
    current = peak = 0
    for _, nbytes in records:
        current += nbytes
        peak = max(peak, current)
    return peak


def test_torch_backend_peak_memory_does_not_scale_with_tokens_times_vocab() -> None:
    n, h, chunk = 256, 8, 512

    def peak(v: int, full: bool) -> int:
        hidden, weight, targets, _ = make_inputs(n, h, v)
        hidden.requires_grad_()
        weight.requires_grad_()

        def step() -> None:
            if full:
                logp = torch.log_softmax(hidden @ weight.T, dim=-1).gather(1, targets[:, None])
            else:
                logp = chosen_logprobs(hidden, weight, targets, backend="torch", chunk_size=chunk)
            logp.sum().backward()

        return _peak_cpu_bytes(step)

    v = 8192
    logits_bytes = n * v * 4  # 8 MiB: one fp32 (N, V) tensor
    assert peak(v, full=True) > logits_bytes  # the measurement sees the unfused logits
    small, large = peak(v, full=False), peak(2 * v, full=False)
    assert small < logits_bytes // 4, small
    # Doubling V adds N·V·4 = 8 MiB to an unfused step; here only the O(V·H) weight gradient grows.
    assert large - small < logits_bytes // 8, (small, large)


@contextmanager
def forced_splits(module: ModuleType, splits: int | None) -> Iterator[None]:
    """Force the number of vocabulary splits of the Triton kernels (1 on CPU by default; None leaves the
    heuristic), to exercise the host-side merge of partial logsumexps and contended atomic adds."""
    if splits is None:
        yield
        return
    original = module._num_splits
    module._num_splits = lambda row_blocks, chunks, device: min(splits, chunks)
    try:
        yield
    finally:
        module._num_splits = original


def gspo_case(
    dtype: torch.dtype = torch.float32,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor, GspoLossConfig]:
    """A micro-batch with padding (holding an out-of-range id), mixed-sign advantages, clipped and unclipped
    sequences and a KL term; returns the loss inputs, hidden, weight, targets and config."""
    b, t, h, v = 3, 5, 16, 90
    hidden, weight, _, _ = make_inputs(b * t, h, v, dtype=dtype, seed=7)
    hidden = hidden.view(b, t, h)
    gen = torch.Generator().manual_seed(8)
    targets = torch.randint(0, v, (b, t), generator=gen)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[0, 3:] = False
    mask[2, 4:] = False
    targets[~mask] = -100  # padding holds ids no vocabulary has: it must never be read
    with torch.no_grad():
        logp = torch.log_softmax(hidden.double() @ weight.double().T, dim=-1)
        logp = logp.gather(2, targets.clamp(min=0)[..., None]).squeeze(2)
    shifts = torch.tensor([[1.5e-3], [-1e-4], [-1.5e-3]], dtype=torch.float64)  # clipped, inside, clipped
    old_logp = torch.where(mask, logp - shifts, torch.nan)  # nan on padding, which must not leak
    ref_logp = logp + 0.05 * torch.randn(b, t, generator=gen, dtype=torch.float64)
    config = GspoLossConfig(eps_low=5e-4, eps_high=5e-4, beta=0.04, kl_ratio_weighted=True)
    inputs = {
        "old_logp": old_logp,
        "advantages": torch.tensor([1.0, -0.5, -1.0], dtype=torch.float64),
        "mask": mask,
        "ref_logp": ref_logp,
    }
    return inputs, hidden, weight, targets, config


def oracle_gspo(
    inputs: dict[str, torch.Tensor],
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    config: GspoLossConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """gspo_loss on fp64 full-log-softmax log-probs, and its gradients w.r.t. hidden and weight."""
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    logp = torch.log_softmax(h @ w.T, dim=-1).gather(2, targets.clamp(min=0)[..., None]).squeeze(2)
    loss, metrics = gspo_loss(logp, config=config, **inputs)
    loss.backward()
    assert h.grad is not None and w.grad is not None
    assert 0.0 < float(metrics["clip_fraction"]) < 1.0  # both branches of the clipped objective are live
    return loss.detach(), metrics, h.grad, w.grad


def check_fused_gspo(
    module: ModuleType, backend: str, chunk: int, splits: int | None = None, device: str = "cpu"
) -> None:
    inputs, hidden, weight, targets, config = gspo_case()
    want_loss, want_metrics, want_h, want_w = oracle_gspo(inputs, hidden, weight, targets, config)
    inputs = {key: value.to(device) for key, value in inputs.items()}
    targets = targets.to(device)
    h = hidden.to(device).clone().requires_grad_()
    w = weight.to(device).clone().requires_grad_()
    with forced_splits(module, splits):
        loss, metrics = module.fused_gspo_loss(
            h, w, targets, config=config, backend=backend, chunk_size=chunk, **inputs
        )
        loss.backward()
    assert h.grad is not None and w.grad is not None
    grad_h, grad_w = h.grad.double().cpu(), w.grad.double().cpu()
    loss = loss.double().cpu()
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
    assert metrics.keys() == want_metrics.keys()
    for key, value in want_metrics.items():
        torch.testing.assert_close(metrics[key].double().cpu(), value.double(), rtol=1e-5, atol=1e-6)
    assert_matches_oracle((loss, grad_h, grad_w), (loss, want_h, want_w), **FP32_TOL)
    assert bool(grad_h[~inputs["mask"].cpu()].eq(0).all())  # padding positions get no gradient


def test_fused_gspo_loss_torch_backend_matches_unfused() -> None:
    check_fused_gspo(fused, "torch", chunk=32)


# ----------------------------------------------------------------------------------- Triton (interpreter)
# Each check takes the fused module to test, whose kernels must run where the tensors are (the interpreter
# on CPU, or CUDA). They run in one TRITON_INTERPRET=1 subprocess (see the module docstring).


def check_triton_matches_oracle(module: ModuleType, n: int, h: int, v: int, chunk: int, splits: int) -> None:
    hidden, weight, targets, grad = make_inputs(n, h, v, seed=n + v)
    with forced_splits(module, splits):
        got = run(module, hidden, weight, targets, grad, backend="triton", chunk_size=chunk)
    assert_matches_oracle(got, oracle(hidden, weight, targets, grad), **FP32_TOL)


def check_triton_bf16_and_frozen_head(module: ModuleType) -> None:
    hidden, weight, targets, grad = make_inputs(6, 32, 120, dtype=torch.bfloat16)
    want = oracle(hidden, weight, targets, grad)
    with forced_splits(module, 2):
        got = run(module, hidden, weight, targets, grad, backend="triton", chunk_size=32)
        torch.testing.assert_close(got[0], want[0], **FP32_TOL)
        assert_matches_oracle(got, want, rtol=1e-2, atol=1e-2)
        # Frozen LM head (LoRA): the kernel skips grad_weight.
        h = hidden.clone().requires_grad_()
        logp = module.chosen_logprobs(h, weight, targets, backend="triton", chunk_size=32)
        (logp * grad.float()).sum().backward()
    assert weight.grad is None and h.grad is not None
    torch.testing.assert_close(h.grad.double(), got[1])


def check_auto_backend_is_triton(module: ModuleType) -> None:
    assert module._resolve_backend("auto", torch.device("cpu")) == "triton"
    hidden, weight, targets, grad = make_inputs(3, 16, 50)
    got = run(module, hidden, weight, targets, grad)  # backend="auto", default chunk
    assert_matches_oracle(got, oracle(hidden, weight, targets, grad), **FP32_TOL)


def check_triton_chunk_must_be_a_power_of_two(module: ModuleType) -> None:
    hidden, weight, targets, _ = make_inputs(2, 8, 10)
    for chunk in (48, 8, 2048):
        try:
            module.chosen_logprobs(hidden, weight, targets, backend="triton", chunk_size=chunk)
        except ValueError as error:
            assert "power of two" in str(error), error
        else:
            raise AssertionError(f"chunk_size={chunk} was accepted")


TRITON_CHECKS: dict[str, Callable[[ModuleType], None]] = {
    "oracle-V-not-a-multiple": partial(check_triton_matches_oracle, n=12, h=32, v=300, chunk=64, splits=1),
    "oracle-3-splits": partial(check_triton_matches_oracle, n=12, h=32, v=300, chunk=64, splits=3),
    "oracle-one-row-chunk-larger-than-V": partial(
        check_triton_matches_oracle, n=1, h=16, v=40, chunk=64, splits=1
    ),
    "oracle-H-not-a-multiple-of-tile": partial(
        check_triton_matches_oracle, n=5, h=20, v=100, chunk=16, splits=4
    ),
    "oracle-two-row-blocks": partial(check_triton_matches_oracle, n=20, h=8, v=64, chunk=32, splits=2),
    "bf16-and-frozen-head": check_triton_bf16_and_frozen_head,
    "auto-backend": check_auto_backend_is_triton,
    "fused-gspo-loss": partial(check_fused_gspo, backend="triton", chunk=32, splits=2),
    "chunk-power-of-two": check_triton_chunk_must_be_a_power_of_two,
}


def run_triton_checks(module: ModuleType) -> dict[str, str]:
    """Every Triton check on ``module``: "ok" or the traceback of its failure, by name."""
    outcomes = {}
    for name, check in TRITON_CHECKS.items():
        try:
            check(module)
            outcomes[name] = "ok"
        except Exception:
            outcomes[name] = traceback.format_exc()
    return outcomes


_SUBPROCESS = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("gspo_fused_checks", sys.argv[1])
tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tests)
assert tests.fused._TRITON_INTERPRETED, "TRITON_INTERPRET=1 did not give interpreted kernels"
print("OUTCOMES " + json.dumps(tests.run_triton_checks(tests.fused)))
"""


@pytest.fixture(scope="module")
def triton_outcomes() -> dict[str, str]:
    """The checks' outcomes from one subprocess started with TRITON_INTERPRET=1 (empty when this process
    already interprets Triton, and the tests call the checks directly)."""
    pytest.importorskip("triton")
    if fused._TRITON_INTERPRETED:
        return {}
    # Set before the subprocess starts: triton.language's own @jit helpers (tl.max, tl.sum...) are decorated
    # when triton is imported, so the flag can't be turned on in a process that has imported triton.
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS, __file__],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("OUTCOMES ")]
    assert done.returncode == 0 and lines, f"interpreter subprocess failed:\n{done.stderr[-4000:]}"
    return json.loads(lines[-1].removeprefix("OUTCOMES "))


@pytest.mark.parametrize("name", list(TRITON_CHECKS))
def test_triton_backend_under_interpreter(name: str, triton_outcomes: dict[str, str]) -> None:
    if fused._TRITON_INTERPRETED:
        TRITON_CHECKS[name](fused)
    else:
        assert triton_outcomes[name] == "ok", triton_outcomes[name]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_backend_on_cuda(dtype: torch.dtype) -> None:
    pytest.importorskip("triton")
    hidden, weight, targets, grad = make_inputs(300, 96, 5000, dtype=dtype)
    want = oracle(hidden, weight, targets, grad)
    cuda = [t.cuda() for t in (hidden, weight, targets, grad)]
    got = tuple(t.cpu() for t in run(fused, *cuda, backend="triton"))
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-4)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    assert_matches_oracle(got, want, rtol=tol, atol=tol)
    check_fused_gspo(fused, "triton", chunk=32, device="cuda")


def test_triton_backend_refused_where_it_cannot_run() -> None:
    if fused.triton_available(torch.device("cpu")):
        pytest.skip("this run interprets Triton kernels on CPU")
    hidden, weight, targets, _ = make_inputs(2, 8, 10)
    assert fused._resolve_backend("auto", torch.device("cpu")) == "torch"
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        chosen_logprobs(hidden, weight, targets, backend="triton")


# ------------------------------------------------------------------------------------------- validation


def bad_chosen_cases() -> list[object]:
    hidden, weight, targets, _ = make_inputs(4, 8, 10)
    return [
        pytest.param(hidden[0], weight, targets, {}, "hidden must have shape", id="hidden-1d"),
        pytest.param(hidden, weight[:, :5], targets, {}, "weight must have shape", id="weight-H"),
        pytest.param(hidden, weight[:0], targets, {}, "V >= 1", id="empty-vocab"),
        pytest.param(hidden.double(), weight, targets, {}, "hidden must be float32", id="hidden-fp64"),
        pytest.param(hidden, weight.int(), targets, {}, "weight must be float32", id="weight-int"),
        pytest.param(hidden, weight, targets[:3], {}, "targets must have shape", id="targets-len"),
        pytest.param(hidden, weight, targets.float(), {}, "integer token ids", id="targets-float"),
        pytest.param(hidden, weight, targets.bool(), {}, "integer token ids", id="targets-bool"),
        pytest.param(hidden, weight, targets.clone().fill_(10), {}, r"\[0, 10\)", id="target-is-V"),
        pytest.param(hidden, weight, targets.clone().fill_(-1), {}, r"\[0, 10\)", id="target-negative"),
        pytest.param(hidden, weight, targets, {"backend": "cuda"}, "backend must be one of", id="backend"),
        pytest.param(hidden, weight, targets, {"chunk_size": 0}, "positive integer", id="chunk-0"),
        pytest.param(hidden, weight, targets, {"chunk_size": True}, "positive integer", id="chunk-bool"),
    ]


@pytest.mark.parametrize(("hidden", "weight", "targets", "kwargs", "message"), bad_chosen_cases())
def test_chosen_logprobs_rejects_bad_inputs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, kwargs: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        chosen_logprobs(hidden, weight, targets, **{"backend": "torch", **kwargs})


def test_empty_batch_gives_empty_logprobs() -> None:
    hidden, weight, _, _ = make_inputs(0, 8, 10)
    hidden.requires_grad_()
    logp = chosen_logprobs(hidden, weight, torch.zeros(0, dtype=torch.long))
    assert logp.shape == (0,)
    logp.sum().backward()
    assert hidden.grad is not None and hidden.grad.shape == (0, 8)


def test_fused_gspo_loss_rejects_bad_inputs() -> None:
    inputs, hidden, weight, targets, config = gspo_case()

    def call(**changes: object) -> None:
        args: dict[str, object] = {"hidden": hidden, "weight": weight, "targets": targets, **inputs}
        fused_gspo_loss(config=config, backend="torch", **{**args, **changes})  # type: ignore[arg-type]

    with pytest.raises(ValueError, match=r"hidden must have shape \(B, T, H\)"):
        call(hidden=hidden[0])
    with pytest.raises(ValueError, match="targets must have shape"):
        call(targets=targets[:, :4])
    with pytest.raises(ValueError, match="mask must have shape"):
        call(mask=inputs["mask"][:2])
    with pytest.raises(ValueError, match="only 0 and 1"):
        call(mask=inputs["mask"].double() * 0.5)
    bad = targets.clone()
    bad[1, 0] = 90  # a masked position: out of range for V = 90
    with pytest.raises(ValueError, match=r"targets at masked positions must lie in \[0, 90\)"):
        call(targets=bad)
    with pytest.raises(ValueError, match="old_logp must have the shape"):  # gspo_loss's own checks still run
        call(old_logp=inputs["old_logp"][:, :4])
