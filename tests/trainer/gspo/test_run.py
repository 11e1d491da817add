"""GSPO runs on the bundled model: the policy gradient moves the right way, runs are reproducible, a run
resumes from its checkpoint to the adapters it would have reached anyway, and bad specs are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import tests.trainer.gspo_rewards  # noqa: F401  (registers test_parity)
from zoo.inference.bundled_models import prepare_bundled_chat_model
from zoo.node.config import default_cache_dir
from zoo.registry.errors import ValidationError
from zoo.trainer.gspo.fused import chosen_logprobs
from zoo.trainer.gspo.job import run_gspo
from zoo.trainer.gspo.run import CHECKPOINTS, GspoRun
from zoo.trainer.gspo.spec import GspoSpec
from zoo.trainer.lora.policy import LoraPolicy
from zoo.trainer.lora.rollouts import generate
from zoo.trainer.tasks.schema import Task, write_jsonl


@pytest.fixture(scope="module")
def model_path() -> Path:
    torch.set_num_threads(2)
    return prepare_bundled_chat_model(default_cache_dir()).path


def tasks_file(tmp_path: Path, n: int, name: str, start: int = 0) -> Path:
    tasks = [Task(id=f"t{i}", question=f"Name an animal that starts with the letter {'abcdefgh'[i]}.",
                  answer="x") for i in range(start, start + n)]  # fmt: skip
    write_jsonl(tmp_path / name, tasks)
    return tmp_path / name


def small_spec(tmp_path: Path, **changes: object) -> GspoSpec:
    return GspoSpec.parse({
        "dataset": str(tasks_file(tmp_path, 2, "train.jsonl")),
        "validation": str(tasks_file(tmp_path, 1, "val.jsonl", 4)),
        "reward": "test_parity", "batch_size": 1, "group_size": 3, "max_new_tokens": 6,
        "learning_rate": 1e-3, "target_modules": ["q_proj", "v_proj"], "micro_batch_size": 4,
        "lora_rank": 4, **changes,
    })  # fmt: skip


def adapter_weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "adapter_model.safetensors"))


def initial_adapter(spec: GspoSpec, model_path: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """The adapters a run of `spec` starts from (run_gspo seeds them the same way)."""
    torch.manual_seed(spec.seed)
    LoraPolicy.load(model_path, spec).save_adapter(tmp_path / "initial")
    return adapter_weights(tmp_path / "initial")


# Two runs that train on the same rollouts but sum gradients in another order (another process split,
# other micro-batches, another reduction) cannot be compared element by element: Adam divides each
# update by sqrt(v) + eps, so an element whose gradient is near zero moves by up to about the learning
# rate either way on a rounding difference, and where the rounding falls depends on the CPU's kernels
# (a fresh clone on an Intel machine ended 2.06e-5 apart on one element, where the old check allowed 1e-5).
# Measured here (AMD EPYC, Zen 4) on one-process runs of the ZeRO test's spec (3 prompts x G 2, lr 1e-3,
# 2 steps of 2 passes), against micro-batches of 2 rows (‖update‖ = 0.844):
#   same training, another summation order   largest element apart   ‖θa - θb‖ / ‖θa - θ0‖
#     micro-batches of 6 rows                   1.5e-6                   3.3e-6
#     micro-batches of 3 rows                   7.3e-5                   1.8e-4
#     micro-batches of 1 row                    2.2e-3 (2.2 lr)          3.7e-3
#   defects
#     one micro-batch's gradient lost a pass    2.6e-3                   0.67
#     Adam's moments lost between the steps     2.6e-3                   0.46
# The largest element cannot tell a reordering from a defect; the distance relative to the update can,
# by two orders of magnitude. The bound sits 8x above the worst reordering and 15x below the mildest
# defect. (Script of the measurement: the closing note of issue 33.)
SAME_TRAINING_TOLERANCE = 0.03


def assert_same_training(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]
) -> float:
    """Adapters `a` and `b`, both trained from `initial`, are the same training up to summation order
    (see SAME_TRAINING_TOLERANCE); returns their distance relative to a's update."""
    assert a.keys() == b.keys() == initial.keys()
    apart = sum(float((a[k] - b[k]).pow(2).sum()) for k in a) ** 0.5
    update = sum(float((a[k] - initial[k]).pow(2).sum()) for k in a) ** 0.5
    assert update > 0, "the adapters never moved: the comparison would be vacuous"
    assert apart / update <= SAME_TRAINING_TOLERANCE, (apart / update, apart, update)
    return apart / update


