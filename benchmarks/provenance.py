"""Proofs of inference on the llama.cpp backend, or with --backend transformers on the transformers one
(issue 47's goals): what a proof costs, how long its check takes beside generating the answer, how often an
honest answer is refused, and how often a cheat is caught.

Honest answers come from the node's llama.cpp backend serving the bundled Q4_1 (a system turn of 0-3 worked
examples, as a node's prompt carries experiences, then a question of the shipped task families; half greedy,
half sampled at temperature 0.7 / top-p 0.95), each made in one of these conditions (a child process each):

    alone, 2 threads          16 at once, 2 threads          16 at once, 1 thread
    and, where the CPU has AVX-512, the same llama.cpp source built with AVX-512 off (the `./zoo test` AVX2
    pass's wheel and caps): alone, 2 threads and 16 at once, 1 thread.

Every honest proof is then checked by the kernels that made it, as a node checks one (it refuses another
build's): this CPU's build with 2 threads, the AVX2 build with 1 thread; a false rejection is an honest
proof refused. A sample of the AVX-512 proofs is also checked by the AVX2 build, to show what mixing builds
would do (another instruction set's arithmetic moves the states as much as another quantization).

Cheats, each --cases answers, checked by the first verifier against the bundled Q4_1's hash:
  another quantization   answered by Q8_0 (derived from the bundled file by llama.cpp's quantizer, as
                         `./zoo bench quantization` derives it), the proof claiming Q4_1;
  another model          answered by a fine-tune of the bundled model: its F16, every layer's query and
                         value projections moved by a rank-8 update of 2 % of their norm (no other model
                         of this architecture can be had offline; a LoRA fine-tune is the cheat a node
                         would try), the proof claiming Q4_1;
  another prompt         answered with another system turn or another experience set (one worked example
                         dropped, swapped or added), the proof claiming the prompt that was asked for;
  a tampered token       one output token (at a random position, the last included) replaced by another
                         random token, the commitments unchanged;
  another library root   a receipt signed for the answer, then its library root changed (caught by the
                         signature: a proof says nothing of which library a prompt's experiences came from).

With --backend transformers: the bundled Hugging Face weights (bf16 where the CPU has bf16 units, as the
node loads them); the AVX2 conditions run torch with ATEN_CPU_CAPABILITY=avx2 and oneDNN capped at AVX2 (the
`./zoo test` AVX2 pass's settings) in float32, as an AVX2-only CPU loads the model. Its cheats: another
quantization (every linear layer int8, torch's dynamic quantization), another precision (answered in
float32, the proof claiming the bf16 weights' kernels), the fine-tune (the same
rank-8 update of the query and value projections, on the safetensors), another prompt, a tampered token.

Also measured, in one child with alternating rounds: tokens per second with and without proofs (alone and
16 at once), and the bytes of a proof. verify / generate: each alone-answer's check time over its own
generation time (the median).

Usage: ./zoo bench provenance [--backend transformers] [--answers 528] [--cases 100] [--tokens 64]
                               [--native-only]
       ./zoo bench provenance --report RESULTS.json   (a run's figures again, under today's thresholds)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

SYSTEMS = ["", "You are a careful assistant. Answer briefly.", "You are a helpful tutor. Think step by step."]
RANK, RELATIVE = 8, 0.02  # the fine-tune: rank and size (relative Frobenius norm) of each update


# --- prompts ------------------------------------------------------------------------------------------------


def questions() -> list[dict[str, Any]]:
    families = ROOT / "trainer" / "tasks" / "data" / "families"
    out = []
    for path in sorted(families.glob("*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def conversation(i: int, pool: list[dict[str, Any]], examples: list[int] | None = None) -> dict[str, Any]:
    """The i-th prompt: a system turn (one of SYSTEMS, then up to 3 worked examples), a question, and its
    sampling. `examples` overrides which worked examples the system turn carries."""
    rng = random.Random(i)
    task = pool[i % len(pool)]
    system = SYSTEMS[i % len(SYSTEMS)]
    if examples is None:
        examples = rng.sample(range(len(pool)), rng.randrange(4))
    lessons = [
        f"Example: {pool[j]['question']} Answer: {pool[j].get('answer') or 'see the tests'}" for j in examples
    ]
    turns = (
        [{"role": "system", "content": "\n".join([system, *lessons]).strip()}] if system or lessons else []
    )
    sampled = i % 2 == 1
    return {
        "messages": [*turns, {"role": "user", "content": task["question"]}],
        "examples": examples,
        "system": system,
        "temperature": 0.7 if sampled else 0.0,
        "top_p": 0.95 if sampled else 1.0,
        "seed": i,
    }


def another_prompt(i: int, pool: list[dict[str, Any]]) -> dict[str, Any]:
    """What a cheat claims it answered: prompt i with another system turn or another experience set."""
    asked = conversation(i, pool)
    rng = random.Random(10_000 + i)
    examples = list(asked["examples"])
    kind = i % 4
    if kind == 0 or not examples:
        examples.append(rng.randrange(len(pool)))  # one worked example more
    elif kind == 1:
        examples.pop(rng.randrange(len(examples)))  # one fewer
    elif kind == 2:
        examples[rng.randrange(len(examples))] = rng.randrange(len(pool))  # one swapped
    claimed = conversation(i, pool, examples)
    if kind == 3:  # another system turn, the same examples
        other = SYSTEMS[(i + 1) % len(SYSTEMS)] or "Answer as a pirate would."
        claimed["messages"][0]["content"] = claimed["messages"][0]["content"].replace(
            asked["system"], other, 1
        )
        if not asked["system"]:
            claimed["messages"][0]["content"] = other + "\n" + claimed["messages"][0]["content"]
    return claimed


# --- children -----------------------------------------------------------------------------------------------


def child_env(isa: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("ZOO_TEST_ISA", None)
    if isa == "avx2":
        env["ZOO_TEST_ISA"] = "avx2"
    return env


def run_child(isa: str, args: list[str], timeout_s: float = 3600) -> dict[str, Any]:
    """This file with `args` in a child under instruction set `isa` (native, or avx2 through ./zoo)."""
    command = (
        [str(ROOT / "zoo"), "bench", "provenance", *args]
        if isa == "avx2"
        else [sys.executable, __file__, *args]
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=child_env(isa))
    if done.returncode != 0:
        raise SystemExit(f"child {args[:2]} ({isa}) failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def load_backend(spec: dict[str, Any], threads: int) -> Any:
    """The spec's backend serving spec['model'] (a GGUF, or a weights directory for transformers)."""
    if spec.get("backend") == "transformers":
        import torch

        from zoo.inference.transformers_backend import TransformersBackend

        torch.set_num_threads(threads)
        backend = TransformersBackend.load(Path(spec["model"]), "local", dtype=spec.get("dtype", "auto"),
                                           max_batch_size=16)  # fmt: skip
        if spec.get("quantize") == "int8":  # the cheat: every linear layer int8, dynamically quantized
            from torch.ao.quantization import quantize_dynamic

            quantize_dynamic(backend.model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
        return backend
    from zoo.inference.llamacpp.llamacpp_backend import LlamaCppBackend

    return LlamaCppBackend.load(Path(spec["model"]), "local", max_batch_size=16, threads=threads)


async def produce(spec: dict[str, Any]) -> dict[str, Any]:
    """Child: answer prompts with proofs; each proof (claiming spec['claim'] as the weights) and its
    generation time."""
    from zoo.inference.backend_protocol import GenerationRequest, generate
    from zoo.inference.provenance import answer_proof

    pool = questions()
    backend = load_backend(spec, spec["threads"])
    out = []
    try:
        indices = list(range(spec["first"], spec["first"] + spec["n"]))
        await generate(backend, GenerationRequest([{"role": "user", "content": "Hi"}], max_tokens=4))  # warm
        for start in range(0, len(indices), spec["batch"]):
            group = indices[start : start + spec["batch"]]
            prompts = [conversation(i, pool) for i in group]
            requests = [
                GenerationRequest(
                    p["messages"], spec["tokens"], p["temperature"], p["top_p"], p["seed"], proof=True
                )
                for p in prompts
            ]
            t0 = time.perf_counter()
            results = await asyncio.gather(*(generate(backend, r) for r in requests))
            seconds = time.perf_counter() - t0
            for i, p, r in zip(group, prompts, results, strict=True):
                h = r.hidden
                prompt_ids = h.prompt_ids
                if spec.get("claim_prompt"):  # the cheat: another prompt claimed than the one answered
                    prompt_ids = backend._chat_ids(another_prompt(i, pool)["messages"], None)
                proof = answer_proof.make(
                    spec["claim"], prompt_ids, h.output_ids, h.states,
                    temperature=p["temperature"], top_p=p["top_p"],
                )  # fmt: skip
                out.append(
                    {"i": i, "proof": proof.to_json(), "seconds": seconds, "tokens": len(h.output_ids)}
                )
    finally:
        await backend.close()
    return {"answers": out}


async def verify(spec: dict[str, Any]) -> dict[str, Any]:
    """Child: check each proof of a file; per proof its chunks' figures, its worst token and the time."""
    from zoo.inference.provenance import answer_proof

    backend = load_backend(spec, spec["threads"])
    proofs = [json.loads(line) for line in Path(spec["file"]).read_text().splitlines()]
    out = []
    try:
        for entry in proofs:
            proof = answer_proof.parse(json.dumps(entry["proof"]))
            t0 = time.perf_counter()
            states, logits = await backend.recompute(*proof.prefill())
            verdict = answer_proof.verify(proof, states, logits, backend.proof_thresholds)
            seconds = time.perf_counter() - t0
            out.append({
                "key": entry["key"],
                "accepted": verdict.accepted,
                "chunks": [[c.exponent_matches, c.mantissa_mean, c.mantissa_median] for c in verdict.chunks],
                "shortfall": verdict.tokens.shortfall if verdict.tokens else 0.0,
                "rule": verdict.tokens.rule if verdict.tokens else "",
                "limit": verdict.tokens.limit if verdict.tokens else 0.0,
                "seconds": seconds,
            })  # fmt: skip
    finally:
        await backend.close()
    return {"verdicts": out}


async def speed(spec: dict[str, Any]) -> dict[str, Any]:
    """Child: tokens per second with and without proofs, alone and 16 at once, in alternating rounds."""
    from zoo.inference.backend_protocol import GenerationRequest, generate

    pool = questions()
    backend = load_backend(spec, 2)
    rates: dict[str, list[float]] = {f"{m}/{k}": [] for m in ("alone", "batch") for k in ("plain", "proof")}
    try:
        await generate(backend, GenerationRequest([{"role": "user", "content": "Hi"}], max_tokens=4))
        for r in range(spec["rounds"]):
            for mode, size in (("alone", 1), ("batch", 16)):
                order = ("plain", "proof") if r % 2 == 0 else ("proof", "plain")
                for kind in order:
                    # Prompts of their own for each kind (3000+ / 6000+): none reuses the other's cache.
                    first = (3000 if kind == "plain" else 6000) + r * 16
                    prompts = [conversation(first + j, pool)["messages"] for j in range(16)]
                    requests = [GenerationRequest(m, spec["tokens"], proof=kind == "proof") for m in prompts]
                    t0 = time.perf_counter()
                    if size == 1:
                        results = [await generate(backend, q) for q in requests[:8]]
                    else:
                        results = await asyncio.gather(*(generate(backend, q) for q in requests))
                    rates[f"{mode}/{kind}"].append(
                        sum(x.completion_tokens for x in results) / (time.perf_counter() - t0)
                    )
    finally:
        await backend.close()
    return rates


# --- derived models -----------------------------------------------------------------------------------------


def fine_tune(f16: Path, dest: Path) -> None:
    """The F16 model with each layer's attn_q and attn_v moved by a seeded rank-RANK update of RELATIVE of
    its norm, written to `dest` (in place on a copy, through gguf-py's writable reader)."""
    import shutil

    from gguf import GGUFReader

    partial = dest.with_suffix(".partial")
    shutil.copyfile(f16, partial)
    reader = GGUFReader(partial, "r+")
    rng = np.random.default_rng(47)
    for tensor in reader.tensors:
        if tensor.name.endswith(("attn_q.weight", "attn_v.weight")):
            w = tensor.data
            u = rng.standard_normal((w.shape[0], RANK)).astype(np.float32)
            v = rng.standard_normal((RANK, w.shape[1])).astype(np.float32)
            delta = u @ v
            delta *= RELATIVE * np.linalg.norm(w.astype(np.float32)) / np.linalg.norm(delta)
            w[...] = (w.astype(np.float32) + delta).astype(w.dtype)
    del reader
    os.replace(partial, dest)


def fine_tune_weights(source: Path, dest: Path) -> None:
    """The Hugging Face weights with every q_proj and v_proj moved as `fine_tune` moves the GGUF's, in a
    copy of the directory at `dest`."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    generator = torch.Generator().manual_seed(47)
    for file in sorted(partial.glob("*.safetensors")):
        tensors = load_file(file)
        for name, w in tensors.items():
            if name.endswith(("q_proj.weight", "v_proj.weight")):
                u = torch.randn(w.shape[0], RANK, generator=generator)
                v = torch.randn(RANK, w.shape[1], generator=generator)
                delta = u @ v
                delta *= RELATIVE * w.float().norm() / delta.norm()
                tensors[name] = (w.float() + delta).to(w.dtype)
        save_file(tensors, file, metadata={"format": "pt"})
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(partial, dest)


def derived_weights() -> dict[str, Path]:
    """The bundled Hugging Face weights and their fine-tune (made once, in the cache)."""
    from zoo.inference.bundled_models import prepare_bundled_chat_model
    from zoo.node.config import default_cache_dir

    bundled = prepare_bundled_chat_model(default_cache_dir()).path
    tuned = default_cache_dir() / "bench" / f"{bundled.name}.finetune-r{RANK}-{RELATIVE:g}"
    if not tuned.is_dir():
        tuned.parent.mkdir(parents=True, exist_ok=True)
        fine_tune_weights(bundled, tuned)
    return {"bundled": bundled, "finetune": tuned}


def derived_models() -> dict[str, Path]:
    """Q8_0 and the fine-tune, made once and kept beside `./zoo bench quantization`'s variants."""
    import quantization

    variants, skipped = quantization.prepare(["Q4_1", "Q8_0", "F16"])
    if skipped:
        raise SystemExit(f"cannot derive the cheats' models: {skipped}")
    by_name = {v.name: v.path for v in variants}
    tuned = by_name["F16"].with_name(by_name["F16"].stem + f".finetune-r{RANK}-{RELATIVE:g}.gguf")
    if not tuned.is_file():
        fine_tune(by_name["F16"], tuned)
    return {"Q4_1": by_name["Q4_1"], "Q8_0": by_name["Q8_0"], "finetune": tuned}


# --- the run ------------------------------------------------------------------------------------------------


def has_avx2_build() -> bool:
    return "avx512f" in Path("/proc/cpuinfo").read_text()


def write_proofs(path: Path, entries: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))


