"""`zoo-node train sft|rft|distill` and `zoo-node eval` as an operator runs them: real subprocesses on the
bundled model. An adapter trained from the CLI is scored through the node's own backend and prompt path,
a lookup library is compared with none (the paired difference agrees with the two scores), rft shows its
rollouts before its steps (and `job watch`'s view a job's), and bad input (missing files, an adapter for
another model, an endpoint that is down) exits 2 with the reason."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from tests.conftest import base_config, write_config
from tests.devnet import zoo
from zoo.node.cli.job import ProgressView
from zoo.registry.canonical import encode_library
from zoo.trainer.baselines import lookup_library
from zoo.trainer.tasks import families
from zoo.trainer.tasks.loading import load_jsonl
from zoo.trainer.tasks.schema import Task, write_jsonl

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def lengths(tmp_path: Path, split: str, start: int, n: int) -> Path:
    path = tmp_path / f"{split}-{start}-{n}.jsonl"
    write_jsonl(path, load_jsonl(families.path("lengths", split))[start : start + n])
    return path


def test_an_sft_adapter_is_scored_through_the_node_and_compared_with_a_library(tmp_path: Path) -> None:
    config = write_config(tmp_path / "node.toml", base_config(tmp_path / "data"))
    train, test = lengths(tmp_path, "train", 6, 8), lengths(tmp_path, "test", 0, 6)
    trained = zoo("train", "sft", "--dataset", str(train), "--validation-fraction", "0", "--epochs", "3",
                  "--learning-rate", "1e-3", "--out", str(tmp_path / "sft"), "--config", str(config),
                  timeout=300)  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "completed" in trained.stderr and "step 6:" in trained.stderr, trained.stderr[-2000:]
    again = zoo(
        "train", "sft", "--dataset", str(train), "--out", str(tmp_path / "sft"), "--config", str(config)
    )
    assert again.returncode == 2 and "holds a run already" in again.stderr, again.stderr

    adapter = str(tmp_path / "sft" / "adapter")
    compared = zoo("eval", "--dataset", str(test), "--library", "none", "--compare-adapter", adapter,
                   "--json", "--config", str(config), timeout=300)  # fmt: skip
    assert compared.returncode == 0, compared.stderr[-3000:]
    result = json.loads(compared.stdout)
    assert result["n"] == 6 and result["score"] <= 1 / 6, result
    assert result["compare"]["score"] >= 4 / 6 and result["compare"]["configuration"]["adapter"] == adapter
    d = result["difference"]
    assert d["difference"] == result["compare"]["score"] - result["score"]
    assert d["ci95"][0] > 0 and d["better"] >= 4 and d["n"] == 6
    lo, hi = result["compare"]["ci95"]
    assert lo <= result["compare"]["score"] <= hi
    assert set(result["by_domain"]) == {"conventions.lengths"}


def test_rft_shows_its_rollouts_before_its_steps(tmp_path: Path) -> None:
    config = write_config(tmp_path / "node.toml", base_config(tmp_path / "data"))
    tasks = [Task(id=f"s{a}", question=f"What is {a} + {a}?", answer=str(2 * a), domain="math")
             for a in (1, 2, 3, 4)]  # fmt: skip
    write_jsonl(tmp_path / "train.jsonl", tasks)
    trained = zoo("train", "rft", "--dataset", str(tmp_path / "train.jsonl"), "--validation-fraction", "0",
                  "--samples", "4", "--max-new-tokens", "48", "--epochs", "1", "--out", str(tmp_path / "rft"),
                  "--config", str(config), timeout=300)  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    stats = json.loads((tmp_path / "rft" / "report.json").read_text())["rollouts"]
    line = (f"rollouts: 4 tasks, 16 completions sampled, {stats['passed']} passed the verifier, "
            f"{stats['kept']} kept as pairs, ")  # fmt: skip
    assert line in trained.stderr, trained.stderr[-2000:]
    assert trained.stderr.index(line) < trained.stderr.index("step 1:")


def test_job_watch_shows_a_supervised_jobs_rollouts_and_steps() -> None:
    """The daemon's "collect" events as `job watch` gets them (numbers as floats, from a protobuf Struct)."""
    console = Console(file=io.StringIO(), width=200)
    with ProgressView(console) as view:
        view.handle("collect", {"done": 0.0, "total": 9.0, "sampled": 0.0, "passed": 0.0, "kept": 0.0,
                                "wall_s": 0.0, "end": False})  # fmt: skip
        view.handle("collect", {"done": 8.0, "total": 9.0, "sampled": 32.0, "passed": 5.0, "kept": 4.0,
                                "wall_s": 61.5, "end": False})  # fmt: skip
        bar = view.progress.tasks[view.rollouts]
        assert (bar.completed, bar.total, bar.description) == (8, 9, "rollouts: 32 sampled, 5 passed")
        view.handle("collect", {"done": 9.0, "total": 9.0, "sampled": 36.0, "passed": 6.0, "kept": 5.0,
                                "wall_s": 70.25, "end": True})  # fmt: skip
        view.handle("step_completed", {"epoch": 1.0, "step": 1.0, "steps_total": 3.0, "pairs": 4.0,
                                       "loss": 0.6931, "grad_norm": 0.97, "wall_s": 3.5})  # fmt: skip
        steps = view.progress.tasks[view.steps]
        assert (steps.completed, steps.total) == (1, 3)
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert (
        "rollouts: 9 tasks, 36 completions sampled, 6 passed the verifier, 5 kept as pairs, 70.25 s" in shown
    )
    # Its steps as a supervised run's lines, not a TF-GRPO step's (whose fields it has none of).
    assert "step 1: loss 0.693, grad norm 0.970, 4 pairs, 3.5 s" in shown, shown


