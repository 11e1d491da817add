"""`zoo-node job …`: learning jobs on a running node, and what `zoo-node train …` (train.py, the same run
in the foreground) shares with it: the spec options built from the spec models, the progress view.

    zoo-node job submit tf-grpo --dataset tasks.jsonl --group-size 5 --epochs 3 [--watch]
    zoo-node job watch ID        progress bars until the job ends (exit 0 only if it succeeded)
    zoo-node job list | get ID | cancel ID

Both build the same validated spec from the same options and show progress the same way.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable
from datetime import UTC
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from zoo.node.cli.console import err, out
from zoo.node.cli.context import fail, load
from zoo.node.cli.options import ConfigOpt, DataDirOpt

app = typer.Typer(help="Learning jobs on a running node (admin).", no_args_is_help=True)
submit_app = typer.Typer(help="Submit a job.", no_args_is_help=True)
app.add_typer(submit_app, name="submit")

TERMINAL_EVENTS = {"completed": 0, "failed": 1, "cancelled": 1}


# -- the spec options, shared by `job submit tf-grpo` and `train tf-grpo` ---------------------------------

# (option name, spec field, type, help). Defaults are the spec's own (None = not given = spec default).
_SPEC_OPTIONS: list[tuple[str, str, Any, str]] = [
    ("--dataset", "dataset", str, "Task JSONL file, or 'shipped' for the bundled task set."),
    ("--validation", "validation", str, "Validation JSONL ('shipped' with the shipped set); unset: split."),
    ("--validation-fraction", "validation_fraction", float, "Share of the dataset held out when splitting."),
    ("--train-limit", "train_limit", int, "Use only the first N training tasks."),
    ("--validation-limit", "validation_limit", int, "Use only the first N validation tasks."),
    ("--epochs", "epochs", int, "Passes over the training tasks."),
    ("--batch-size", "batch_size", int, "Tasks per step."),
    ("--group-size", "group_size", int, "G: rollouts per task."),
    ("--max-ops", "max_ops_per_group", int, "Operations a group may propose."),
    ("--temperature", "temperature", float, "Rollout sampling temperature."),
    ("--rollout-max-tokens", "rollout_max_tokens", int, "Tokens per rollout."),
    ("--critic-max-tokens", "critic_max_tokens", int, "Tokens per summary / comparison / merge reply."),
    ("--k", "k", int, "Experiences in each rollout's prompt (default: inference.default_k)."),
    ("--lesson-position", "lesson_position", str, "Lessons in the 'system' or 'user' turn."),
    ("--instruction", "instruction", str, "System turn for tasks without their own (default: by task kind)."),
    ("--kinds", "experience_kinds", str, "What to learn: 'lessons', 'examples' or 'both' (default)."),
    ("--max-library-size", "max_library_size", int, "Cap on the learned library (lowest-valued dropped)."),
    ("--drop-after-uses", "drop_after_uses", int, "Uses after which a mostly harmful experience goes."),
    ("--reward", "reward", str, "Reward for every task (default: each task's verifier)."),
    ("--label-free", "label_free", bool, "Reward = agreement with the group's majority answer."),
    ("--validate/--no-validate", "validate_steps", bool, "Score each step on validation; revert drops."),
    ("--distill-factors", "distill_factors", bool, "Distill token-level expert factors (local models)."),
    ("--concurrency", "concurrency", int, "LLM calls in flight at once."),
    ("--max-json-retries", "max_json_retries", int, "Retries of a reply that is not the asked-for JSON."),
    ("--critic-base-url", "critic_base_url", str, "An OpenAI-compatible endpoint that writes the lessons."),
    ("--critic-model", "critic_model", str, "The critic endpoint's model (key: $ZOO_NODE_CRITIC_API_KEY)."),
    ("--min-similarity", "min_similarity", float, "Relevance gate (default: inference.min_similarity)."),
    ("--base", "base", str, "Start from the 'current' library or an 'empty' one."),
    (
        "--lookup-start/--no-lookup-start",
        "lookup_start",
        bool,
        "Start with every labelled training task as a worked example (default: on).",
    ),
    ("--seed", "seed", int, "Seed of shuffling, splitting and sampling."),
    ("--description", "description", str, "Description of the learned library version."),
]


def options_of(model: Any) -> list[tuple[str, str, Any, str]]:
    """Spec options generated from a pydantic spec's fields: every scalar field becomes --kebab-name
    (booleans --name/--no-name, choices as text) with the field's description as help; the rest (lists)
    are set with --set. The dataset fields come first, as the model declares them."""
    options: list[tuple[str, str, Any, str]] = []
    for name, info in model.model_fields.items():
        kind = info.annotation
        if get_origin(kind) in (Union, UnionType):  # X | None: the option is X (unset = spec default)
            kinds = [a for a in get_args(kind) if a is not type(None)]
            kind = kinds[0] if len(kinds) == 1 else None
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            options.append((f"{flag}/--no-{flag[2:]}", name, bool, info.description or ""))
        elif kind in (int, float, str) or get_origin(kind) is Literal:
            choices = f" ({', '.join(map(str, get_args(kind)))})" if get_origin(kind) is Literal else ""
            typ = str if choices else kind
            options.append((flag, name, typ, (info.description or "") + choices))
    return options


def _spec_from(
    values: dict[str, Any],
    spec_file: Path | None,
    sets: list[str] | None,
    options: list[tuple[str, str, Any, str]] = _SPEC_OPTIONS,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if spec_file is not None:
        try:
            loaded = json.loads(spec_file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise fail(f"--spec {spec_file}: {e}", 2) from None
        if not isinstance(loaded, dict):
            raise fail(f"--spec {spec_file}: expected a JSON object", 2)
        spec.update(loaded)
    for item in sets or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise fail(f"--set takes key=value (got {item!r})", 2)
        try:
            spec[key] = json.loads(raw)
        except json.JSONDecodeError:
            spec[key] = raw
    for _opt, field, _type, _help in options:
        if values.get(field) is not None:
            spec[field] = values[field]
    # The daemon may run in another directory: dataset paths travel absolute.
    for field in ("dataset", "validation"):
        value = spec.get(field)
        if isinstance(value, str) and value != "shipped":
            spec[field] = str(Path(value).expanduser().resolve())
    library = spec.get("experiences")  # distill: a library file travels absolute ("current", a job id: as is)
    if isinstance(library, str) and Path(library).expanduser().is_file():
        spec["experiences"] = str(Path(library).expanduser().resolve())
    return spec


def with_spec_options(
    command: Callable[..., None], options: list[tuple[str, str, Any, str]] = _SPEC_OPTIONS
) -> Callable[..., None]:
    """Add the spec options to a command: it receives them as `spec: dict` (typer reads __signature__).

    Written by hand because typer has no shared option groups; this keeps one list for both commands.
    """
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "spec"]
    extra = [
        inspect.Parameter(
            field,
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, opt, help=help_),
            annotation=typ | None,
        )
        for opt, field, typ, help_ in options
    ]
    extra += [
        inspect.Parameter(
            "spec_file",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, "--spec", help="JSON file with spec fields (options override it)."),
            annotation=Path | None,
        ),
        inspect.Parameter(
            "sets",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, "--set", help="Any spec field: key=value (JSON value). Repeatable."),
            annotation=list[str] | None,
        ),
    ]
    names = {field for _o, field, _t, _h in options} | {"spec_file", "sets"}

    def wrapper(**kwargs: Any) -> None:
        values = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
        spec = _spec_from(values, values.pop("spec_file", None), values.pop("sets", None), options)
        command(spec=spec, **kwargs)

    wrapper.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + extra
    )
    wrapper.__doc__ = command.__doc__
    wrapper.__name__ = command.__name__
    return wrapper


# -- progress -----------------------------------------------------------------------------------------


def gspo_step_line(d: dict[str, Any]) -> str:
    line = (
        f"step {d.get('step')}: reward {fmt(d.get('reward_mean'))} ± {fmt(d.get('reward_std'))}, "
        f"{d.get('groups_zero_variance')}/{d.get('groups')} groups without signal, "
        f"clip {fmt(d.get('clip_fraction'))}, loss {fmt(d.get('loss'))}, "
        f"grad norm {fmt(d.get('grad_norm'))}, {d.get('tokens')} tokens, {d.get('wall_s')} s"
    )
    if d.get("validation_score") is not None:
        line += f", validation {fmt(d.get('validation_score'))}"
    return line


def sft_step_line(d: dict[str, Any]) -> str:
    """One supervised LoRA step (sft, rft, distill) as a line (counts may come as floats, from a Struct)."""
    step, pairs = (int(d.get(k) or 0) for k in ("step", "pairs"))
    return (
        f"step {step}: loss {fmt(d.get('loss'))}, grad norm {fmt(d.get('grad_norm'))}, {pairs} pairs, "
        f"{d.get('wall_s')} s"
    )


def show_collect(progress: Progress, bar: TaskID, d: dict[str, Any]) -> None:
    """A supervised job's rollouts so far (a "collect" event: `Collected.point`) on `bar`: tasks rolled out
    of the total, completions sampled and passed; a line when the phase ends."""
    sampled, passed, kept = (int(d.get(k) or 0) for k in ("sampled", "passed", "kept"))
    description = f"rollouts: {sampled} sampled, {passed} passed"
    progress.update(bar, description=description, total=d.get("total"), completed=d.get("done"))
    if d.get("end"):
        progress.console.print(
            f"rollouts: {int(d.get('done') or 0)} tasks, {sampled} completions sampled, {passed} passed the "
            f"verifier, {kept} kept as pairs, {d.get('wall_s')} s",
            highlight=False,
        )


class ProgressView:
    """Renders job events: a bar for steps, one for the current step's rollouts (or a supervised job's
    rollouts before its steps), a line per step."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.steps = self.progress.add_task("steps", total=None)
        self.rollouts = self.progress.add_task("rollouts", total=None)
        self.outcome: str | None = None

    def __enter__(self) -> ProgressView:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def handle(self, type_: str, data: dict[str, Any]) -> None:
        p = self.progress
        if type_ in ("started", "resumed"):
            p.update(self.steps, total=data.get("steps_total"), completed=data.get("from_step", 0))
            if type_ == "resumed":
                p.console.print(f"resumed after step {data.get('from_step')}")
        elif type_ == "baseline":
            score = data.get("validation_score")
            p.console.print(f"baseline validation score: {fmt(score)}")
        elif type_ == "step_started":
            p.update(self.steps, description=f"step {data.get('step')} (epoch {data.get('epoch')})")
            p.reset(self.rollouts, total=None)
        elif type_ == "rollouts":
            p.update(self.rollouts, total=data.get("total"), completed=data.get("done"))
        elif type_ == "collect":
            show_collect(p, self.rollouts, data)
        elif type_ == "step_completed" and "groups_zero_variance" in data:  # a GSPO step
            p.update(self.steps, total=data.get("steps_total"), completed=data.get("step"))
            p.console.print(gspo_step_line(data), highlight=False)
        elif type_ == "step_completed" and "pairs" in data:  # a supervised LoRA step
            p.update(self.steps, total=data.get("steps_total"), completed=data.get("step"))
            p.console.print(sft_step_line(data), highlight=False)
        elif type_ == "step_completed":
            p.update(self.steps, completed=data.get("step"))
            d = data
            line = (
                f"step {d.get('step')}: reward {fmt(d.get('reward_mean'))} ± {fmt(d.get('reward_std'))}, "
                f"{d.get('groups_skipped')}/{d.get('groups')} groups skipped, "
                f"{d.get('operations_applied')} ops applied ({d.get('operations_proposed')} proposed), "
                f"validation {fmt(d.get('validation_score'))} [{d.get('decision')}], "
                f"{d.get('library_size')} lessons, {d.get('llm_calls')} LLM calls, {d.get('wall_s')} s"
            )
            if d.get("json_retries") or d.get("json_failures"):
                line += f", JSON retries {d.get('json_retries')}, give-ups {d.get('json_failures')}"
            p.console.print(line, highlight=False, markup=False)  # "[keep]" is not a style
        elif type_ in TERMINAL_EVENTS:
            self.outcome = type_
            if type_ == "completed":
                p.console.print(
                    f"[green]completed[/green]: draft version {data.get('version')} root {data.get('root')} "
                    f"with {data.get('experiences')} experiences; validation "
                    f"{fmt(data.get('baseline_validation_score'))} -> {fmt(data.get('validation_score'))}; "
                    f"report {data.get('report')}",
                    highlight=False,
                )
            elif type_ == "failed":
                p.console.print(f"[red]failed[/red]: {escape(str(data.get('error')))}", highlight=False)
            else:
                p.console.print(f"[yellow]cancelled[/yellow] after step {data.get('step')}")


def fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else "-"


# -- job commands -----------------------------------------------------------------------------------


def _client(config: Path | None, data_dir: Path | None, timeout_s: float = 30.0) -> Any:
    from zoo.node.client import NodeClient, NodeNotRunning

    cfg = load(config, data_dir=data_dir and str(data_dir))
    try:
        return NodeClient.from_data_dir(cfg.data_dir, timeout_s=timeout_s)
    except NodeNotRunning as e:
        raise fail(f"{e} (start it with `zoo-node start`)") from None


def _rpc(call: Callable[[], Any]) -> Any:
    import grpc

    try:
        return call()
    except grpc.RpcError as e:
        raise fail(f"{e.code().name}: {e.details()}") from None


def _watch(client: Any, job_id: str) -> int:
    from google.protobuf import json_format

    with ProgressView(err) as view:
        stream = client.watch_job(job_id)
        for event in _events(stream):
            view.handle(event.type, json_format.MessageToDict(event.data))
    return TERMINAL_EVENTS.get(view.outcome or "", 1)


def _events(stream: Iterable[Any]) -> Iterable[Any]:
    import grpc

    try:
        yield from stream
    except grpc.RpcError as e:
        raise fail(f"{e.code().name}: {e.details()}") from None


def _submit(kind: str, spec: dict[str, Any], watch: bool, config: Path | None, data_dir: Path | None) -> None:
    client = _client(config, data_dir)
    job = _rpc(lambda: client.submit_job(kind, spec))
    out.print(job.id)
    if watch:
        raise typer.Exit(_watch(client, job.id))


