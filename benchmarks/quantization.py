"""Which quantization of the bundled model the llamacpp backend should serve by default, by measurement.

The bundled SmolLM2-135M-Instruct ships as Q4_1. With no network here, every other variant is derived locally
from that file by llama.cpp's own quantizer (llama-cpp-python's `llama_model_quantize`, requantizing), and
kept under the cache directory (quantized/, keyed by the bundled file's sha256 and the llama.cpp version),
so later runs reuse them. Derived variants therefore carry Q4_1's rounding: Q8_0 and F16 cannot recover
what Q4_1 lost (F16 holds the dequantized Q4_1 weights rounded to f16, not bit for bit: a block's d*q+m
can need more bits than f16 has), so their scores tell how much the format itself costs or keeps of
*these* weights, not what a Q8_0 made from the original weights would score. Their speed and memory are
what the formats cost. K-quants need rows of 256 weights; the model's 576-wide rows fall back to other
types, so each file's tensor types are printed.

For each variant, in a child process of its own (its resident memory is its own; a crash stays there),
through the node's llamacpp backend built in process as `./zoo bench inference` figure 5 builds it
(batch 16, 2 threads), greedy, the same prompt:
  single stream: --runs answers of --tokens new tokens, one at a time, after a warm-up;
  16 clients:    16 such requests at once, total new tokens per second (max(1, runs // 2) batches);
  RSS:           the child's resident set once it has served (and its peak).
Variants run in alternating order round by round (--rounds); figures are medians over the rounds, ratios
against the bundled Q4_1 measured in the same run. Then quality: each variant's held-out score on shipped
task families (trainer/tasks/data/families/NAME-test.jsonl, 16 tasks each) as `zoo-node eval` computes it
(its `evaluate`, library none, so the score reflects the weights only), with its 95% interval.

Usage: ./zoo bench quantization [--rounds 3] [--runs 4] [--tokens 32] [--variants Q4_1,Q4_0,Q8_0,F16,...]
                                [--families lengths,habitats]
       ZOO_TEST_ISA=avx2 ./zoo bench quantization ...   (under the AVX2 set on an AVX-512 CPU)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.devnet.process import dies_with_this_process
from zoo.inference.models import bundled_gguf
from zoo.node.config import default_cache_dir

PROMPT = "Explain in two sentences why the sky is blue."
THREADS = 2
CLIENTS = 16
BUNDLED = "Q4_1"
# Variant name -> llama_cpp's ftype constant. Q4_1 is the bundled file itself.
FTYPES = {
    "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "F16": "LLAMA_FTYPE_MOSTLY_F16",
    "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "Q5_K_M": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K",
}
DEFAULT_VARIANTS = "Q4_1,Q4_0,Q8_0,F16,Q4_K_M,Q6_K"
DEFAULT_FAMILIES = "lengths,habitats"
MIB = 1024 * 1024


@dataclass(frozen=True)
class Variant:
    name: str
    path: Path
    sha256: str
    size: int
    types: str  # tensor types in the file, most common first


@dataclass
class Serving:
    single: list[float]  # tok/s, one value per run
    many: list[float]  # tok/s at CLIENTS clients, one per batch
    rss_mb: list[float]
    peak_mb: list[float]


# --- deriving the variants -------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def tensor_types(path: Path) -> str:
    from gguf import GGUFReader

    counts = Counter(t.tensor_type.name for t in GGUFReader(path).tensors)
    return ", ".join(f"{name} x{n}" for name, n in counts.most_common())


def llamacpp_version() -> str:
    from importlib.metadata import version

    return version("llama_cpp_python")


def derived_dir(source_sha: str) -> Path:
    return default_cache_dir() / "quantized" / f"{source_sha[:16]}-llama.cpp-{llamacpp_version()}"


def quantize(name: str, dest: Path) -> None:
    """In this process (a child): requantize the bundled file to `name`, written whole or not at all."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[name])
    params.allow_requantize = True
    params.nthread = THREADS
    partial = dest.with_suffix(".partial")
    rc = llama_cpp.llama_model_quantize(str(bundled_gguf()).encode(), str(partial).encode(), params)
    if rc != 0:
        partial.unlink(missing_ok=True)
        raise SystemExit(f"llama_model_quantize returned {rc}")
    os.replace(partial, dest)