def test_a_tf_grpo_step_shows_its_decision() -> None:
    """The step's keep/revert decision is printed as text ("[keep]" was swallowed as a style tag)."""
    console = Console(file=io.StringIO(), width=300)
    with ProgressView(console) as view:
        step = {"step": 1.0, "reward_mean": 0.2, "groups": 4.0, "validation_score": 0.25, "decision": "keep"}
        view.handle("step_completed", step)
    assert "validation 0.250 [keep]" in console.file.getvalue()  # type: ignore[attr-defined]


def test_a_library_is_scored_against_none_with_a_table(tmp_path: Path) -> None:
    config = write_config(tmp_path / "node.toml", base_config(tmp_path / "data"))
    library = tmp_path / "lookup.json"
    library.write_bytes(encode_library(lookup_library(load_jsonl(families.path("lengths", "train")), MODEL)))
    test = lengths(tmp_path, "test", 0, 4)
    shown = zoo("eval", "--dataset", str(test), "--library", str(library), "--compare-library", "none",
                "--config", str(config), timeout=300)  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "conventions.lengths" in shown.stdout and "B - A:" in shown.stdout and "paired" in shown.stdout
    assert "24 experiences" in shown.stdout, shown.stdout
    # Prompt tokens grow with the library in the prompt (the cost a distilled adapter saves).
    assert "prompt tokens" in shown.stderr and "experiences in the prompt" in shown.stderr


def test_a_family_outside_the_library_is_answered_as_without_it(tmp_path: Path) -> None:
    """The relevance gate: habitat questions get none of a lengths library's examples, so the library
    cannot change their answers; lengths questions get theirs."""
    config = write_config(tmp_path / "node.toml", base_config(tmp_path / "data"))
    library = tmp_path / "lookup.json"
    library.write_bytes(encode_library(lookup_library(load_jsonl(families.path("lengths", "train")), MODEL)))
    outside = tmp_path / "habitats.jsonl"
    write_jsonl(outside, load_jsonl(families.path("habitats", "test"))[:4])
    done = zoo("eval", "--dataset", str(outside), "--library", str(library), "--compare-library", "none",
               "--json", "--max-tokens", "16", "--config", str(config), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["experiences"] == 0 and result["prompt_tokens"] == result["compare"]["prompt_tokens"]
    assert result["difference"]["better"] == result["difference"]["worse"] == 0
    inside = zoo("eval", "--dataset", str(lengths(tmp_path, "test", 0, 2)), "--library", str(library),
                 "--json", "--max-tokens", "16", "--config", str(config), timeout=300)  # fmt: skip
    assert inside.returncode == 0 and json.loads(inside.stdout)["experiences"] == 5, inside.stderr[-2000:]


def test_bad_input_exits_2_with_the_reason(tmp_path: Path) -> None:
    config = write_config(tmp_path / "node.toml", base_config(tmp_path / "data"))
    test = lengths(tmp_path, "test", 0, 2)

    def run(*extra: str) -> tuple[int, str]:
        done = zoo("eval", "--config", str(config), *extra, timeout=200)
        return done.returncode, done.stderr

    code, why = run("--dataset", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "no such file" in why, why
    (tmp_path / "bad.jsonl").write_text('{"question": 5}\n')
    code, why = run("--dataset", str(tmp_path / "bad.jsonl"))
    assert code == 2 and "question" in why, why
    (tmp_path / "lib.json").write_text("{not json")
    code, why = run("--dataset", str(test), "--library", str(tmp_path / "lib.json"))
    assert code == 2 and "not a library file" in why, why
    code, why = run("--dataset", str(test), "--adapter", str(tmp_path))
    assert code == 2 and "not a LoRA adapter directory" in why, why
    other = tmp_path / "other"
    other.mkdir()
    (other / "adapter_config.json").write_text("{}")
    (other / "adapter_model.safetensors").write_bytes(b"")
    (other / "zoo_adapter.json").write_text(json.dumps({"base_model": "someone/else-7B"}))
    code, why = run("--dataset", str(test), "--library", "none", "--adapter", str(other))
    assert code == 2 and "trained on someone/else-7B" in why, why
    code, why = run("--dataset", str(test), "--library", "none", "--base-url", "http://127.0.0.1:9/v1",
                    "--model", "m")  # fmt: skip
    assert code == 2 and "did not answer" in why, why
    code, why = run("--dataset", str(test), "--base-url", "http://127.0.0.1:9/v1")
    assert code == 2 and "go together" in why, why