def tamper(entry: dict[str, Any], rng: random.Random, vocab: int) -> dict[str, Any]:
    proof = dict(entry["proof"])
    ids = list(proof["output_ids"])
    at = rng.randrange(len(ids))
    ids[at] = rng.choice([t for t in (rng.randrange(vocab) for _ in range(3)) if t != ids[at]])
    proof["output_ids"] = ids
    return {**entry, "proof": proof, "at": at}


def accepted(v: dict[str, Any], t: Any) -> bool:
    """The verdict under thresholds `t` (the token check as shipped)."""
    chunks = all(e >= t.min_exponent_matches and m <= t.max_mantissa_mean and d <= t.max_mantissa_median
                 for e, m, d in v["chunks"])  # fmt: skip
    from zoo.inference.provenance.answer_proof import MAX_NUCLEUS_MASS

    limit = min(v["limit"], MAX_NUCLEUS_MASS) if v["rule"] == "nucleus" else v["limit"]  # as shipped now
    return chunks and v["shortfall"] <= limit


def receipt_cases(n: int) -> dict[str, Any]:
    """Receipts: signing and checking cost, and n receipts with another library root, each refused."""
    import coincurve

    from zoo.node.credits.signing import SignatureError
    from zoo.node.provenance import receipts

    key = coincurve.PrivateKey(os.urandom(32))
    node = "0x" + __import__("eth_hash.auto").auto.keccak(key.public_key.format(False)[1:])[-20:].hex()
    refused, sign_s, check_s = 0, [], []
    for i in range(n):
        unsigned = receipts.Receipt(
            node=receipts.to_checksum_address(node), model="0x" + "ab" * 32, adapter=receipts.ZERO32,
            library="0x" + f"{i:064x}", request="0x" + "11" * 32, prompt="0x" + "22" * 32,
            output="0x" + "33" * 32, prompt_tokens=100, completion_tokens=64, timestamp=1_800_000_000 + i,
            client=receipts.ZERO_ADDRESS, proof="0x" + "44" * 32,
        )  # fmt: skip
        t0 = time.perf_counter()
        signed = receipts.sign(unsigned, key.secret)
        t1 = time.perf_counter()
        receipts.check(signed)
        check_s.append(time.perf_counter() - t1)
        sign_s.append(t1 - t0)
        altered = receipts.Receipt(**{**signed.to_json(), "library": "0x" + f"{i + 1:064x}"})
        try:
            receipts.check(altered)
        except SignatureError:
            refused += 1
    return {"refused": refused, "n": n, "sign_ms": statistics.median(sign_s) * 1e3,
            "check_ms": statistics.median(check_s) * 1e3}  # fmt: skip