def derive(name: str, dest: Path) -> str | None:
    """Derives `dest` in a child process unless it exists; None on success, else why it could not."""
    if dest.is_file():
        return None
    dest.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    outcome = run_child(["--derive", name, "--dest", str(dest)], timeout_s=600)
    if isinstance(outcome, str):
        return outcome
    print(f"  derived {name} in {time.perf_counter() - started:.1f} s", flush=True)
    return None


def prepare(names: list[str]) -> tuple[list[Variant], dict[str, str]]:
    """The variants that exist or could be derived, and why each other one is skipped."""
    source = bundled_gguf()
    source_sha = sha256_of(source)
    where = derived_dir(source_sha)
    variants: list[Variant] = []
    skipped: dict[str, str] = {}
    for name in names:
        path = source if name == BUNDLED else where / f"{source.stem.rsplit('.', 1)[0]}.{name}.gguf"
        reason = None if name == BUNDLED else derive(name, path)
        if reason is not None:
            skipped[name] = f"llama.cpp could not quantize to it: {reason}"
            continue
        sha = source_sha if name == BUNDLED else sha256_of(path)
        variants.append(Variant(name, path, sha, path.stat().st_size, tensor_types(path)))
    return variants, skipped


# --- child processes -------------------------------------------------------------------------------------


