"""GSPO under DeepSpeed ZeRO-2 (trainer/lora/zero.py): two CPU processes (gloo) with the shipped config train
the adapters of a one-process run, resume from a checkpoint's partitioned optimiser state, and configs the
run cannot honour are refused before anything starts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import tests.trainer.gspo_rewards  # noqa: F401  (registers test_parity)
from tests.trainer.gspo.test_run import (  # noqa: F401  (model_path: the fixture)
    adapter_weights,
    assert_same_training,
    initial_adapter,
    model_path,
    small_spec,
    tasks_file,
)
from zoo.trainer.gspo import worker
from zoo.trainer.gspo.job import run_gspo
from zoo.trainer.lora.launch import launch_command, launch_env
from zoo.trainer.lora.zero import SHIPPED, ZeroConfigError, engine_config, read_config

pytest.importorskip("deepspeed", reason="DeepSpeed is a dev dependency: ./zoo installs it")

pytestmark = pytest.mark.numerics


def run_two(spec_file: Path, model: Path, out: Path) -> list[dict]:
    command = launch_command(
        spec_file,
        model,
        out,
        2,
        "cpu",
        ("tests.trainer.gspo_rewards",),
        worker=worker.__name__,
        deepspeed=SHIPPED,
    )
    done = subprocess.run(command, env=launch_env(2), capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


# A hang guard, not a speed bound: the ZeRO test takes 137 s alone on a Zen 3, and beside the other
# worker's training on two cores a CI run took it past 300 s.
@pytest.mark.timeout(900)
def test_zero2_over_two_processes_trains_the_adapters_of_one_and_resumes(
    model_path: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    # 3 prompts over 2 processes, micro-batches of 2 rows: one process runs 2 backwards per pass, the other
    # 1 and a zero-weight padding one (ZeRO-2 reduces on every backward).
    train = tasks_file(tmp_path, 3, "train3.jsonl")
    spec = small_spec(tmp_path, batch_size=3, group_size=2, micro_batch_size=2, epochs=2, dataset=str(train))
    one = run_gspo(spec, model_path, tmp_path / "one")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec.to_json()))

    lines = run_two(spec_file, model_path, tmp_path / "two")
    steps = [line["step"] for line in lines if "step" in line]
    assert [s["processes"] for s in steps] == [2, 2]
    assert all(s["updated"] for s in steps), "a step without a signal would make the comparison vacuous"
    curve = json.loads(Path(one["report"]).read_text())["curve"]
    for mine, theirs in zip(steps, curve, strict=True):
        assert mine["reward_mean"] == theirs["reward_mean"] and mine["tokens"] == theirs["tokens"]
        # A norm is well conditioned: summation orders measured here moved it by at most 8.5e-6 of itself.
        assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4)
    adapter = adapter_weights(Path(lines[-1]["result"]["adapter"]))
    initial = initial_adapter(spec, model_path, tmp_path)
    apart = assert_same_training(adapter_weights(Path(one["adapter"])), adapter, initial)
    print(f"ZeRO-2 over 2 processes vs one process: {apart:.2e} of the update apart")

    # Each process's optimiser partition is in the checkpoint; resuming from step 1 ends where the whole
    # run did (the Adam moments of step 1 matter to step 2's update).
    checkpoints = tmp_path / "two" / "checkpoints"
    partitions = sorted(p.name for p in (checkpoints / "step-000001").rglob("*optim_states.pt"))
    assert len(partitions) == 2, partitions
    shutil.rmtree(checkpoints / "step-000002")
    resumed = run_two(spec_file, model_path, tmp_path / "two")
    assert [line["step"]["step"] for line in resumed if "step" in line] == [2]
    apart = assert_same_training(adapter, adapter_weights(Path(resumed[-1]["result"]["adapter"])), initial)
    print(f"resumed vs uninterrupted: {apart:.2e} of the update apart")

    # A ZeRO checkpoint cannot be resumed without ZeRO (its optimiser state is partitioned).
    with pytest.raises(ValueError, match="written under DeepSpeed ZeRO over 2 processes"):
        run_gspo(spec, model_path, tmp_path / "two")


def test_the_shipped_config_gets_the_specs_values_and_the_runs_own() -> None:
    config, where = read_config(SHIPPED)
    assert where == SHIPPED and config["zero_optimization"]["stage"] == 2
    engine = engine_config(config, max_grad_norm=0.5, micro_batch_size=3)
    assert engine["gradient_clipping"] == 0.5 and engine["train_micro_batch_size_per_gpu"] == 3
    assert engine["gradient_accumulation_steps"] == 1 and engine["managed_gradient_accumulation"] is False
    assert engine["zero_optimization"] == config["zero_optimization"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"zero_optimization": {"stage": 3}}, "stage is 3: GSPO runs ZeRO stage 1 or 2"),
        ({}, "no 'zero_optimization' object"),
        ({"zero_optimization": {"stage": 2}, "optimizer": {"type": "Adam"}}, "'optimizer' may not be set"),
        ({"zero_optimization": {"stage": 2}, "fp16": {"enabled": True}}, "'fp16' may not be set"),
        ({"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}, "'bf16' may not be set"),
        ({"zero_optimization": {"stage": 2}, "gradient_clipping": 2.0}, "gradient_clipping' is 2.0 in the"),
        ({"zero_optimization": {"stage": 1, "overlap_comm": True}}, "overlap_comm needs stage 2"),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
            "offload_optimizer is not supported",
        ),
    ],
)
def test_configs_the_run_cannot_honour_are_refused(config: dict, message: str) -> None:
    with pytest.raises(ZeroConfigError, match=message):
        engine_config(config, max_grad_norm=1.0, micro_batch_size=8)


def test_config_files_are_read_with_clear_errors(tmp_path: Path) -> None:
    fine = tmp_path / "fine.json"
    fine.write_text(json.dumps({"zero_optimization": {"stage": 1}, "fp16": {"enabled": False}}))
    config, where = read_config(fine)
    assert where == str(fine)
    assert engine_config(config, max_grad_norm=1.0, micro_batch_size=8)["zero_optimization"]["stage"] == 1
    with pytest.raises(ZeroConfigError, match="no DeepSpeed config at"):
        read_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{stage: 2")
    with pytest.raises(ZeroConfigError, match="not JSON"):
        read_config(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ZeroConfigError, match="is a JSON object, not list"):
        read_config(tmp_path / "list.json")
