"""Supervised LoRA (trainer/sft): the pairs each kind trains on, the token labels, and real runs on the
bundled model: SFT learns its tasks, RFT keeps only what the verifier passes, distillation makes an
adapter that answers as the library made the model answer with no library in the prompt, and two
processes train the adapter of one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.trainer.gspo.test_run import adapter_weights, assert_same_training
from zoo.inference.adapters import PROVENANCE_FILE
from zoo.inference.bundled_models import prepare_bundled_chat_model
from zoo.inference.defaults import ServingDefaults
from zoo.inference.embedder import SentenceTransformerEmbedder
from zoo.node.config import default_cache_dir
from zoo.registry.canonical import encode_library
from zoo.registry.errors import ValidationError
from zoo.registry.experience import Experience
from zoo.registry.merkle import library_root
from zoo.trainer.baselines import lookup_library
from zoo.trainer.lora.policy import LoraPolicy
from zoo.trainer.lora.processes import Processes
from zoo.trainer.rewards import get_reward, score_group
from zoo.trainer.sft import collect
from zoo.trainer.sft.job import make_pairs, run_sft
from zoo.trainer.sft.pairs import PAIRS_FILE, example_pairs, read_pairs, task_pairs
from zoo.trainer.sft.spec import SftSpec
from zoo.trainer.sft.train import IGNORE, SftRun, encode
from zoo.trainer.tasks import families
from zoo.trainer.tasks.loading import load_jsonl
from zoo.trainer.tasks.schema import VERIFIER_INSTRUCTIONS, Task, write_jsonl

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def model_path() -> Path:
    torch.set_num_threads(2)
    return prepare_bundled_chat_model(default_cache_dir()).path


def habitats(n: int) -> list[Task]:
    return load_jsonl(families.path("habitats", "train"))[:n]


def test_pairs_answer_as_a_worked_example_and_skip_what_has_no_answer() -> None:
    tasks = [Task(id="a", question="A rope is 2 m long.", answer="200", reasoning="2 m = 2 × 100 = 200 cm."),
             Task(id="b", question="Open question?")]  # fmt: skip
    pairs = task_pairs(tasks)
    assert [p.id for p in pairs] == ["a"]
    assert pairs[0].completion == "2 m = 2 × 100 = 200 cm.\nAnswer: 200"
    assert [m["role"] for m in pairs[0].messages] == ["system", "user"]
    assert pairs[0].messages[1]["content"] == "A rope is 2 m long."
    lib = lookup_library(tasks, MODEL)
    examples = example_pairs(lib.experiences)
    assert [p.completion for p in examples] == [pairs[0].completion] and examples[0].source == "example"


def test_a_code_example_is_learned_as_its_code_under_the_code_instruction() -> None:
    code = "```python\ndef triple(x):\n    return x * 3\n```"
    e = Experience.create(text="Write a Python function `triple(x)`.", domain="code.functions",
                          kind="example", answer=code, confidence=0.5, author="job:t",
                          base_model=MODEL)  # fmt: skip
    (pair,) = example_pairs([e])
    assert pair.completion == code
    assert pair.messages[0]["content"] == VERIFIER_INSTRUCTIONS["unit_tests"]


def test_only_the_completion_and_its_end_of_turn_are_learned(model_path: Path) -> None:
    policy = LoraPolicy.load(model_path, SftSpec())
    pair = task_pairs([Task(id="a", question="Under which label is the otter filed?", answer="WET")])[0]
    e = encode(policy.tokenizer, pair, 1024)
    tok = policy.tokenizer
    assert tok.decode(e.ids[e.prompt_length :]) == "Answer: WET<|im_end|>"
    assert tok.decode(e.ids[: e.prompt_length]).endswith("<|im_start|>assistant\n")
    run = SftRun(SftSpec(), policy, [pair], [])
    _, mask, labels = run._micro_batch([e, encode(tok, task_pairs(habitats(1))[0], 1024)])
    assert (labels[0, : e.prompt_length] == IGNORE).all() and (labels[0, e.prompt_length :] != IGNORE).all()
    assert int(mask[0].sum()) == len(e.ids) and (labels[mask == 0] == IGNORE).all()
    with pytest.raises(ValidationError, match="max_length"):
        encode(tok, pair, 16)


def lengths(split: str, n: int, tmp_path: Path) -> Path:
    """n tasks of a lengths split (training ones from the 7th on: both forms, "3 m" and "3 m 5 cm")."""
    path = tmp_path / f"lengths-{split}.jsonl"
    start = 6 if split == "train" else 0
    write_jsonl(path, load_jsonl(families.path("lengths", split))[start : start + n])
    return path


def test_sft_learns_the_convention_of_its_tasks(model_path: Path, tmp_path: Path) -> None:
    """Eight length tasks (recorded in centimetres): held-out ones go from wrong to right with no
    experience in the prompt; the loss falls and the outputs say what was trained."""
    spec = SftSpec.parse({"dataset": str(lengths("train", 8, tmp_path)),
                          "validation": str(lengths("validation", 4, tmp_path)), "epochs": 3,
                          "learning_rate": 1e-3, "validation_max_tokens": 40})  # fmt: skip
    result = run_sft(spec, model_path, tmp_path / "out", model_id=MODEL)
    assert result["baseline_validation_score"] <= 0.25 and result["validation_score"] >= 0.75, result
    report = json.loads(Path(result["report"]).read_text())
    losses = [p["loss"] for p in report["curve"]]
    assert len(losses) == 12 and losses[-1] < losses[0] / 3, losses
    assert report["pairs"] == {"task": 8} and report["kind"] == "sft"
    pairs = read_pairs(tmp_path / "out" / PAIRS_FILE)
    assert sorted(p.id for p in pairs) == sorted(t.id for t in load_jsonl(lengths("train", 8, tmp_path)))
    provenance = json.loads((tmp_path / "out" / "adapter" / PROVENANCE_FILE).read_text())
    assert (
        provenance["kind"] == "sft" and provenance["base_model"] == MODEL and "library_root" not in provenance
    )


def test_rft_keeps_only_what_the_verifier_passes(model_path: Path, tmp_path: Path) -> None:
    tasks = [Task(id=f"s{a}{b}", question=f"What is {a} + {b}?", answer=str(a + b), domain="math")
             for a, b in [(2, 3), (4, 4), (10, 5), (7, 1)]]  # fmt: skip
    write_jsonl(tmp_path / "train.jsonl", tasks)
    spec = SftSpec.parse({"kind": "rft", "dataset": str(tmp_path / "train.jsonl"), "validation_fraction": 0,
                          "samples": 4, "max_new_tokens": 48, "epochs": 1})  # fmt: skip
    result = run_sft(spec, model_path, tmp_path / "out", model_id=MODEL)
    report = json.loads(Path(result["report"]).read_text())
    stats = report["rollouts"]
    assert stats["sampled"] == 16 and 0 < stats["kept"] <= stats["passed"] < 16, stats
    pairs = read_pairs(tmp_path / "out" / PAIRS_FILE)
    by_id = {t.id: t for t in tasks}
    exact = get_reward("exact_match")
    for p in pairs:  # every kept completion passes its task's verifier, re-scored here
        assert p.source == "rollout" and score_group(exact, by_id[p.id], [p.completion])[0].score == 1.0
    assert len(pairs) == stats["kept"] and report["pairs"] == {"rollout": len(pairs)}


def test_rollouts_report_their_progress_chunk_by_chunk(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An rft collection of five tasks in chunks of two: told before the first chunk, after each (counts
    only growing) and once more at the end with what the run's stats say."""
    monkeypatch.setattr(collect, "TASKS_PER_GENERATE", 2)
    tasks = [
        Task(id=f"s{a}", question=f"What is {a} + 1?", answer=str(a + 1), domain="math") for a in range(5)
    ]
    spec = SftSpec.parse({"kind": "rft", "samples": 2, "max_new_tokens": 16})
    points: list[dict] = []
    policy = LoraPolicy.load(model_path, spec)
    pairs, made = make_pairs(spec, policy, tasks, library=None, embedder=None, serving=ServingDefaults(),
                             processes=Processes(), on_collect=points.append)  # fmt: skip
    assert [(p["done"], p["total"], p["sampled"], p["end"]) for p in points] == [
        (0, 5, 0, False), (2, 5, 4, False), (4, 5, 8, False), (5, 5, 10, False), (5, 5, 10, True)
    ]  # fmt: skip
    for key in ("passed", "kept", "wall_s"):
        assert [p[key] for p in points] == sorted(p[key] for p in points), points
    stats = made["rollouts"]
    assert points[-1]["passed"] == stats["passed"] and points[-1]["kept"] == stats["kept"] == len(pairs)