WatchOpt = typer.Option(False, "--watch", "-w", help="Follow the job's progress until it ends.")


@with_spec_options
def _submit_tf_grpo(
    spec: dict[str, Any],
    watch: bool = WatchOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Submit a TF-GRPO job (training-free: learns a library draft from group rollouts)."""
    _submit("tf-grpo", spec, watch, config, data_dir)


submit_app.command("tf-grpo")(_submit_tf_grpo)


def _submit_gspo(
    spec: dict[str, Any],
    watch: bool = WatchOpt,
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Submit a GSPO job (LoRA adapters trained on the node's local model; outputs in DATA_DIR/jobs/ID)."""
    _submit("gspo", spec, watch, config, data_dir)


@app.command()
def watch(
    job_id: str = typer.Argument(..., help="Job id (job-…)."),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Follow a job's progress until it ends (exit 0 when it succeeded)."""
    raise typer.Exit(_watch(_client(config, data_dir), job_id))


_STATE_STYLE = {"SUCCEEDED": "green", "FAILED": "red", "CANCELLED": "yellow", "RUNNING": "cyan", "QUEUED": ""}


def _state(job: Any) -> str:
    from zoo.v1 import jobs_pb2

    return jobs_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")


@app.command("list")
def list_(
    limit: int = typer.Option(50, "--limit", min=1, max=1000),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Jobs on the node, newest first."""
    client = _client(config, data_dir)
    jobs = _rpc(lambda: client.list_jobs(limit)).jobs
    table = Table("id", "kind", "state", "step", "created", "result")
    for job in jobs:
        state = _state(job)
        result = ""
        if job.result.fields:
            r = job.result
            result = f"v{int(r['version'])}, {int(r['experiences'])} lessons"
        elif job.error:
            result = job.error[:60]
        created = job.created_at.ToDatetime(UTC).strftime("%Y-%m-%d %H:%M:%S")
        style = _STATE_STYLE.get(state, "")
        table.add_row(job.id, job.kind, f"[{style}]{state}[/{style}]" if style else state, str(job.step),
                      created, escape(result))  # fmt: skip
    out.print(table)


@app.command()
def get(
    job_id: str = typer.Argument(...),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """One job as JSON (spec, state, step, result)."""
    from google.protobuf import json_format

    client = _client(config, data_dir)
    job = _rpc(lambda: client.get_job(job_id))
    out.print_json(json_format.MessageToJson(job))


@app.command()
def cancel(
    job_id: str = typer.Argument(...),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Cancel a queued or running job (a running one stops at its next step boundary or LLM call)."""
    client = _client(config, data_dir)
    job = _rpc(lambda: client.cancel_job(job_id))
    out.print(
        f"{job.id}: {_state(job)}{' (stopping)' if job.cancel_requested and _state(job) == 'RUNNING' else ''}"
    )


def gspo_options() -> list[tuple[str, str, Any, str]]:
    from zoo.trainer.gspo.spec import GspoSpec

    return options_of(GspoSpec)


submit_app.command("gspo")(with_spec_options(_submit_gspo, gspo_options()))


def _submit_supervised(kind: str, summary: str) -> Any:
    def command(
        spec: dict[str, Any],
        watch: bool = WatchOpt,
        config: Path | None = ConfigOpt,
        data_dir: Path | None = DataDirOpt,
    ) -> None:
        _submit(kind, spec, watch, config, data_dir)

    command.__doc__ = summary
    command.__name__ = f"submit_{kind}"
    return with_spec_options(command, sft_options())


def sft_options() -> list[tuple[str, str, Any, str]]:
    """The supervised kinds' spec options (the kind itself is the command's)."""
    from zoo.trainer.sft.spec import SftSpec

    return [o for o in options_of(SftSpec) if o[1] != "kind"]


for _kind, _summary in (
    (
        "sft",
        "Submit LoRA SFT on labelled tasks (adapter installed as the job id; outputs in DATA_DIR/jobs/ID).",
    ),
    ("rft", "Submit rejection-sampling fine-tuning: LoRA SFT on the samples each task's verifier passes."),
    (
        "distill",
        "Submit a library's distillation into a LoRA adapter (--experiences current | JOB_ID | FILE).",
    ),
):
    submit_app.command(_kind)(_submit_supervised(_kind, _summary))