def run_child(args: list[str], timeout_s: float) -> dict[str, Any] | str:
    """Runs this file with `args` in a child that dies with this process; its JSON, or why it failed."""
    try:
        done = subprocess.run(
            [sys.executable, __file__, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            preexec_fn=dies_with_this_process(),
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout_s:.0f} s"
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"exit {done.returncode}: {tail[:200]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def memory_mb() -> tuple[float, float]:
    """(resident, peak resident) of this process, MiB."""
    fields = dict(
        line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


async def timed_batch(backend: Any, size: int, tokens: int) -> float:
    """New tokens per second of `size` identical requests sent at once."""
    from zoo.inference.backend import GenerationRequest, generate

    messages = [{"role": "user", "content": PROMPT}]
    requests = [GenerationRequest(messages, max_tokens=tokens) for _ in range(size)]
    started = time.perf_counter()
    results = await asyncio.gather(*(generate(backend, r) for r in requests))
    return sum(r.completion_tokens for r in results) / (time.perf_counter() - started)


async def serve(path: Path, runs: int, tokens: int) -> dict[str, Any]:
    """Child: the llamacpp backend on `path`, single stream then CLIENTS at once; rates and memory."""
    from zoo.inference.llamacpp.backend import LlamaCppBackend

    backend = LlamaCppBackend.load(path, "local", max_batch_size=CLIENTS, threads=THREADS)
    try:
        await timed_batch(backend, 1, tokens)  # warm: the prompt's cache, first-call costs
        single = [await timed_batch(backend, 1, tokens) for _ in range(runs)]
        await timed_batch(backend, CLIENTS, 4)  # warm: a full batch
        many = [await timed_batch(backend, CLIENTS, tokens) for _ in range(max(1, runs // 2))]
        rss, peak = memory_mb()
    finally:
        await backend.close()
    return {"single": single, "many": many, "rss_mb": rss, "peak_mb": peak}


async def score(path: Path, families: list[str]) -> dict[str, Any]:
    """Child: `zoo-node eval --library none` on each family's test split, with model.path = `path`."""
    from zoo.node.cli.eval import NONE, Configuration, evaluate
    from zoo.node.config import load_config
    from zoo.trainer.tasks.families import path as family_path

    environ = {k: v for k, v in os.environ.items() if k == "ZOO_NODE_CACHE_DIR"}
    with tempfile.TemporaryDirectory() as data_dir:
        overrides = {
            "data_dir": data_dir,
            "model": {"backend": "llamacpp", "path": str(path), "threads": THREADS},
        }
        cfg = load_config(None, environ=environ, overrides=overrides)
        out = {}
        for family in families:
            result = await evaluate(cfg, family_path(family, "test"), [Configuration(NONE, NONE)])
            out[family] = {k: result[k] for k in ("score", "n", "ci95", "wall_s")}
    return out


# --- the measurement -------------------------------------------------------------------------------------


def measure_serving(variants: list[Variant], rounds: int, runs: int, tokens: int) -> dict[str, Serving]:
    results = {v.name: Serving([], [], [], []) for v in variants}
    failed: set[str] = set()
    for r in range(rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for v in (v for v in order if v.name not in failed):
            out = run_child(
                ["--child", v.name, "--path", str(v.path), "--runs", str(runs), "--tokens", str(tokens)],
                timeout_s=600,
            )
            if isinstance(out, str):
                print(f"  round {r + 1}: {v.name} failed to serve ({out}); left out from here on")
                failed.add(v.name)
                continue
            s = results[v.name]
            s.single += out["single"]
            s.many += out["many"]
            s.rss_mb.append(out["rss_mb"])
            s.peak_mb.append(out["peak_mb"])
            print(
                f"  round {r + 1}: {v.name:7s} single {statistics.median(out['single']):6.1f} tok/s, "
                f"{CLIENTS} clients {statistics.median(out['many']):6.1f} tok/s, RSS {out['rss_mb']:.0f} MiB",
                flush=True,
            )
    return {name: s for name, s in results.items() if name not in failed}


def measure_quality(variants: list[Variant], families: list[str]) -> dict[str, dict[str, Any] | str]:
    scores: dict[str, dict[str, Any] | str] = {}
    for v in variants:
        out = run_child(["--eval", v.name, "--path", str(v.path), "--families", ",".join(families)], 1500)
        scores[v.name] = out
        if isinstance(out, str):
            print(f"  {v.name:7s} not scored: {out}", flush=True)
            continue
        for family, s in out.items():
            print(
                f"  {v.name:7s} {family:10s} {interval(s)}  ({s['n']} tasks, {s['wall_s']:.0f} s)", flush=True
            )
    return scores


# --- the report ------------------------------------------------------------------------------------------


def cpuinfo(field: str) -> str:
    """The first processor's `field` in /proc/cpuinfo ("" if absent)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.split(":", 1)[0].strip() == field:
            return line.split(":", 1)[1].strip()
    return ""


def cpu_line() -> str:
    """The CPU, its instruction set (figures differ between AVX2-only and AVX-512), and llama.cpp's own."""
    import llama_cpp

    flags = cpuinfo("flags").split()
    isa = "AVX-512 (avx512f present)" if "avx512f" in flags else "AVX2 only (no avx512f)"
    isa = isa if "avx2" in flags else "no AVX2"
    if os.environ.get("ZOO_TEST_ISA"):
        isa += f"; run under ZOO_TEST_ISA={os.environ['ZOO_TEST_ISA']}"
    info = llama_cpp.llama_print_system_info().decode()
    built = " ".join(f.strip() for f in info.split("|") if "AVX" in f)
    cpu = f"CPU: {cpuinfo('model name')}, {os.cpu_count()} cores; {isa}"
    return f"{cpu}\nllama.cpp {llamacpp_version()}: {built}"


def interval(s: dict[str, Any]) -> str:
    """As `zoo-node eval` prints a score: 0.500 [0.250, 0.750]."""
    return f"{s['score']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]"


def ratio(value: float, base: float | None) -> str:
    return f"{value / base:.2f}x" if base else "-"


def print_files(variants: list[Variant], skipped: dict[str, str]) -> None:
    print(f"\nfiles (the derived ones requantized from the bundled {BUNDLED}, so they carry its rounding):")
    for v in variants:
        origin = "bundled" if v.name == BUNDLED else f"derived from {BUNDLED}"
        print(f"  {v.name:7s} {v.size / MIB:7.1f} MiB  sha256 {v.sha256}  {origin}  {v.path}")
        print(f"          tensor types: {v.types}")
    for name, reason in skipped.items():
        print(f"  {name:7s} skipped: {reason}")
    if any("_K" in v.name for v in variants):
        print(
            "  K-quants take rows of 256 weights: tensors with rows of another length (576 here) fell back "
            "to the types listed beside the K ones"
        )


def print_table(
    variants: list[Variant],
    serving: dict[str, Serving],
    quality: dict[str, dict[str, Any] | str],
    families: list[str],
) -> None:
    base = serving.get(BUNDLED)
    base_single = statistics.median(base.single) if base else None
    base_many = statistics.median(base.many) if base else None
    head = f"{'variant':8s} {'file MiB':>8s} {'sha256':12s} {'single tok/s':>17s} "
    head += f"{f'{CLIENTS} clients tok/s':>26s} {'RSS MiB (peak)':>15s}"
    print(f"\n{head}  " + "  ".join(f"{f + ' score [95%]':>24s}" for f in families))
    for v in variants:
        s = serving.get(v.name)
        cells = f"{v.name:8s} {v.size / MIB:8.1f} {v.sha256[:12]:12s} "
        if s is None:
            cells += f"{'failed':>17s} {'failed':>26s} {'-':>15s}"
        else:
            single, many = statistics.median(s.single), statistics.median(s.many)
            cells += f"{single:7.1f} ({ratio(single, base_single):>6s})  "
            cells += f"{many:7.1f} ({ratio(many, base_many):>6s}, {many / single:5.2f}x own)"
            cells += f" {statistics.median(s.rss_mb):6.0f} ({statistics.median(s.peak_mb):5.0f})"
        q = quality.get(v.name, "not scored")
        scores = [q if isinstance(q, str) else interval(q[f]) for f in families]
        print(cells + "  " + "  ".join(f"{x[:24]:>24s}" for x in scores))
    print(
        f"\nratios in brackets: against {BUNDLED} in this run; 'own': {CLIENTS} clients against the "
        "variant's own single stream. Rates are medians over all rounds' answers and batches; RSS the "
        "median over the rounds' children, once they had served."
    )


# --- entry points ----------------------------------------------------------------------------------------


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="serving rounds, variant order alternating")
    ap.add_argument("--runs", type=int, default=4, help="single-stream answers per variant and round")
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per answer")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"of {BUNDLED},{','.join(FTYPES)}")
    ap.add_argument("--families", default=DEFAULT_FAMILIES, help="shipped task families to score on")
    hidden = argparse.SUPPRESS
    ap.add_argument("--child", help=hidden)
    ap.add_argument("--eval", help=hidden)
    ap.add_argument("--derive", help=hidden)
    ap.add_argument("--dest", type=Path, help=hidden)
    ap.add_argument("--path", type=Path, help=hidden)
    return ap.parse_args()


def variant_names(raw: str) -> list[str]:
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n != BUNDLED and n not in FTYPES]
    if unknown:
        choices = ", ".join([BUNDLED, *FTYPES])
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}: choose from {choices}")
    return names if BUNDLED in names else [BUNDLED, *names]  # the baseline of every ratio


def child(args: argparse.Namespace, families: list[str]) -> dict[str, Any]:
    """What a child process was started for, as JSON for its parent."""
    if args.derive:
        quantize(args.derive, args.dest)
        return {"derived": str(args.dest)}
    if args.child:
        return asyncio.run(serve(args.path, args.runs, args.tokens))
    return asyncio.run(score(args.path, families))


def main() -> None:
    args = parse()
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    if args.derive or args.child or args.eval:
        print(json.dumps(child(args, families)))
        return
    started = time.perf_counter()
    print(cpu_line())
    if policy := os.environ.get("OMP_WAIT_POLICY"):
        print(f"OMP_WAIT_POLICY={policy} (llama.cpp's OpenMP barriers are slower when PASSIVE)")
    variants, skipped = prepare(variant_names(args.variants))
    print_files(variants, skipped)
    print(f"\nserving: {args.rounds} rounds, {args.runs} answers of {args.tokens} tokens, {THREADS} threads")
    serving = measure_serving(variants, args.rounds, args.runs, args.tokens)
    print(f"\nquality: zoo-node eval --library none on {', '.join(f'{f}-test' for f in families)}")
    quality = measure_quality(variants, families)
    print_table(variants, serving, quality, families)
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