def test_distill_answers_as_the_library_did_without_it(model_path: Path, tmp_path: Path) -> None:
    """A library of eight worked length examples distilled with its rollouts on eight other tasks (asked with
    the library in the prompt, learned without it): the adapter answers held-out tasks with no experience in
    the prompt, and names the library it came from."""
    library = lookup_library(load_jsonl(lengths("train", 8, tmp_path)), MODEL)
    (tmp_path / "lib.json").write_bytes(encode_library(library))
    # The dataset: the examples' own questions (answered by the library already: no rollout there) and
    # eight others.
    others = load_jsonl(families.path("lengths", "train"))[14:22]
    write_jsonl(tmp_path / "data.jsonl", load_jsonl(tmp_path / "lengths-train.jsonl") + others)
    spec = SftSpec.parse({"kind": "distill", "experiences": str(tmp_path / "lib.json"), "epochs": 4,
                          "learning_rate": 1e-3, "samples": 4, "max_new_tokens": 32,
                          "dataset": str(tmp_path / "data.jsonl"),
                          "validation": str(lengths("validation", 8, tmp_path)),
                          "validation_max_tokens": 32})  # fmt: skip
    result = run_sft(spec, model_path, tmp_path / "out", model_id=MODEL,
                     embedder=SentenceTransformerEmbedder())  # fmt: skip
    root = "0x" + library_root(library).hex()
    assert result["library_root"] == root
    provenance = json.loads((tmp_path / "out" / "adapter" / PROVENANCE_FILE).read_text())
    assert provenance["kind"] == "distill" and provenance["library_root"] == root
    report = json.loads(Path(result["report"]).read_text())
    assert report["pairs"]["example"] == 8 and report["pairs"].get("rollout", 0) >= 3, report["pairs"]
    assert report["rollouts"]["tasks"] == 8  # the eight others: an example's own question has its answer
    other_ids = {t.id for t in others}
    for p in read_pairs(tmp_path / "out" / PAIRS_FILE):  # learned without the library in the prompt
        assert len(p.messages) == 2 and "Worked examples" not in p.messages[0]["content"]
        assert p.source == "example" or p.id in other_ids, p
    # Eight held-out tasks: none right before, most after (0.5 and 1.0 seen over library and data changes).
    assert result["baseline_validation_score"] <= 0.125 and result["validation_score"] >= 0.5, result


