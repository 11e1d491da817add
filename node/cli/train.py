"""`zoo-node train …`: a learning job in the foreground, with the node's configured model and no daemon.

    zoo-node train tf-grpo --dataset tasks.jsonl --out run/   Ctrl-C and --resume continue
    zoo-node train gspo --dataset tasks.jsonl --out run/ [--processes N] [--deepspeed zero2]
    zoo-node train sft --dataset tasks.jsonl --out run/       LoRA SFT on the labelled tasks
    zoo-node train rft --dataset tasks.jsonl --out run/       SFT on the samples its verifier passes
    zoo-node train distill --experiences current --out run/   a library distilled into an adapter

The options and the progress view are the job commands' (job.py), so a run here and a submitted job take
the same spec.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from zoo.node.cli.console import err
from zoo.node.cli.context import fail, load
from zoo.node.cli.job import (
    ProgressView,
    fmt,
    gspo_options,
    gspo_step_line,
    sft_options,
    sft_step_line,
    show_collect,
    with_spec_options,
)
from zoo.node.cli.options import ConfigOpt, DataDirOpt

app = typer.Typer(help="Run a learning job in the foreground, without a daemon.", no_args_is_help=True)


def _exit_with(run: Callable[[], int], interrupted: str) -> NoReturn:
    """Run a foreground job and exit with its code: a TrainingError exits 2 with its message, Ctrl-C
    prints `interrupted` and exits 130."""
    from zoo.node.jobs.foreground import TrainingError

    try:
        code = run()
    except TrainingError as e:
        raise fail(str(e), 2) from None
    except KeyboardInterrupt:
        err.print(interrupted)
        raise typer.Exit(130) from None
    raise typer.Exit(code)


@with_spec_options
def _train_tf_grpo(
    spec: dict[str, Any],
    out_dir: Path = typer.Option(Path("tf-grpo-run"), "--out", help="Directory for outputs and checkpoint."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the checkpoint in --out."),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Run TF-GRPO in this process with the configured model (no daemon); Ctrl-C keeps the checkpoint."""
    import asyncio

    from zoo.node.jobs.foreground import run_foreground

    cfg = load(config, data_dir=data_dir and str(data_dir))
    _exit_with(
        lambda: asyncio.run(run_foreground(cfg, spec, out_dir, resume, ProgressView(err))),
        f"interrupted; continue with the same command and --resume (checkpoint in {out_dir})",
    )


app.command("tf-grpo")(_train_tf_grpo)


class GspoView:
    """Renders a GSPO run: a bar for steps and a line per step."""

    step_line = staticmethod(gspo_step_line)

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console,
        )  # fmt: skip
        self.steps = self.progress.add_task("GSPO steps", total=None)

    def __enter__(self) -> GspoView:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start(self, spec: Any) -> None:
        self.console.print(
            f"GSPO: LoRA r={spec.lora_rank} on {', '.join(spec.target_modules)}; G={spec.group_size}, "
            f"{spec.batch_size} prompts a step, {spec.num_iterations} pass(es), lr {spec.learning_rate:g}",
            highlight=False,
        )

    def step(self, d: dict[str, Any]) -> None:
        self.progress.update(self.steps, total=d.get("steps_total"), completed=d.get("step"))
        self.progress.console.print(self.step_line(d), highlight=False)

    def done(self, result: dict[str, Any]) -> None:
        self.progress.console.print(
            f"[green]completed[/green]: {result['steps']} steps; validation "
            f"{fmt(result.get('baseline_validation_score'))} -> {fmt(result.get('validation_score'))}; "
            f"adapter {result['adapter']}; report {result['report']}",
            highlight=False,
        )


