"""`zoo-node eval`: score a configuration (a library, an adapter, a model) on a task file through the node's
prompt path and serving defaults, and compare two configurations on the same tasks.

    zoo-node eval --dataset tasks.jsonl [--library PATH|current|none] [--adapter DIR|none]
                  [--base-url URL --model NAME] [--compare-library ...] [--compare-adapter ...] [--json]

A rich table per domain (score and its 95% interval); with --json one object on stdout:
{"score", "n", "by_domain", "ci95", ...} and, with a comparison, "compare" (the second configuration's
summary) and "difference" (B - A per task: mean, paired-bootstrap 95% interval, tasks better and worse).
The second configuration is the first with the --compare-* options applied. A missing file, an adapter
for another model, an endpoint that is down: a clear error and exit 2.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from zoo.node.cli.console import err, out
from zoo.node.cli.context import fail, load
from zoo.node.cli.options import ConfigOpt, DataDirOpt
from zoo.registry.errors import ZooError

NONE = "none"
CURRENT = "current"


class EvalError(ZooError):
    """A configuration that cannot be scored: the message says why (exit 2)."""


@dataclass(frozen=True)
class Configuration:
    library: str  # a library file, "current" or "none"
    adapter: str  # an adapter directory or "none"

    def label(self) -> str:
        parts = [f"library {self.library}"] + ([f"adapter {self.adapter}"] if self.adapter != NONE else [])
        return ", ".join(parts)


def read_library(cfg: Any, value: str) -> tuple[list[Any], str]:
    """(experiences, what they are) of a --library value."""
    from zoo.registry.canonical import decode_library
    from zoo.registry.library_store import LibraryStore

    if value == NONE:
        return [], "no library"
    if value == CURRENT:
        stored = LibraryStore(cfg.data_dir).current()
        if stored is None:
            return [], "current (the node has none: no library)"
        return list(stored.library.experiences), f"current, version {stored.library.version} ({stored.root})"
    path = Path(value).expanduser()
    if not path.is_file():
        raise EvalError(f"--library {value}: no such file (a library JSON file, 'current' or 'none')")
    try:
        lib = decode_library(path.read_bytes())
    except (ZooError, ValueError) as e:
        raise EvalError(f"--library {value}: not a library file: {e}") from None
    return list(lib.experiences), f"{path} ({len(lib.experiences)} experiences)"


def adapter_ref(value: str, model: str) -> Any:
    """The adapter to decode with (None for "none"); EvalError for a directory that is no adapter or one
    trained on another model (its zoo_adapter.json says which)."""
    from zoo.inference.adapters import CONFIG_FILE, PROVENANCE_FILE, AdapterDirectory

    if value == NONE:
        return None
    path = Path(value).expanduser().resolve()
    if not (path / CONFIG_FILE).is_file():
        raise EvalError(f"--adapter {value}: not a LoRA adapter directory (no {CONFIG_FILE})")
    provenance = path / PROVENANCE_FILE
    if provenance.is_file():
        trained_on = json.loads(provenance.read_text()).get("base_model")
        if trained_on and trained_on != model:
            raise EvalError(
                f"--adapter {value} was trained on {trained_on}, not on this node's model {model}"
            )
    try:
        return AdapterDirectory(path.parent).resolve(path.name)
    except Exception as e:
        raise EvalError(f"--adapter {value}: {e}") from None


async def evaluate(
    cfg: Any,
    dataset: Path,
    configurations: list[Configuration],
    *,
    base_url: str | None = None,
    model: str | None = None,
    max_tokens: int = 256,
) -> dict[str, Any]:
    """Score every configuration on the tasks of `dataset`; the first one's summary, and with a second one
    "compare" and "difference"."""
    from zoo.inference.adapters import AdapterLoadError
    from zoo.inference.backend_protocol import BackendError
    from zoo.trainer.evaluate import Scorer, report
    from zoo.trainer.prompting import PromptPath
    from zoo.trainer.tasks.loading import load_jsonl
    from zoo.trainer.tfgrpo.llm import LLM

    if not dataset.is_file():
        raise EvalError(f"--dataset {dataset}: no such file")
    try:
        tasks = load_jsonl(dataset)
    except ZooError as e:
        raise EvalError(f"--dataset {dataset}: {e}") from None
    if not tasks:
        raise EvalError(f"--dataset {dataset}: holds no tasks")
    libraries = [read_library(cfg, c.library) for c in configurations]
    backend = _backend(cfg, base_url, model, any(c.adapter != NONE for c in configurations))
    try:
        ident = backend.model_id
        adapters = [adapter_ref(c.adapter, ident) for c in configurations]
        embedder = None
        if any(experiences for experiences, _ in libraries):
            from zoo.inference.embedder import SentenceTransformerEmbedder

            embedder = await asyncio.to_thread(SentenceTransformerEmbedder, cfg.embedder.path)
        prompts = PromptPath(
            backend, embedder, cfg.inference.serving_defaults(), ident, max_tokens=max_tokens
        )
        scorer = Scorer(
            LLM(backend, concurrency=backend_concurrency(backend)), prompts, max_tokens=max_tokens
        )
        runs = []
        for c, (experiences, what), adapter in zip(configurations, libraries, adapters, strict=True):
            started = time.perf_counter()
            try:
                scores = await scorer.score_tasks(tasks, experiences, adapter=adapter)
            except AdapterLoadError as e:
                raise EvalError(f"--adapter {c.adapter}: {e}") from None
            except BackendError as e:
                raise EvalError(f"the model did not answer ({ident}): {e}") from None
            configuration = {"library": what, "adapter": c.adapter, "model": ident}
            runs.append((configuration, scores, time.perf_counter() - started))
    finally:
        await backend.close()
    return report(runs)


def backend_concurrency(backend: Any) -> int:
    return max(1, int(getattr(backend, "max_batch_size", 8)))


def _backend(cfg: Any, base_url: str | None, model: str | None, adapters: bool) -> Any:
    from zoo.inference.bundled_models import ModelUnavailable
    from zoo.node.components.backend_loading import load_backend
    from zoo.node.components.served_model import model_id, resolve_model_path

    if base_url is not None or model is not None:
        if not (base_url and model):
            raise EvalError(
                "--base-url and --model go together (an OpenAI-compatible endpoint and its model)"
            )
        if adapters:
            raise EvalError("--adapter needs the local model: a remote endpoint serves its own weights")
        from zoo.inference.openai_backend import OpenAIBackend

        return OpenAIBackend(base_url, model, max_concurrency=8)
    try:
        path = resolve_model_path(cfg)
    except ModelUnavailable as e:
        raise EvalError(str(e)) from None
    return load_backend(cfg.model, path, model_id(cfg, path), cfg.inference.max_batch_size, cfg.cache_dir)


def _interval(ci: list[float]) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def difference_line(d: dict[str, Any]) -> str:
    """The paired difference B - A in words: its mean, interval and the tasks each side wins."""
    return (
        f"B - A: {d['difference']:+.3f}, 95% interval {_interval(d['ci95'])} (paired bootstrap over "
        f"{d['n']} tasks; B better on {d['better']}, worse on {d['worse']})"
    )


def render(result: dict[str, Any]) -> Table:
    other = result.get("compare")
    table = Table(title=f"{result['n']} tasks", title_justify="left")
    table.add_column("domain")
    table.add_column("n", justify="right")
    table.add_column("A: score [95%]" if other else "score [95%]", justify="right")
    if other:
        table.add_column("B: score [95%]", justify="right")
    domains = [*result["by_domain"].items(), ("all", result)]
    for name, d in domains:
        row = [name, str(d["n"]), f"{d['score']:.3f} {_interval(d['ci95'])}"]
        if other:
            b = other if name == "all" else other["by_domain"][name]
            row.append(f"{b['score']:.3f} {_interval(b['ci95'])}")
        table.add_row(*row)
    return table


def eval_command(
    dataset: Path = typer.Option(..., "--dataset", help="Task JSONL to score (question, answer, verifier)."),
    library: str = typer.Option(CURRENT, "--library", help="A library file, 'current' or 'none'."),
    adapter: str = typer.Option(NONE, "--adapter", help="A LoRA adapter directory, or 'none'."),
    compare_library: str | None = typer.Option(
        None, "--compare-library", help="Compare with the same configuration but this library."
    ),
    compare_adapter: str | None = typer.Option(
        None, "--compare-adapter", help="Compare with the same configuration but this adapter."
    ),
    base_url: str | None = typer.Option(None, "--base-url", help="An OpenAI-compatible endpoint to score."),
    model: str | None = typer.Option(None, "--model", help="The endpoint's model name."),
    max_tokens: int = typer.Option(256, "--max-tokens", min=1, max=32_768, help="Tokens per answer."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout instead of a table."),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Score a library / adapter / model on a task file as the node serves it, with a 95% interval; with
    --compare-library/--compare-adapter, the paired difference of a second configuration on the same tasks."""
    cfg = load(config, data_dir=data_dir and str(data_dir))
    configurations = [Configuration(library, adapter)]
    if compare_library is not None or compare_adapter is not None:
        configurations.append(Configuration(compare_library or library, compare_adapter or adapter))
    try:
        result = asyncio.run(
            evaluate(cfg, dataset, configurations, base_url=base_url, model=model, max_tokens=max_tokens)
        )
    except EvalError as e:
        raise fail(f"zoo-node eval: {e}", 2) from None
    if as_json:
        print(json.dumps(result, sort_keys=True))
        return
    out.print(f"A: {result['configuration']['library']}, adapter {result['configuration']['adapter']}")
    if "compare" in result:
        c = result["compare"]["configuration"]
        out.print(f"B: {c['library']}, adapter {c['adapter']}")
    out.print(render(result))
    if "difference" in result:
        out.print(difference_line(result["difference"]))
    err.print(
        f"{result['wall_s']:.1f} s; per task {result['prompt_tokens']:.0f} prompt tokens, "
        f"{result['experiences']:.1f} experiences in the prompt",
        highlight=False,
    )