def main(args: argparse.Namespace) -> None:
    from zoo.inference.bundled_models import bundled_gguf
    from zoo.inference.provenance.toploc import PAPER, SAME_KERNELS
    from zoo.inference.provenance.weights import WeightHashes

    started = time.perf_counter()
    transformers = args.backend == "transformers"
    if transformers:
        models = derived_weights()
        bundled = models["bundled"]
        vocab = int(json.loads((bundled / "config.json").read_text())["vocab_size"])
        cheat_runs = [("another quantization (int8)", bundled, {"dtype": "float32", "quantize": "int8"}),
                      ("another precision (float32)", bundled, {"dtype": "float32"}),
                      ("another model (a fine-tune)", models["finetune"], {}),
                      ("another prompt", bundled, {"claim_prompt": True})]  # fmt: skip
    else:
        from zoo.inference.llamacpp.gguf import GgufModel

        models = derived_models()
        bundled = bundled_gguf()
        vocab = GgufModel(bundled).n_vocab
        cheat_runs = [("another quantization (Q8_0)", models["Q8_0"], {}),
                      ("another model (a fine-tune)", models["finetune"], {}),
                      ("another prompt", bundled, {"claim_prompt": True})]  # fmt: skip
    base = {"backend": args.backend}
    dtype = {"avx2": {"dtype": "float32"} if transformers else {}, "native": {}}  # an AVX2-only CPU's dtype
    claim = WeightHashes(Path(tempfile.mkdtemp()) / "h.json").of(bundled)
    isas = ["native", "avx2"] if has_avx2_build() and not args.native_only else ["native"]
    n = args.answers
    producers = [
        ("native", 2, 1, n * 3 // 24),
        ("native", 2, 16, n * 8 // 24),
        ("native", 1, 16, n * 5 // 24),
    ]
    if "avx2" in isas:
        producers += [("avx2", 2, 1, n * 2 // 24), ("avx2", 1, 16, n * 6 // 24)]
    else:
        producers[1] = ("native", 2, 16, n * 16 // 24)
    work = Path(tempfile.mkdtemp(prefix="zoo-provenance-"))
    honest: list[dict[str, Any]] = []
    first = 0
    for isa, threads, batch, count in producers:
        label = f"{isa} {threads}t {'alone' if batch == 1 else f'{batch} at once'}"
        print(f"producing {count} honest answers: {label}", flush=True)
        spec = {"model": str(bundled), "threads": threads, "batch": batch, "n": count, "first": first,
                "tokens": args.tokens, "claim": claim, **base, **dtype[isa]}  # fmt: skip
        got = run_child(isa, ["--child", "produce", json.dumps(spec)])["answers"]
        honest += [{**a, "key": f"honest|{label}|{a['i']}", "producer": label, "batch": batch} for a in got]
        first += count
    cheats: dict[str, list[dict[str, Any]]] = {}
    for name, model, extra in cheat_runs:
        print(f"producing {args.cases} answers: {name}", flush=True)
        spec = {"model": str(model), "threads": 2, "batch": 16, "n": args.cases, "first": 5000,
                "tokens": args.tokens, "claim": claim, **base, **extra}  # fmt: skip
        got = run_child("native", ["--child", "produce", json.dumps(spec)])["answers"]
        cheats[name] = [{**a, "key": f"{name}|{a['i']}"} for a in got]
    rng = random.Random(47)
    cheats["a tampered token"] = [
        {**tamper(e, rng, vocab), "key": f"tampered|{k}"}
        for k, e in enumerate(rng.sample(honest, args.cases))
    ]
    # Each proof checked by the kernels that made it (a node refuses to check another build's: answer_proof),
    # with another thread count where the producer's was 1; and, to show why, a sample across builds.
    verdicts: dict[str, dict[str, Any]] = {}
    cross: dict[str, dict[str, Any]] = {}
    checks = [("native", 2, [a for a in honest if a["producer"].startswith("native")], verdicts)]
    if "avx2" in isas:
        checks.append(("avx2", 1, [a for a in honest if a["producer"].startswith("avx2")], verdicts))
        sample = [a for a in honest if a["producer"].startswith("native")][:: max(1, n // 120)]
        checks.append(("avx2", 1, sample, cross))
    for isa, threads, entries, into in checks:
        label = "across builds" if into is cross else "its own build"
        print(f"verifying {len(entries)} honest proofs ({label}): {isa}, {threads} threads", flush=True)
        path = work / f"honest-{isa}-{len(into)}.jsonl"
        write_proofs(path, entries)
        spec = {"model": str(bundled), "threads": threads, "file": str(path), **base, **dtype[isa]}
        for v in run_child(isa, ["--child", "verify", json.dumps(spec)])["verdicts"]:
            into[f"{v['key']}|{isa}{threads}"] = v
    write_proofs(work / "cheats.jsonl", [e for group in cheats.values() for e in group])
    print(f"verifying {sum(len(g) for g in cheats.values())} cheats: native, 2 threads", flush=True)
    spec = {"model": str(bundled), "threads": 2, "file": str(work / "cheats.jsonl"), **base}
    cheat_verdicts = {
        v["key"]: v for v in run_child("native", ["--child", "verify", json.dumps(spec)])["verdicts"]
    }
    print("tokens per second with and without proofs", flush=True)
    spec = {"model": str(bundled), "rounds": args.rounds, "tokens": args.tokens, **base}
    rates = run_child("native", ["--child", "speed", json.dumps(spec)])
    receipts = receipt_cases(args.cases)
    raw = {"honest": honest, "verdicts": verdicts, "cross": cross, "cheats": cheats,
           "cheat_verdicts": cheat_verdicts, "rates": rates, "receipts": receipts}  # fmt: skip
    (work / "results.json").write_text(json.dumps(raw))
    report(**raw, shipped=SAME_KERNELS, paper=PAPER)
    print(f"\n(whole run {time.perf_counter() - started:.0f} s; proofs kept in {work})")


def report(
    honest: list[dict[str, Any]],
    verdicts: dict[str, dict[str, Any]],
    cross: dict[str, dict[str, Any]],
    cheats: dict[str, list[dict[str, Any]]],
    cheat_verdicts: dict[str, dict[str, Any]],
    rates: dict[str, list[float]],
    receipts: dict[str, Any],
    shipped: Any,
    paper: Any,
) -> None:
    from zoo.inference.provenance.toploc import CHUNK_BYTES, CHUNK_TOKENS

    per_chunk = [
        len(json.dumps(a["proof"], separators=(",", ":"))) * CHUNK_TOKENS / a["tokens"] for a in honest
    ]
    print(
        f"\nproof bytes per {CHUNK_TOKENS} tokens: commitments {CHUNK_BYTES} (TOPLOC's: 258); the whole JSON"
    )
    print(
        f"  proof {statistics.median(per_chunk):.0f} (median; it also carries the prompt's and output's ids)"
    )
    alone = [a for a in honest if a["batch"] == 1 and a["producer"].startswith("native")]
    ratios = [verdicts[f"{a['key']}|native2"]["seconds"] / a["seconds"] for a in alone]
    length = statistics.median(a["tokens"] for a in alone)
    print(f"verify / generate (alone, native, 2 threads; {len(ratios)} answers, median {length:.0f} tokens):")
    print(f"  median {statistics.median(ratios):.2f}, max {max(ratios):.2f} (target <= 0.1)")
    for mode in ("alone", "batch"):
        plain, proof = statistics.median(rates[f"{mode}/plain"]), statistics.median(rates[f"{mode}/proof"])
        cost = plain / proof
        print(f"tokens/s {mode:5}: {plain:.1f} without proofs, {proof:.1f} with: {cost:.3f}x (goal <= 1.10)")
    print("\nhonest answers (false rejections; goal 0):")
    for name, t in (("shipped", shipped), ("paper's", paper)):
        bad = [k for k, v in verdicts.items() if not accepted(v, t)]
        print(f"  {name} thresholds {t}: {len(bad)} of {len(verdicts)} checks refused")
        for k in bad[:5]:
            print(f"    {k}: {verdicts[k]['chunks']} {verdicts[k]['rule']} {verdicts[k]['shortfall']:.3f}")
    if cross:
        bad = [k for k, v in cross.items() if not accepted(v, shipped)]
        chunks = [c for v in cross.values() for c in v["chunks"]]
        print(f"  across builds (not done by a node; {len(cross)} AVX-512 proofs checked by the AVX2 build):"
              f" {len(bad)} refused; exponents min {min(c[0] for c in chunks)}, mantissa mean max "
              f"{max(c[1] for c in chunks):.2f}")  # fmt: skip
    groups: dict[str, list[dict[str, Any]]] = {}
    for k, v in verdicts.items():
        groups.setdefault(k.split("|")[1] + " -> " + k.split("|")[-1], []).append(v)
    for label, vs in groups.items():
        chunks = [c for v in vs for c in v["chunks"]]
        margins = {rule: max((v["shortfall"] - v["limit"] for v in vs if v["rule"] == rule), default=None)
                   for rule in ("greedy", "nucleus")}  # fmt: skip
        print(f"  {label:34} n={len(vs):3}: exponents min {min(c[0] for c in chunks)}, mantissa mean max "
              f"{max(c[1] for c in chunks):.2f}, median max {max(c[2] for c in chunks):.1f}")  # fmt: skip
        print(f"  {'':34}        closest token to its limit: {margins}")
    print("\ncheats (detection; goal 100 %):")
    for name, entries in cheats.items():
        vs = [cheat_verdicts[e["key"]] for e in entries]
        caught = sum(not accepted(v, shipped) for v in vs)
        by_paper = sum(not accepted(v, paper) for v in vs)
        chunks = [c for v in vs for c in v["chunks"]]
        print(
            f"  {name:28} caught {caught}/{len(vs)} ({100 * caught / len(vs):.1f} %; paper's: {by_paper});"
            f" exponents max {max(c[0] for c in chunks)}, mantissa mean min {min(c[1] for c in chunks):.2f}"
        )
    refused = f"{receipts['refused']}/{receipts['n']}"
    print(f"  {'another library root':28} caught {refused} (by the receipt's signature)")
    print(f"\nreceipts: sign {receipts['sign_ms']:.3f} ms, check {receipts['check_ms']:.3f} ms (median)")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--answers", type=int, default=528, help="honest answers in all (at least 500 for the goal)"
    )
    ap.add_argument("--cases", type=int, default=100, help="answers of each cheat")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens an answer has at most")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of the speed figure")
    ap.add_argument("--native-only", action="store_true", help="skip the AVX2 build where there is AVX-512")
    ap.add_argument("--backend", choices=["llamacpp", "transformers"], default="llamacpp", help="what proves")
    ap.add_argument("--report", metavar="RESULTS", help="print the figures of a run's results.json again")
    ap.add_argument("--child", choices=["produce", "verify", "speed"], help=argparse.SUPPRESS)
    ap.add_argument("spec", nargs="?", help=argparse.SUPPRESS)
    return ap.parse_args()


if __name__ == "__main__":
    arguments = parse()
    if arguments.report:  # the figures again from a run's results.json, under the thresholds shipped now
        from zoo.inference.provenance.toploc import PAPER, SAME_KERNELS

        report(**json.loads(Path(arguments.report).read_text()), shipped=SAME_KERNELS, paper=PAPER)
    elif arguments.child:
        role = {"produce": produce, "verify": verify, "speed": speed}[arguments.child]
        print(json.dumps(asyncio.run(role(json.loads(arguments.spec)))))
    else:
        main(arguments)