def test_a_library_with_nothing_to_distil_is_refused(model_path: Path, tmp_path: Path) -> None:
    (tmp_path / "empty.json").write_bytes(encode_library(lookup_library([], MODEL)))
    spec = SftSpec.parse({"kind": "distill", "experiences": str(tmp_path / "empty.json"), "rollouts": False})
    with pytest.raises(ValidationError, match="nothing to distil"):
        run_sft(spec, model_path, tmp_path / "out", model_id=MODEL)
    assert not (tmp_path / "out").exists()
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValidationError, match=r"spec\.experiences"):
        run_sft(spec.model_copy(update={"experiences": str(tmp_path / "bad.json")}), model_path,
                tmp_path / "out", model_id=MODEL)  # fmt: skip


# A hang guard, not a speed bound: the ZeRO test takes 137 s alone on a Zen 3, and beside the other
# worker's training on two cores a CI run took it past 300 s.
@pytest.mark.timeout(900)
@pytest.mark.numerics
def test_two_processes_train_the_adapter_of_one(model_path: Path, tmp_path: Path) -> None:
    from zoo.trainer.lora.launch import launch_command, launch_env
    from zoo.trainer.sft import worker

    write_jsonl(tmp_path / "train.jsonl", habitats(4))
    spec = SftSpec.parse({"dataset": str(tmp_path / "train.jsonl"), "validation_fraction": 0, "epochs": 2,
                          "batch_size": 4, "micro_batch_size": 1, "learning_rate": 1e-3})  # fmt: skip
    one = run_sft(spec, model_path, tmp_path / "one", model_id=MODEL)
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_json()))
    command = launch_command(tmp_path / "spec.json", model_path, tmp_path / "two", 2, "cpu",
                             worker=worker.__name__, job_args=("--model-id", MODEL))  # fmt: skip
    done = subprocess.run(command, env=launch_env(2), capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [line["step"]["step"] for line in lines if "step" in line] == [1, 2]
    two = lines[-1]["result"]
    curve_one = json.loads(Path(one["report"]).read_text())["curve"]
    curve_two = json.loads(Path(two["report"]).read_text())["curve"]
    assert [p["loss"] for p in curve_two] == pytest.approx([p["loss"] for p in curve_one], rel=1e-4)
    assert json.loads(Path(two["report"]).read_text())["processes"] == 2
    torch.manual_seed(spec.seed)
    LoraPolicy.load(model_path, spec).save_adapter(tmp_path / "initial")
    initial = adapter_weights(tmp_path / "initial")
    assert_same_training(
        adapter_weights(Path(one["adapter"])), adapter_weights(Path(two["adapter"])), initial
    )


# A hang guard, not a speed bound: the ZeRO test takes 137 s alone on a Zen 3, and beside the other
# worker's training on two cores a CI run took it past 300 s.
@pytest.mark.timeout(900)
@pytest.mark.numerics
def test_zero2_over_two_processes_trains_the_adapter_of_one(model_path: Path, tmp_path: Path) -> None:
    """--deepspeed zero2: 3 pairs a step over 2 processes in micro-batches of 1, so one process runs a
    zero-weight padding backward each step (ZeRO-2 reduces on every backward); the adapter is a single
    process's."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is a dev dependency: ./zoo installs it")
    from zoo.trainer.lora.launch import launch_command, launch_env
    from zoo.trainer.lora.zero import SHIPPED
    from zoo.trainer.sft import worker

    write_jsonl(tmp_path / "train.jsonl", habitats(3))
    spec = SftSpec.parse({"dataset": str(tmp_path / "train.jsonl"), "validation_fraction": 0, "epochs": 2,
                          "batch_size": 3, "micro_batch_size": 1, "learning_rate": 1e-3})  # fmt: skip
    one = run_sft(spec, model_path, tmp_path / "one", model_id=MODEL)
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_json()))
    command = launch_command(tmp_path / "spec.json", model_path, tmp_path / "two", 2, "cpu",
                             worker=worker.__name__, deepspeed=SHIPPED,
                             job_args=("--model-id", MODEL))  # fmt: skip
    done = subprocess.run(command, env=launch_env(2), capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    two = lines[-1]["result"]
    curve_one = json.loads(Path(one["report"]).read_text())["curve"]
    curve_two = json.loads(Path(two["report"]).read_text())["curve"]
    assert [p["loss"] for p in curve_two] == pytest.approx([p["loss"] for p in curve_one], rel=1e-4)
    torch.manual_seed(spec.seed)
    LoraPolicy.load(model_path, spec).save_adapter(tmp_path / "initial")
    initial = adapter_weights(tmp_path / "initial")
    assert_same_training(
        adapter_weights(Path(one["adapter"])), adapter_weights(Path(two["adapter"])), initial
    )