@pytest.mark.numerics
def test_generation_rows_bound_a_call_without_changing_the_samples(model_path: Path, tmp_path: Path) -> None:
    """generation_rows cuts a step's sampling into calls of whole groups; the rows' streams make the samples
    those of one call."""
    spec = small_spec(tmp_path, group_size=3, max_new_tokens=8)
    policy = LoraPolicy.load(model_path, spec)
    questions = ("Hi.", "Name a sea animal.", "Why?")
    tasks = [Task(id=f"q{i}", question=q, answer="x") for i, q in enumerate(questions)]
    calls: list[int] = []
    original = policy.model.generate

    def counted(**kwargs: object) -> torch.Tensor:
        calls.append(int(kwargs["input_ids"].shape[0]))  # type: ignore[union-attr]
        return original(**kwargs)

    policy.model.generate = counted  # type: ignore[method-assign]
    whole = GspoRun(spec, policy, tasks, [], tmp_path / "a").sample(tasks, "t")
    capped = spec.model_copy(update={"generation_rows": 7})
    cut = GspoRun(capped, policy, tasks, [], tmp_path / "b").sample(tasks, "t")
    assert calls == [9, 6, 3]  # all 3 groups at once; then 2 whole groups of 3 rows (7 // 3), then 1
    assert [g.completions for g in whole] == [g.completions for g in cut]
    with pytest.raises(ValidationError):
        small_spec(tmp_path, generation_rows=-1)


def test_a_step_raises_the_logprob_of_better_completions(model_path: Path, tmp_path: Path) -> None:
    spec = small_spec(tmp_path, num_iterations=1, learning_rate=5e-3)
    torch.manual_seed(0)
    policy = LoraPolicy.load(model_path, spec)
    task = Task(id="q", question="Say something about cats.", answer="x")
    rollouts = generate(policy, [task], group_size=4, max_new_tokens=8, temperature=1.0, top_p=1.0, seeds=[1])
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])

    def mean_logps() -> torch.Tensor:
        with torch.no_grad():
            logp = policy.token_logprobs(rollouts.sequences, rollouts.attention_mask, rollouts.prompt_length)
        return (logp * rollouts.completion_mask).sum(-1) / rollouts.completion_mask.sum(-1)

    before = mean_logps()
    args = (rollouts.sequences, rollouts.attention_mask, rollouts.prompt_length)
    mask = rollouts.completion_mask.bool()

    def exact(bf16: bool) -> torch.Tensor:
        """The head's log-probs in float64 from the same hidden states and weights (bf16-rounded with
        `bf16`, as both paths round them): what each fp32 path approximates."""
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hidden, weight = policy.hidden_and_head(*args)
        if bf16:
            hidden, weight = hidden.bfloat16(), weight.bfloat16()
        logp = torch.log_softmax(hidden.double() @ weight.double().T, dim=-1)
        return logp.gather(-1, args[0][:, args[2] :].unsqueeze(-1)).squeeze(-1)

    # Both paths (plain, and fused: chunked over the vocabulary) are the same log-probs up to float32
    # rounding, which depends on the CPU's kernels: here each lies within 1.6e-5 of the float64 values
    # (the two paths 1.6e-5 to 3e-5 apart from each other under other kernel choices). A defect (a wrong
    # chunk, target or normaliser) is off by 1e-2 or more; the bound sits a decade above the rounding
    # seen and well below that.
    with torch.no_grad():
        for bf16 in (False, True):
            want = exact(bf16)
            for fused in (None, chosen_logprobs):
                got = policy.token_logprobs(*args, fused=fused, autocast_bf16=bf16).double()
                apart = float((got - want)[mask].abs().max())
                assert apart < 3e-4, (bf16, fused, apart)
        plain = policy.token_logprobs(*args)
        fused16 = policy.token_logprobs(*args, fused=chosen_logprobs, autocast_bf16=True)
    assert 0 < float((fused16 - plain)[mask].abs().max()) < 0.5  # bf16, not fp32, and not far from it
    run = GspoRun(spec, policy, [task], [], tmp_path / "out")
    metrics = run.optimise(rollouts, advantages, len(rollouts.completions))
    change = mean_logps() - before
    assert metrics["grad_norm"] > 0 and metrics["clip_fraction"] == 0.0  # one pass: the ratio is exactly 1
    assert change[0] > 0 and change[2] > 0 and change[1] < 0 and change[3] < 0, change
    # The reference policy (adapters off) is the untouched base model: its log-probs did not move.
    with policy.reference(), torch.no_grad():
        reference = policy.token_logprobs(rollouts.sequences, rollouts.attention_mask, rollouts.prompt_length)
    base = LoraPolicy.load(model_path, spec)  # fresh adapters start at zero: the same as the base model
    with torch.no_grad():
        fresh = base.token_logprobs(rollouts.sequences, rollouts.attention_mask, rollouts.prompt_length)
    assert torch.allclose(reference[mask], fresh[mask], atol=1e-5)


