"""The TF-GRPO spec options shared by `job submit tf-grpo` and `train tf-grpo`: flags, negations, --set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from zoo.node.cli.job import with_spec_options


def capture(*args: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    @with_spec_options
    def command(spec: dict[str, Any], flag: bool = typer.Option(False, "--flag")) -> None:
        seen.update(spec=spec, flag=flag)

    app = typer.Typer()
    app.command()(command)
    app.command("other")(lambda: None)  # two commands, so typer keeps the command name
    result = CliRunner().invoke(app, ["command", *args])
    assert result.exit_code == 0, result.output
    return seen


def test_flags_negations_and_values(tmp_path: Path) -> None:
    assert capture()["spec"] == {}
    assert capture("--no-validate")["spec"] == {"validate_steps": False}
    assert capture("--validate")["spec"] == {"validate_steps": True}
    assert capture("--label-free", "--distill-factors")["spec"] == {
        "label_free": True,
        "distill_factors": True,
    }
    seen = capture("--group-size", "5", "--epochs", "3", "--temperature", "0.5", "--flag")
    assert seen["spec"] == {"group_size": 5, "epochs": 3, "temperature": 0.5} and seen["flag"] is True


def test_set_spec_file_and_paths(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"epochs": 2, "group_size": 4}))
    seen = capture("--spec", str(spec_file), "--set", "group_size=6", "--set", "description=hello world",
                   "--dataset", "tasks.jsonl", "--validation", "shipped")  # fmt: skip
    assert seen["spec"] == {
        "epochs": 2,
        "group_size": 6,
        "description": "hello world",
        "dataset": str(tmp_path / "tasks.jsonl"),  # made absolute: the daemon may run elsewhere
        "validation": "shipped",
    }


def test_bad_set_is_a_usage_error() -> None:
    @with_spec_options
    def command(spec: dict[str, Any]) -> None:
        raise AssertionError("not reached")

    app = typer.Typer()
    app.command()(command)
    app.command("other")(lambda: None)
    result = CliRunner().invoke(app, ["command", "--set", "novalue"])
    assert result.exit_code == 2 and "key=value" in result.output
