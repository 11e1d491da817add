"""Benchmark the fused GSPO loss (LM head + log-softmax + GSPO, vocabulary chunk by chunk) against the
unfused one: time and peak memory of one forward + backward, from the last hidden states to the gradients
of hidden and of the LM-head weight ("trained" head), and of hidden only ("frozen" head, the LoRA case,
where the fp32 weight gradient no longer dominates the memory); --head picks one, both by default.

Compared, on the same inputs and in the same run:
- unfused: logits = hidden @ Wᵀ, an fp32 log_softmax over the full (tokens × vocab) logits, gather at the
  targets, then gspo_loss (trainer/gspo/loss.py): the textbook path, what the fused loss replaces;
- fused-triton: fused_gspo_loss(backend="triton") (trainer/gspo/fused.py), CUDA only;
- fused-torch: fused_gspo_loss(backend="torch"), the chunked-torch fallback (4096-entry vocabulary chunks).

On CUDA the default shape is SmolLM2-135M's: 8 sequences of 1024 tokens (8192 tokens), H = 576,
V = 49152, bf16 hidden states and weight. Time is the median of --repeats steps after a warm-up step
(CUDA-synchronised wall clock); memory is torch.cuda.max_memory_allocated during a step minus what was
allocated before it (inputs and parameters excluded, their gradients included).

Without CUDA the Triton path cannot run (it needs a GPU; the tests run its kernels in the slow Triton
interpreter, which says nothing about speed), so only fused-torch and unfused are measured, at a smaller
default shape (256 tokens, V = 16384, fp32). CPU time is the median over steps alternated between the two
(wall and process-CPU clocks: the latter is less disturbed by other jobs on the machine); CPU peak memory
is replayed from the torch profiler's allocator records in a separate, untimed step (tracemalloc does not
see torch's allocator). On a machine whose cores are busy with other work, --threads 1 gives steadier
numbers: with several OpenMP threads every small op can wait for a descheduled thread, which penalises the
chunked path (many small ops) far more than the unfused one. Every run also prints how far the fused loss
and gradients are from the unfused ones.

Run: ./zoo bench gspo_fused [--tokens N] [--hidden H] [--vocab V] [--repeats R]
         [--dtype float32|bfloat16] [--head trained|frozen|both] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from zoo.trainer.gspo.fused import chosen_logprobs, fused_gspo_loss, triton_available
from zoo.trainer.gspo.loss import GspoLossConfig, gspo_loss

SEQUENCES = 8
CONFIG = GspoLossConfig(eps_low=3e-4, eps_high=4e-4)


@dataclass
class Inputs:
    hidden: torch.Tensor  # (B, T, H)
    weight: torch.Tensor  # (V, H)
    targets: torch.Tensor  # (B, T)
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor


def make_inputs(tokens: int, hidden: int, vocab: int, dtype: torch.dtype, device: torch.device) -> Inputs:
    """Random hidden states and head (logits of a realistic spread), sampled-looking targets, some padding,
    and old log-probs near the current ones so that some sequence ratios clip and some do not."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    b, t = SEQUENCES, tokens // SEQUENCES
    h = torch.randn(b, t, hidden, generator=gen).to(device, dtype)
    w = (torch.randn(vocab, hidden, generator=gen) / hidden**0.5 * 3).to(device, dtype)
    targets = torch.randint(0, vocab, (b, t), generator=gen).to(device)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[::2, (3 * t) // 4 :] = False  # every other sequence ends early
    mask = mask.to(device)
    with torch.no_grad():
        logp = chosen_logprobs(h[mask], w, targets[mask], backend="torch")
    old = torch.zeros(b, t, device=device).masked_scatter(mask, logp)
    old = old + 1e-3 * torch.randn(b, t, generator=gen).to(device)
    advantages = torch.randn(b, generator=gen).to(device)
    return Inputs(h, w, targets, old, advantages, mask)


def unfused_loss(x: Inputs, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    logits = (hidden @ weight.T).float()  # (B, T, V): the tensor the fused loss never builds
    logp = torch.log_softmax(logits, dim=-1).gather(-1, x.targets[..., None]).squeeze(-1)
    return gspo_loss(logp, x.old_logp, x.advantages, x.mask, CONFIG)[0]


def fused_loss(backend: str) -> Callable[[Inputs, torch.Tensor, torch.Tensor], torch.Tensor]:
    def loss(x: Inputs, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return fused_gspo_loss(
            hidden, weight, x.targets, x.old_logp, x.advantages, x.mask, CONFIG, backend=backend
        )[0]

    return loss


def step(
    loss_fn: Callable[[Inputs, torch.Tensor, torch.Tensor], torch.Tensor], x: Inputs, frozen_head: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One forward + backward; returns the loss and the gradients (leaves are fresh each step)."""
    hidden = x.hidden.detach().requires_grad_()
    weight = x.weight.detach().requires_grad_(not frozen_head)
    loss = loss_fn(x, hidden, weight)
    loss.backward()
    assert hidden.grad is not None
    return loss.detach(), hidden.grad, weight.grad


def cuda_measure(fn: Callable[[], object], repeats: int) -> tuple[float, int]:
    """(median seconds per call, peak bytes allocated above the start) on CUDA, after a warm-up call."""
    fn()  # warm-up: Triton compilation, cuBLAS handles, allocator
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return statistics.median(times), torch.cuda.max_memory_allocated() - base


def cpu_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes held by torch's CPU allocator above the start of ``fn()``, from the profiler's records."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    records = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    current = peak = 0
    for _, nbytes in records:
        current += nbytes
        peak = max(peak, current)
    return peak


def cpu_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """Median (wall, process-CPU) seconds per call of each function, calls alternated in rotating order so
    that drifting machine load hits all alike."""
    for fn in fns.values():
        fn()  # warm-up
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            wall, cpu = time.perf_counter(), time.process_time()
            fns[name]()
            samples[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return {
        name: (statistics.median(s[0] for s in runs), statistics.median(s[1] for s in runs))
        for name, runs in samples.items()
    }


def agreement(x: Inputs, reference: Callable, candidate: Callable, frozen_head: bool) -> str:
    """The max abs difference of the losses, and of each gradient relative to its largest entry."""
    want, got = step(reference, x, frozen_head), step(candidate, x, frozen_head)
    parts = [f"|loss diff| {float((want[0].double() - got[0].double()).abs()):.2e}"]
    for name, a, b in zip(("grad_hidden", "grad_weight"), want[1:], got[1:], strict=True):
        if a is not None and b is not None:
            diff = (a.double() - b.double()).abs().max() / a.double().abs().max().clamp(min=1e-30)
            parts.append(f"{name} max rel diff {float(diff):.2e}")
    return ", ".join(parts)


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"


def describe(args: argparse.Namespace, device: torch.device) -> None:
    grads = "hidden only (frozen head)" if args.frozen_head else "hidden and weight"
    print(
        f"GSPO loss forward + backward, {args.tokens} tokens ({SEQUENCES} x {args.tokens // SEQUENCES}), "
        f"H = {args.hidden}, V = {args.vocab}, {args.dtype}, gradients of {grads}, on {device}"
    )
    full = args.tokens * args.vocab * 4
    print(f"  one fp32 (tokens x vocab) tensor: {mib(full)}")


def run_cuda(args: argparse.Namespace, x: Inputs) -> None:
    device = x.hidden.device
    describe(args, device)
    print(f"  device: {torch.cuda.get_device_name(device)}; median of {args.repeats} steps after a warm-up")
    variants = {"unfused": unfused_loss, "fused-torch": fused_loss("torch")}
    if triton_available(device):
        variants["fused-triton"] = fused_loss("triton")
    else:
        print("  triton is not installed: fused-triton skipped")
    results = {}
    for name, fn in variants.items():
        seconds, peak = cuda_measure(lambda fn=fn: step(fn, x, args.frozen_head), args.repeats)
        results[name] = (seconds, peak)
        print(f"  {name:>12}: {seconds * 1e3:8.2f} ms   peak {mib(peak):>12}")
    base_s, base_m = results["unfused"]
    for name, (seconds, peak) in results.items():
        if name != "unfused":
            print(
                f"  {name} vs unfused: time x{seconds / base_s:.2f}, "
                f"peak memory x{peak / base_m:.3f} ({base_m / peak:.1f}x less)"
            )
    for name, fn in variants.items():
        if name != "unfused":
            print(f"  {name} vs unfused: {agreement(x, unfused_loss, fn, args.frozen_head)}")


def run_cpu(args: argparse.Namespace, x: Inputs) -> None:
    describe(args, x.hidden.device)
    print(
        "  no CUDA device: the Triton path needs a GPU (its kernels only run here in the Triton "
        "interpreter, far too slow to time), so only the chunked-torch fallback is measured"
    )
    print(
        f"  torch threads: {torch.get_num_threads()}; "
        f"median of {args.repeats} alternated steps after a warm-up"
    )
    variants = {"unfused": unfused_loss, "fused-torch": fused_loss("torch")}
    calls = {name: (lambda fn=fn: step(fn, x, args.frozen_head)) for name, fn in variants.items()}
    times = cpu_times(calls, args.repeats)
    peaks = {name: cpu_peak_bytes(call) for name, call in calls.items()}
    for name in variants:
        wall, cpu = times[name]
        print(
            f"  {name:>12}: wall {wall * 1e3:8.1f} ms   CPU {cpu * 1e3:8.1f} ms   peak {mib(peaks[name]):>12}"
        )
    (uw, uc), (fw, fc) = times["unfused"], times["fused-torch"]
    print(
        f"  fused-torch vs unfused: wall time x{fw / uw:.2f}, CPU time x{fc / uc:.2f}, "
        f"peak memory x{peaks['fused-torch'] / peaks['unfused']:.3f} "
        f"({peaks['unfused'] / peaks['fused-torch']:.1f}x less)"
    )
    print(
        f"  fused-torch vs unfused: {agreement(x, unfused_loss, variants['fused-torch'], args.frozen_head)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    parser.add_argument("--tokens", type=int, default=8192 if cuda else 256, help="tokens in the batch (B·T)")
    parser.add_argument("--hidden", type=int, default=576, help="hidden size H")
    parser.add_argument("--vocab", type=int, default=49152 if cuda else 16384, help="vocabulary size V")
    parser.add_argument("--repeats", type=int, default=10 if cuda else 3, help="timed steps per variant")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16" if cuda else "float32")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument(
        "--head", choices=("trained", "frozen", "both"), default="both", help="LM-head weight gradient or not"
    )
    args = parser.parse_args()
    if args.tokens < SEQUENCES or args.tokens % SEQUENCES:
        parser.error(f"--tokens must be a positive multiple of {SEQUENCES}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if cuda else "cpu")
    x = make_inputs(args.tokens, args.hidden, args.vocab, getattr(torch, args.dtype), device)
    for i, head in enumerate(("trained", "frozen") if args.head == "both" else (args.head,)):
        if i:
            print()
        args.frozen_head = head == "frozen"
        (run_cuda if cuda else run_cpu)(args, x)


if __name__ == "__main__":
    main()