@pytest.mark.numerics
def test_a_killed_run_resumes_to_the_adapters_of_a_whole_one(model_path: Path, tmp_path: Path) -> None:
    spec = small_spec(tmp_path, checkpoint_every=1)
    whole = run_gspo(spec, model_path, tmp_path / "whole")
    report = json.loads(Path(whole["report"]).read_text())
    assert report["steps"] == 2 and [p["step"] for p in report["curve"]] == [1, 2]
    first = report["curve"][0]
    assert first["updated"] and first["groups_zero_variance"] < first["groups"]
    assert 0.0 <= first["clip_fraction"] <= 1.0 and first["tokens"] > 0 and first["grad_norm"] > 0
    assert report["baseline_validation_score"] is not None and Path(whole["curve"]).stat().st_size > 0

    a = adapter_weights(Path(whole["adapter"]))
    assert any(v.abs().sum() > 0 for k, v in a.items() if "lora_B" in k), "the adapters never moved"

    # Killed after step 1 (its checkpoint written): the resumed run ends with the adapters of `whole`, bit for
    # bit, so a run is reproducible from its seed too (this one redid step 1 from scratch).
    class Killed(Exception):
        pass

    def kill_after_first(point: dict) -> None:
        if point["step"] == 1:
            raise Killed

    cut = tmp_path / "cut"
    with pytest.raises(Killed):
        run_gspo(spec, model_path, cut, on_step=kill_after_first)
    assert sorted(p.name for p in (cut / CHECKPOINTS).glob("step-*")) == ["step-000001"]
    resumed = run_gspo(spec, model_path, cut)
    c = adapter_weights(Path(resumed["adapter"]))
    assert all(torch.equal(a[k], c[k]) for k in a), "the resumed run drifted from the uninterrupted one"

    def timeless(curve: list[dict]) -> list[dict]:
        return [{k: v for k, v in p.items() if k != "wall_s"} for p in curve]

    resumed_curve = json.loads(Path(resumed["report"]).read_text())["curve"]
    assert timeless(resumed_curve) == timeless(report["curve"]), "the resumed run saw other rollouts"
    # A checkpoint is only resumed under the spec that wrote it.
    with pytest.raises(ValueError, match="another spec"):
        run_gspo(spec.model_copy(update={"learning_rate": 1e-4}), model_path, cut)


def test_bad_specs_are_refused(tmp_path: Path, model_path: Path) -> None:
    for bad, field in [
        ({"group_size": 1}, "spec.group_size"),
        ({"eps_low": -1}, "spec.eps_low"),
        ({"target_modules": ["q proj"]}, "spec.target_modules"),
        ({"loss": "magic"}, "spec.loss"),
        ({"lora_rank": 0}, "spec.lora_rank"),
    ]:
        with pytest.raises(ValidationError) as caught:
            GspoSpec.parse({"dataset": "shipped", **bad})
        assert caught.value.field == field, caught.value
    spec = small_spec(tmp_path, target_modules=["no_such_proj"])
    with pytest.raises(ValueError, match="no module named no_such_proj"):
        LoraPolicy.load(model_path, spec)


# A hang guard, not a speed bound: the ZeRO test takes 137 s alone on a Zen 3, and beside the other
# worker's training on two cores a CI run took it past 300 s.
@pytest.mark.timeout(900)
@pytest.mark.numerics
def test_two_processes_train_the_adapters_of_one(model_path: Path, tmp_path: Path) -> None:
    """`accelerate launch` with 2 CPU processes (gloo) and the same global batch: the same rollouts, and
    adapters equal to a one-process run's within float tolerance (gradients are summed in another order)."""
    import subprocess

    from zoo.trainer.gspo import worker
    from zoo.trainer.lora.launch import launch_command, launch_env

    spec = small_spec(tmp_path, batch_size=2, group_size=2)
    one = run_gspo(spec, model_path, tmp_path / "one")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec.to_json()))
    command = launch_command(
        spec_file,
        model_path,
        tmp_path / "two",
        2,
        "cpu",
        ("tests.trainer.gspo_rewards",),
        worker=worker.__name__,
    )
    done = subprocess.run(command, env=launch_env(2), capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    steps = [line["step"] for line in lines if "step" in line]
    result = lines[-1]["result"]
    assert [s["processes"] for s in steps] == [2] and steps[0]["groups"] == 2
    first = json.loads(Path(one["report"]).read_text())["curve"][0]
    for key in ("reward_mean", "reward_std", "tokens", "groups_zero_variance"):
        assert steps[0][key] == first[key], key  # the same completions, sampled apart
    assert steps[0]["updated"], "no group carried a signal: the comparison would be vacuous"
    a, b = adapter_weights(Path(one["adapter"])), adapter_weights(Path(result["adapter"]))
    assert_same_training(a, b, initial_adapter(spec, model_path, tmp_path))
