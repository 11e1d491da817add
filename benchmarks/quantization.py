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
against the bundled Q4_1 measured in the same run.

Then quality, three measures per variant, each child process on its own again:
  score, no library: the held-out score on shipped task families (trainer/tasks/data/families/NAME-test.jsonl,
      16 tasks each) as `zoo-node eval --library none` computes it (its `evaluate`), with its 95% interval.
      The weights alone; but this model scores at the floor there (0.000-0.062 for every variant), so the
      column cannot tell variants apart.
  score, library: the same, as a node serves, with the family's lookup library (trainer/baselines.py: every
      labelled task of NAME-train.jsonl as a worked example) as `zoo-node eval --library FILE` takes it.
      With it the model scores well above the floor, so what a variant loses can show. --quality picks
      library, none or both (the default).
  agreement: how closely a variant's next-token distribution follows the bundled Q4_1's (the weights every
      variant is derived from) and F16's (the highest precision available: Q4_1's weights, barely rounded;
      when F16 is among the variants). Q4_1 answers the test questions of the families (chat-formatted as
      the backend formats them, no library) greedily, up to 32 tokens; every variant is then fed the same
      prompt and answer tokens (teacher-forced, llama-cpp-python's Llama with logits_all) and gives its
      log-probabilities over the whole vocabulary at each answer position. Reported: the mean
      KL(reference || variant) in nats per token, the top-1 agreement (share of positions whose most likely
      token is the reference's) and the largest change of the log-probability of the answer's own token.
      No sampling and no verifier: sensitive where 16 tasks of scores are not, and 0 for a variant that
      changes nothing.

Usage: ./zoo bench quantization [--rounds 3] [--runs 4] [--tokens 32] [--variants Q4_1,Q4_0,Q8_0,F16,...]
                                [--families lengths,habitats] [--quality both|library|none] [--tasks N]
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

import numpy as np

from zoo.devnet.process import dies_with_this_process
from zoo.inference.bundled_models import BUNDLED_CHAT_MODEL_ID, bundled_gguf
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
# --quality -> the `zoo-node eval` libraries scored, in that order: "library" (the family's lookup library)
# and "none".
QUALITY_MODES = {"both": ["library", "none"], "library": ["library"], "none": ["none"]}
REFERENCES = (BUNDLED, "F16")  # what agreement is measured against (F16 when among the variants)
ANSWER_TOKENS = 32  # of the reference's greedy answers, fed to every variant
CHUNK = 64  # rows of log-probabilities compared at once


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


@dataclass(frozen=True)
class Agreement:
    kl: float  # mean KL(reference || variant), nats per token
    top1: float  # share of positions where both put the same token first
    max_delta: float  # largest |change| of the log-probability of the token fed next
    positions: int


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
    from zoo.inference.backend_protocol import GenerationRequest, generate

    messages = [{"role": "user", "content": PROMPT}]
    requests = [GenerationRequest(messages, max_tokens=tokens) for _ in range(size)]
    started = time.perf_counter()
    results = await asyncio.gather(*(generate(backend, r) for r in requests))
    return sum(r.completion_tokens for r in results) / (time.perf_counter() - started)


async def serve(path: Path, runs: int, tokens: int) -> dict[str, Any]:
    """Child: the llamacpp backend on `path`, single stream then CLIENTS at once; rates and memory."""
    from zoo.inference.llamacpp.llamacpp_backend import LlamaCppBackend

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


def held_out(family: str, tasks: int) -> list[Any]:
    """The family's test split, its first `tasks` only when `tasks` > 0."""
    from zoo.trainer.tasks.families import path as family_path
    from zoo.trainer.tasks.loading import load_jsonl

    return load_jsonl(family_path(family, "test"))[: tasks or None]


def held_out_file(family: str, tasks: int, where: Path) -> Path:
    """The family's test split as a file: the shipped one, or its first `tasks` written under `where`."""
    from zoo.trainer.tasks.families import path as family_path
    from zoo.trainer.tasks.schema import write_jsonl

    if tasks <= 0:
        return family_path(family, "test")
    path = where / f"{family}-test-{tasks}.jsonl"
    write_jsonl(path, held_out(family, tasks))
    return path


def lookup_library_file(family: str, where: Path) -> Path:
    """The family's lookup library (its train split's labelled tasks as worked examples), as a file."""
    from zoo.registry.canonical import encode_library
    from zoo.trainer.baselines import lookup_library
    from zoo.trainer.tasks.families import path as family_path
    from zoo.trainer.tasks.loading import load_jsonl

    library = lookup_library(load_jsonl(family_path(family, "train")), BUNDLED_CHAT_MODEL_ID)
    path = where / f"{family}-lookup.json"
    path.write_bytes(encode_library(library))
    return path


async def score(path: Path, families: list[str], modes: list[str], tasks: int) -> dict[str, Any]:
    """Child: `zoo-node eval` on each family's test split with model.path = `path`, once per mode of `modes`:
    "library" (`--library FILE`, the family's lookup library) and "none" (`--library none`)."""
    from zoo.node.cli.eval import NONE, Configuration, evaluate
    from zoo.node.config_loading import load_config

    environ = {k: v for k, v in os.environ.items() if k == "ZOO_NODE_CACHE_DIR"}
    with tempfile.TemporaryDirectory() as data_dir:
        where = Path(data_dir)
        overrides = {
            "data_dir": data_dir,
            "model": {"backend": "llamacpp", "path": str(path), "threads": THREADS},
        }
        cfg = load_config(None, environ=environ, overrides=overrides)
        out = {}
        for family in families:
            libraries = [str(lookup_library_file(family, where)) if m == "library" else NONE for m in modes]
            configurations = [Configuration(library, NONE) for library in libraries]
            result = await evaluate(cfg, held_out_file(family, tasks, where), configurations)
            runs = [result, result.get("compare")][: len(modes)]  # a summary per configuration, in order
            keep = ("score", "n", "ci95", "wall_s", "experiences")
            out[family] = {m: {k: r[k] for k in keep} for m, r in zip(modes, runs, strict=True)}
    return out


# --- agreement: log-probabilities over the vocabulary, teacher-forced -----------------------------------


def logits_model(path: Path, n_ctx: int) -> Any:
    """llama-cpp-python's Llama on `path` keeping the logits of every position it evaluates."""
    from llama_cpp import Llama

    return Llama(
        model_path=str(path),
        n_ctx=n_ctx,
        n_batch=min(n_ctx, 512),
        n_threads=THREADS,
        n_threads_batch=THREADS,
        logits_all=True,
        verbose=False,
    )


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Per row, in float64, returned as float32."""
    x = logits.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    return x.astype(np.float32)


def greedy_answer(llm: Any, prompt: list[int], stop: set[int]) -> list[int]:
    """Up to ANSWER_TOKENS most likely tokens after `prompt`, the stop token included when one comes."""
    llm.reset()
    llm.eval(prompt)
    answer: list[int] = []
    while len(answer) < ANSWER_TOKENS:
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        answer.append(token)
        if token in stop:
            break
        llm.eval([token])
    return answer


def reference_sequences(path: Path, conversations: list[list[dict[str, str]]]) -> dict[str, Any]:
    """Child: each conversation's prompt tokens as the llamacpp backend formats it (the GGUF's chat
    template, GgufModel.encode_chat), and `path`'s greedy answer to it."""
    from zoo.inference.llamacpp.gguf import GgufModel

    gguf = GgufModel(path)
    try:
        prompts = [gguf.encode_chat(messages) for messages in conversations]
        stop = set(gguf.eos_ids)
    finally:
        gguf.close()
    llm = logits_model(path, max(map(len, prompts)) + ANSWER_TOKENS)
    return {"prompts": prompts, "answers": [greedy_answer(llm, p, stop) for p in prompts]}


def teacher_forced(path: Path, sequences: dict[str, Any], dest: Path) -> dict[str, Any]:
    """Child: `path`'s log-probabilities over the vocabulary at each answer position of `sequences`
    (prompt and answer fed as they are, whatever `path` would have said), one row per answer token, in
    order, saved to `dest` (.npy)."""
    pairs = list(zip(sequences["prompts"], sequences["answers"], strict=True))
    llm = logits_model(path, max(len(p) + len(a) for p, a in pairs))
    started = time.perf_counter()
    rows = []
    for prompt, answer in pairs:
        llm.reset()
        llm.eval(prompt + answer[:-1])  # the last answer token is predicted, never fed
        rows.append(log_softmax(llm.scores[len(prompt) - 1 : len(prompt) + len(answer) - 1]))
    table = np.concatenate(rows)
    np.save(dest, table)
    return {"positions": len(table), "wall_s": time.perf_counter() - started}


def compare(reference: Path, variant: Path, fed: np.ndarray) -> Agreement:
    """How closely `variant`'s log-probabilities (.npy, a row per position) follow `reference`'s."""
    ref, var = np.load(reference, mmap_mode="r"), np.load(variant, mmap_mode="r")
    kl, same, max_delta = 0.0, 0, 0.0
    for start in range(0, len(ref), CHUNK):
        p = np.asarray(ref[start : start + CHUNK], dtype=np.float64)
        q = np.asarray(var[start : start + CHUNK], dtype=np.float64)
        kl += float((np.exp(p) * (p - q)).sum())
        same += int((p.argmax(axis=1) == q.argmax(axis=1)).sum())
        rows, tokens = np.arange(len(p)), fed[start : start + len(p)]
        max_delta = max(max_delta, float(np.abs(p[rows, tokens] - q[rows, tokens]).max()))
    return Agreement(kl / len(ref), same / len(ref), max_delta, len(ref))


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


def measure_quality(
    variants: list[Variant], families: list[str], quality: str, tasks: int
) -> dict[str, dict[str, Any] | str]:
    """Per variant: {family: {mode: eval summary}}, or why it could not be scored."""
    scores: dict[str, dict[str, Any] | str] = {}
    for v in variants:
        args = ["--eval", v.name, "--path", str(v.path), "--families", ",".join(families)]
        out = run_child([*args, "--quality", quality, "--tasks", str(tasks)], 3000)
        scores[v.name] = out
        if isinstance(out, str):
            print(f"  {v.name:7s} not scored: {out}", flush=True)
            continue
        for family, by_mode in out.items():
            for mode, s in by_mode.items():
                print(
                    f"  {v.name:7s} {family:10s} library {mode:7s} {interval(s)}  ({s['n']} tasks, "
                    f"{s['experiences']:.1f} experiences in the prompt, {s['wall_s']:.0f} s)",
                    flush=True,
                )
    return scores


def agreement_prompts(families: list[str], tasks: int) -> list[list[dict[str, str]]]:
    """The test questions of `families` as the node asks them without a library."""
    from zoo.trainer.prompting import bare_messages

    return [bare_messages(t) for family in families for t in held_out(family, tasks)]


def measure_agreement(
    variants: list[Variant], families: list[str], tasks: int, work: Path
) -> dict[str, dict[str, Agreement] | str]:
    """Per variant: its Agreement with each reference among `variants`, or why it has none. The bundled
    variant's greedy answers are fed to every variant; the references' log-probabilities are kept in `work`
    until all are compared, every other variant's only until it is."""
    conversations = work / "conversations.json"
    conversations.write_text(json.dumps(agreement_prompts(families, tasks)))
    bundled = next(v for v in variants if v.name == BUNDLED)
    sequences = run_child(
        ["--greedy", BUNDLED, "--path", str(bundled.path), "--conversations", str(conversations)], 900
    )
    if isinstance(sequences, str):
        print(f"  no reference answers: {sequences}", flush=True)
        return {v.name: f"no reference answers ({sequences})" for v in variants}
    tokens = work / "sequences.json"
    tokens.write_text(json.dumps(sequences))
    fed = np.array([t for answer in sequences["answers"] for t in answer], dtype=np.int64)
    print(
        f"  {len(sequences['prompts'])} prompts, {len(fed)} answer tokens of {BUNDLED}'s greedy answers",
        flush=True,
    )

    references = [v for v in variants if v.name in REFERENCES]
    files: dict[str, Path] = {}
    result: dict[str, dict[str, Agreement] | str] = {}
    for v in references + [v for v in variants if v.name not in REFERENCES]:
        dest = work / f"{v.name}.npy"
        out = run_child(
            ["--agree", v.name, "--path", str(v.path), "--sequences", str(tokens), "--dest", str(dest)], 900
        )
        if isinstance(out, str):
            print(f"  {v.name:7s} no log-probabilities: {out}", flush=True)
            result[v.name] = f"failed: {out}"
            continue
        files[v.name] = dest
        print(f"  {v.name:7s} {out['positions']} positions in {out['wall_s']:.1f} s", flush=True)
        if v.name not in REFERENCES:
            result[v.name] = {r: compare(files[r], dest, fed) for r in REFERENCES if r in files}
            dest.unlink()
    for name in (r for r in REFERENCES if r in files):
        result[name] = {
            r: compare(files[r], files[name], fed) for r in REFERENCES if r in files and r != name
        }
    return result


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


def print_serving(variants: list[Variant], serving: dict[str, Serving]) -> None:
    base = serving.get(BUNDLED)
    base_single = statistics.median(base.single) if base else None
    base_many = statistics.median(base.many) if base else None
    head = f"{'variant':8s} {'file MiB':>8s} {'sha256':12s} {'single tok/s':>17s} "
    head += f"{f'{CLIENTS} clients tok/s':>26s} {'RSS MiB (peak)':>15s}"
    print(f"\n{head}")
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
        print(cells)
    print(
        f"\nratios in brackets: against {BUNDLED} in this run; 'own': {CLIENTS} clients against the "
        "variant's own single stream. Rates are medians over all rounds' answers and batches; RSS the "
        "median over the rounds' children, once they had served."
    )


def agreement_cells(a: dict[str, Agreement] | str | None, reference: str, name: str) -> list[str]:
    """KL, top-1 and max |dlogp| of a variant against `reference`."""
    if name == reference:
        return ["(ref)", "", ""]
    if isinstance(a, str) or a is None or reference not in a:
        return ["-", "-", "-"]
    r = a[reference]
    return [f"{r.kl:.5f}", f"{r.top1:.3f}", f"{r.max_delta:.3f}"]


def score_cell(q: dict[str, Any] | str | None, family: str, mode: str) -> str:
    if not isinstance(q, dict):
        return (q or "not scored")[:22]
    return interval(q[family][mode])


def print_quality(
    variants: list[Variant],
    quality: dict[str, dict[str, Any] | str],
    agreement: dict[str, dict[str, Agreement] | str],
    families: list[str],
    modes: list[str],
) -> None:
    references = [r for r in REFERENCES if any(v.name == r for v in variants)]
    head = [f"{label} {r}" for r in references for label in ("KL", "top-1", "max|dlogp|")]
    scores = [(f, m) for f in families for m in modes]
    head += [f"{f}, {'library' if m == 'library' else 'no library'}" for f, m in scores]
    widths = [max(len(h), 7 if i < 3 * len(references) else 22) for i, h in enumerate(head)]
    print(f"\n{'variant':8s}  " + "  ".join(f"{h:>{w}s}" for h, w in zip(head, widths, strict=True)))
    for v in variants:
        cells = [c for r in references for c in agreement_cells(agreement.get(v.name), r, v.name)]
        cells += [score_cell(quality.get(v.name), f, m) for f, m in scores]
        print(f"{v.name:8s}  " + "  ".join(f"{c:>{w}s}" for c, w in zip(cells, widths, strict=True)))
    positions = next((r.positions for a in agreement.values() if isinstance(a, dict) for r in a.values()), 0)
    print(
        f"\nKL: mean KL(reference || variant), nats per token, over {positions} answer positions "
        f"({BUNDLED}'s greedy answers to the test questions, fed to every variant);\n"
        "top-1: share of positions where both rank the same token first; max|dlogp|: the largest change of "
        "the fed token's log-probability.\nScores: `zoo-node eval` on each family's test split, score "
        "[95% interval], with its lookup library and without a library."
    )


# --- entry points ----------------------------------------------------------------------------------------


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="serving rounds, variant order alternating")
    ap.add_argument("--runs", type=int, default=4, help="single-stream answers per variant and round")
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per answer")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"of {BUNDLED},{','.join(FTYPES)}")
    ap.add_argument("--families", default=DEFAULT_FAMILIES, help="shipped task families to score on")
    ap.add_argument(
        "--quality",
        choices=list(QUALITY_MODES),
        default="both",
        help="score with the lookup library, none, both",
    )
    ap.add_argument("--tasks", type=int, default=0, help="the first N test tasks per family (0: all)")
    hidden = argparse.SUPPRESS
    ap.add_argument("--child", help=hidden)
    ap.add_argument("--eval", help=hidden)
    ap.add_argument("--derive", help=hidden)
    ap.add_argument("--greedy", help=hidden)
    ap.add_argument("--agree", help=hidden)
    ap.add_argument("--conversations", type=Path, help=hidden)
    ap.add_argument("--sequences", type=Path, help=hidden)
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
    if args.greedy:
        return reference_sequences(args.path, json.loads(args.conversations.read_text()))
    if args.agree:
        return teacher_forced(args.path, json.loads(args.sequences.read_text()), args.dest)
    return asyncio.run(score(args.path, families, QUALITY_MODES[args.quality], args.tasks))


def main() -> None:
    args = parse()
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    if args.derive or args.child or args.eval or args.greedy or args.agree:
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
    modes = QUALITY_MODES[args.quality]
    split = ", ".join(f"{f}-test" + (f" (first {args.tasks})" if args.tasks > 0 else "") for f in families)
    libraries = " and ".join("the family's lookup library" if m == "library" else "none" for m in modes)
    print(f"\nquality: zoo-node eval on {split}, library {libraries}")
    quality = measure_quality(variants, families, args.quality, args.tasks)
    print(f"\nagreement with {' and '.join(r for r in REFERENCES if any(v.name == r for v in variants))}:")
    with tempfile.TemporaryDirectory(prefix="zoo-quantization-") as work:
        agreement = measure_agreement(variants, families, args.tasks, Path(work))
    print_serving(variants, serving)
    print_quality(variants, quality, agreement, families, modes)
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
