"""`zoo-node train gspo` as an operator runs it: a real subprocess on the bundled model, killed with -9
after its first checkpoint and resumed to the end; a finished run is not overwritten; bad options and a
backend GSPO cannot train are refused with the reason."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import base_config, write_config
from tests.devnet import cli_env, zoo
from zoo.trainer.tasks import families


def args(config: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train", "gspo",
        "--dataset", str(families.path("lengths", "train")),
        "--validation", str(families.path("lengths", "validation")),
        "--train-limit", "3", "--validation-limit", "1", "--batch-size", "1", "--group-size", "2",
        "--max-new-tokens", "4", "--lora-rank", "2", "--set", 'target_modules=["q_proj"]',
        "--out", str(out), "--config", str(config), *extra,
    ]  # fmt: skip


def test_a_killed_run_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    config = write_config(tmp_path / "node.toml", base_config(tmp_path / "data"))
    out = tmp_path / "run"
    log = (tmp_path / "first.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "zoo.node.cli", *args(config, out)],
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    first = out / "checkpoints" / "step-000001" / "trainer_state.pt"
    deadline = time.monotonic() + 240
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.exists(), (tmp_path / "first.log").read_text()
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (out / "report.json").exists()

    again = zoo(*args(config, out), timeout=120)
    assert again.returncode == 2 and "--resume" in again.stderr, again.stderr

    resumed = zoo(*args(config, out), "--resume", timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "completed" in resumed.stderr and "step 1:" not in resumed.stderr, resumed.stderr
    report = json.loads((out / "report.json").read_text())
    assert [p["step"] for p in report["curve"]] == [1, 2, 3] and report["kind"] == "gspo"
    assert (out / "adapter" / "adapter_model.safetensors").stat().st_size > 0
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["r"] == 2
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_options_and_remote_backends_are_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path / "node.toml", base_config(tmp_path / "data"))
    bad = zoo(*args(config, tmp_path / "a", "--group-size", "1"))
    assert bad.returncode == 2 and "spec.group_size" in bad.stderr, bad.stderr
    nothing = zoo(*args(config, tmp_path / "b", "--resume"))
    assert nothing.returncode == 2 and "no GSPO run" in nothing.stderr, nothing.stderr
    remote = write_config(
        tmp_path / "remote.toml",
        base_config(tmp_path / "data", {"model": {"backend": "openai", "base_url": "http://127.0.0.1:9",
                                                  "name": "m"}}),
    )  # fmt: skip
    refused = zoo(*args(remote, tmp_path / "c"))
    assert refused.returncode == 2 and "must be 'transformers'" in refused.stderr, refused.stderr
    missing = zoo(*args(config, tmp_path / "d", "--deepspeed", str(tmp_path / "nope.json")))
    assert missing.returncode == 2 and "--deepspeed: no DeepSpeed config at" in missing.stderr, missing.stderr
    stage3 = tmp_path / "stage3.json"
    stage3.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    unusable = zoo(*args(config, tmp_path / "e", "--deepspeed", str(stage3)))
    assert unusable.returncode == 2 and "stage is 3" in unusable.stderr, unusable.stderr
    for name in "ade":
        assert not (tmp_path / name).exists(), name
    assert not (tmp_path / "c" / "checkpoints").exists()


def test_two_worker_processes_under_zero2_from_the_cli(tmp_path: Path) -> None:
    """--processes 2 --deepspeed zero2: two accelerate workers, their optimiser state partitioned by
    DeepSpeed (tests/trainer/lora/test_zero.py checks the adapters against one process's)."""
    config = write_config(tmp_path / "node.toml", base_config(tmp_path / "data"))
    out = tmp_path / "run"
    options = ("--train-limit", "2", "--batch-size", "2", "--processes", "2", "--deepspeed", "zero2")
    done = zoo(*args(config, out, *options), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 1:" in done.stderr and "completed" in done.stderr, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert [p["processes"] for p in report["curve"]] == [2]
    assert len(list((out / "checkpoints" / "step-000001").rglob("*optim_states.pt"))) == 2
    assert (out / "adapter" / "adapter_model.safetensors").stat().st_size > 0