def _train_gspo(
    spec: dict[str, Any],
    out_dir: Path = typer.Option(
        Path("gspo-run"), "--out", help="Directory for the adapter and checkpoints."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in --out."),
    processes: int = typer.Option(
        1, "--processes", min=1, max=64, help="Data-parallel worker processes (accelerate launch)."
    ),
    deepspeed: str | None = typer.Option(
        None,
        "--deepspeed",
        help="Train under DeepSpeed ZeRO with this config: a JSON file, or 'zero2' for the shipped ZeRO-2 "
        "one (needs `pip install 'zoo-node[deepspeed]'`).",
    ),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Train LoRA adapters with GSPO on the configured local model (no daemon); kill it any time and
    continue with --resume from its last checkpoint. --processes N shares each batch out over N workers
    (the same adapters as one process, within float tolerance); with --deepspeed their optimiser state and
    gradients are partitioned by DeepSpeed ZeRO."""
    from zoo.node.jobs.foreground import run_gspo_foreground
    from zoo.trainer.gspo.spec import GspoSpec  # noqa: F401  (documents where the options come from)

    cfg = load(config, data_dir=data_dir and str(data_dir))
    _exit_with(
        lambda: run_gspo_foreground(cfg, spec, out_dir, resume, GspoView(err), processes, deepspeed),
        f"interrupted; continue with the same command and --resume (checkpoints in {out_dir})",
    )


app.command("gspo")(with_spec_options(_train_gspo, gspo_options()))


class SftView(GspoView):
    """Renders a supervised LoRA run: a bar for its rollouts (rft, distill) and their line, a bar for steps
    and a line per step."""

    rollouts: TaskID | None = None
    step_line = staticmethod(sft_step_line)

    def collect(self, d: dict[str, Any]) -> None:
        if self.rollouts is None:
            self.rollouts = self.progress.add_task("rollouts", total=None)
        show_collect(self.progress, self.rollouts, d)

    def start(self, spec: Any) -> None:
        self.progress.update(self.steps, description=f"{spec.kind} steps")
        self.console.print(
            f"{spec.kind}: LoRA r={spec.lora_rank} on {', '.join(spec.target_modules)}; "
            f"{spec.epochs} epoch(s), {spec.batch_size} pairs a step, lr {spec.learning_rate:g}",
            highlight=False,
        )

    def done(self, result: dict[str, Any]) -> None:
        source = f" from library {result['library_root']}" if result.get("library_root") else ""
        self.progress.console.print(
            f"[green]completed[/green]: {result['pairs']} pairs, {result['steps']} steps; validation "
            f"{fmt(result.get('baseline_validation_score'))} -> {fmt(result.get('validation_score'))}; "
            f"adapter {result['adapter']}{source}; report {result['report']}",
            highlight=False,
        )


def _sft_command(kind: str, summary: str) -> Any:
    def command(
        spec: dict[str, Any],
        out_dir: Path = typer.Option(
            Path(f"{kind}-run"), "--out", help="Directory for the adapter and report."
        ),
        processes: int = typer.Option(
            1, "--processes", min=1, max=64, help="Data-parallel worker processes (accelerate launch)."
        ),
        deepspeed: str | None = typer.Option(
            None, "--deepspeed", help="Train under DeepSpeed ZeRO with this config (a JSON file, or 'zero2')."
        ),
        config: Path | None = ConfigOpt,
        data_dir: Path | None = DataDirOpt,
    ) -> None:
        from zoo.node.jobs.foreground import run_sft_foreground

        cfg = load(config, data_dir=data_dir and str(data_dir))
        _exit_with(
            lambda: run_sft_foreground(cfg, kind, spec, out_dir, SftView(err), processes, deepspeed),
            f"interrupted; nothing was written to {out_dir}/adapter (a run starts over)",
        )

    command.__doc__ = summary
    command.__name__ = f"train_{kind}"
    return with_spec_options(command, sft_options())


app.command("sft")(
    _sft_command(
        "sft",
        "LoRA SFT on the labelled training tasks, each answered as a worked example shows it (the plain "
        "alternative to learning a library): no experiences at test.",
    )
)
app.command("rft")(
    _sft_command(
        "rft",
        "Rejection-sampling fine-tuning: sample --samples completions per task, keep those its verifier "
        "passes, LoRA SFT on them. Needs no reference answers.",
    )
)
app.command("distill")(
    _sft_command(
        "distill",
        "Distil a library into a LoRA adapter: trained on its worked examples and on the rollouts its "
        "experiences made successful (asked with them, learned without), so the adapter answers as the "
        "library makes the model answer with no experiences in the prompt. --experiences current | a job id "
        "| a library file; --dataset names the tasks to roll out on (those no worked example answers); "
        "without it, every shipped family's training tasks (the 'shipped' set: on two CPU cores the "
        "rollouts alone take 20 minutes or more).",
    )
)
