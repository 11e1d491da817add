"""The daemon's job runner: takes queued jobs from the job store and runs them one at a time.

Jobs share the node's model and embedder with serving. Every completed step is checkpointed in the job
store in one transaction with its event; when the daemon dies (even kill -9) the running job is queued
again at the next start and continues from its last checkpoint. Watchers (WatchJob) read the events from
the store and are woken as new ones are written.

A job's files live in DATA_DIR/jobs/<id>/: a TF-GRPO job's library.json (a draft that an operator
proposes on chain: the node's current library is never touched by a job), a GSPO job's adapter/ and
checkpoints/ (it trains LoRA adapters on its own fp32 copy of the local model, in a worker thread, and
resumes from its last checkpoint there), and both kinds' report.json and curve.png.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.inference.adapters import AdapterDirectory
from zoo.inference.defaults import ServingDefaults
from zoo.node.jobs.store import TERMINAL, JobRecord, JobState, JobStore
from zoo.node.lifecycle import Component, State
from zoo.node.logs import get_logger
from zoo.registry.errors import ValidationError

log = get_logger(__name__)

KINDS = ("tf-grpo", "gspo", "sft", "rft", "distill")
SUPERVISED = ("sft", "rft", "distill")  # LoRA jobs of trainer/sft: no mid-run checkpoint, a restart reruns


@dataclass
class Resources:
    """What a job borrows from the node: the generation backend, the embedder, the current library, and
    for GSPO the local model's files and device."""

    backend: Any
    embedder: Any
    current: Callable[[], Any]  # -> StoredVersion | None
    model_path: Path | None = None  # None: a remote (openai) backend, which GSPO cannot train
    device: str = "cpu"
    model_sha256: str = ""  # the served weights' (a TF-GRPO draft is bound to them); "" when unknown


class StopRequested(Exception):
    """Raised in a GSPO job's worker thread at a step boundary once the job is to stop.

    Not a ZooError: a control-flow signal, not an error; it must pass through the trainer's handling of
    ZooErrors untouched, up to the runner that raised it (it never reaches a client)."""


def parse_spec(kind: str, spec: dict[str, Any]) -> Any:
    """The typed spec of a job kind; ValidationError for an unknown kind or a bad spec."""
    from zoo.trainer.tasks.source import load_tasks

    if kind == "tf-grpo":
        from zoo.trainer.tfgrpo.spec import TfGrpoSpec

        parsed: Any = TfGrpoSpec.parse(spec)
    elif kind == "gspo":
        from zoo.trainer.gspo.spec import GspoSpec

        parsed = GspoSpec.parse(spec)
    elif kind in SUPERVISED:
        from zoo.trainer.sft.spec import SftSpec

        parsed = SftSpec.parse({**spec, "kind": kind})
        if kind == "distill" and parsed.experiences is None:
            raise ValidationError(
                "spec.experiences", "distill needs a library: 'current', a job id or a file"
            )
    else:
        raise ValidationError("kind", f"unknown job kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    load_tasks(parsed)  # a missing or malformed dataset is the submitter's error, reported now
    return parsed


class JobRunner(Component):
    name = "jobs"
    has_background_task = True
    probe_interval_s = 5.0

    def __init__(
        self,
        store: JobStore,
        jobs_dir: Path,
        resources: Callable[[], Resources | None],
        max_queued: int = 16,
        metrics: Any = None,
        serving: ServingDefaults | None = None,
        gspo_refusal: str | None = None,
        adapters: AdapterDirectory | None = None,
        refusal: str | None = None,
    ) -> None:
        self.store = store
        self.refusal = refusal  # why this node runs no jobs at all (a light node), if so
        self.adapters = adapters  # where a finished GSPO job's adapter is installed, named by the job id
        self.gspo_refusal = gspo_refusal  # why this node cannot run GSPO jobs (a remote backend), if so
        # How the node serves: what a spec leaves unset, so a job is validated under the serving conditions.
        self.serving = serving
        self.jobs_dir = jobs_dir
        self.resources = resources
        self.max_queued = max_queued
        self.metrics = metrics  # NodeMetrics, or None
        self.current: str | None = None
        self._task: asyncio.Task[Any] | None = None
        self._wake = asyncio.Event()
        self._changed: dict[str, asyncio.Event] = {}

    # -- submit / cancel / watch (called by the gRPC service) -------------------------------------------

    def submit(self, kind: str, spec: dict[str, Any]) -> JobRecord:
        if self.refusal is not None:
            from zoo.inference.engine import Unsupported

            raise Unsupported(self.refusal)
        parsed = parse_spec(kind, spec)
        if kind == "distill":
            self.library_file(parsed.experiences, None)  # a library that is not there is refused now
        if kind in ("gspo", *SUPERVISED) and self.gspo_refusal is not None:
            from zoo.inference.engine import Unsupported

            raise Unsupported(self.gspo_refusal)
        if self.serving is not None and kind == "tf-grpo":
            parsed = parsed.with_serving_defaults(self.serving)
        queued = self.store.list(limit=1000, states=[JobState.QUEUED])
        if len(queued) >= self.max_queued:
            from zoo.registry.errors import Overloaded

            raise Overloaded(f"{len(queued)} jobs are already queued (jobs.max_queued = {self.max_queued})")
        record = self.store.create(kind, parsed.to_json())
        self._notify(record.id)
        self._wake.set()
        log.info("job submitted", job=record.id, kind=kind)
        return record

    def cancel(self, job_id: str) -> JobRecord:
        record = self.store.request_cancel(job_id)
        if self.current == job_id and self._task is not None:
            self._task.cancel()
        self._notify(job_id)
        log.info("job cancel requested", job=job_id, state=record.state.value)
        return record

    async def changed(self, job_id: str, timeout_s: float) -> None:
        """Wait until the job gets a new event or changes state (or the timeout passes)."""
        event = self._changed.setdefault(job_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)

    def _notify(self, job_id: str) -> None:
        event = self._changed.pop(job_id, None)
        if event is not None:
            event.set()

    # -- component ----------------------------------------------------------------------------------

    async def setup(self) -> None:
        for job_id in self.store.recover():
            log.info("job interrupted by a restart; it resumes from its last checkpoint", job=job_id)

    async def probe(self) -> tuple[State, str]:
        if self.refusal is not None:
            return State.DISABLED, self.refusal
        if self.current:
            return State.SERVING, f"running {self.current}"
        return State.SERVING, "idle"

    async def run_forever(self) -> None:
        while True:
            resources = self.resources()
            record = self.store.claim_next() if resources is not None else None
            if record is None:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 1.0)
                continue
            assert resources is not None
            self.current = record.id
            self._task = asyncio.create_task(self._run(record, resources), name=f"job {record.id}")
            try:
                await asyncio.shield(self._task)
            except asyncio.CancelledError:
                if self._task.done():
                    continue  # the job was cancelled (handled inside _run); keep serving the queue
                # The runner itself is stopping (daemon shutdown): stop the job, it stays RUNNING in the
                # store and resumes from its checkpoint at the next start.
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._task
                raise
            finally:
                if self._task is not None and self._task.done():
                    self.current = None
                    self._task = None

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    # -- one job ------------------------------------------------------------------------------------

    async def _emit(self, job_id: str, type_: str, data: dict[str, Any]) -> None:
        self.store.append_event(job_id, type_, data)
        self._notify(job_id)

    def _finished(self, kind: str, state: JobState) -> None:
        if self.metrics is not None:
            self.metrics.jobs_finished.labels(kind, state.value).inc()

    async def _run(self, record: JobRecord, resources: Resources) -> None:
        job_id = record.id
        out_dir = self.jobs_dir / job_id
        log.info("job started", job=job_id, kind=record.kind, from_step=record.step)
        try:
            run = {"gspo": self._run_gspo, "tf-grpo": self._run_tf_grpo}.get(
                record.kind, self._run_supervised
            )
            result = await run(record, resources, out_dir)
        except asyncio.CancelledError:
            if self.store.get(job_id).cancel_requested:
                step = self.store.get(job_id).step
                self.store.finish(job_id, JobState.CANCELLED, event=("cancelled", {"step": step}))
                self._finished(record.kind, JobState.CANCELLED)
                self._notify(job_id)
                log.info("job cancelled", job=job_id, step=step)
                return
            raise
        except Exception as e:
            message = f"{type(e).__name__}: {e}"
            log.exception("job failed", job=job_id)
            if self.store.get(job_id).state not in TERMINAL:
                self.store.finish(
                    job_id, JobState.FAILED, error=message, event=("failed", {"error": message})
                )
                self._finished(record.kind, JobState.FAILED)
            self._notify(job_id)
            return
        self.store.finish(job_id, JobState.SUCCEEDED, result=result, event=("completed", result))
        self._finished(record.kind, JobState.SUCCEEDED)
        self._notify(job_id)
        log.info(
            "job succeeded", job=job_id, steps=result.get("steps"), experiences=result.get("experiences")
        )

    async def _run_tf_grpo(self, record: JobRecord, resources: Resources, out_dir: Path) -> dict[str, Any]:
        from zoo.trainer.tfgrpo.job import run_tf_grpo
        from zoo.trainer.tfgrpo.llm import LLM
        from zoo.trainer.tfgrpo.spec import TfGrpoSpec

        spec = TfGrpoSpec.parse(record.spec)
        stored = resources.current()
        job_id = record.id

        async def emit(type_: str, data: dict[str, Any]) -> None:
            await self._emit(job_id, type_, data)

        async def save(step: int, state: dict[str, Any], event: tuple[str, dict[str, Any]]) -> None:
            await asyncio.to_thread(self.store.checkpoint, job_id, step, state, event)
            self._notify(job_id)
            if self.metrics is not None and event[0] == "step_completed":
                self.metrics.job_steps.labels(record.kind).inc()
                self.metrics.job_llm_calls.labels(record.kind).inc(event[1].get("llm_calls", 0))
            if self.store.get(job_id).cancel_requested:
                raise asyncio.CancelledError

        return await run_tf_grpo(
            spec,
            LLM(resources.backend, spec.concurrency),
            resources.embedder,
            stored.library if stored is not None else None,
            stored.root if stored is not None else "",
            author=f"job:{job_id}",
            out_dir=out_dir,
            emit=emit,
            save=save,
            resume=self.store.load_checkpoint(job_id),
            model_sha256=resources.model_sha256,
        )

    def library_file(self, experiences: str | None, out_dir: Path | None, current: Any = None) -> Path:
        """The library a distill job learns from: "current" (the node's current version, written into
        `out_dir` when given), a TF-GRPO job's id (its draft) or a library file; ValidationError if absent."""
        from zoo.registry.canonical import encode_library
        from zoo.registry.fsutil import write_atomic

        value = experiences or ""
        if value == "current":
            from zoo.registry.library_store import LibraryStore

            stored = current() if current is not None else LibraryStore(self.jobs_dir.parent).current()
            if stored is None:
                raise ValidationError("spec.experiences", "the node has no current library to distil")
            if out_dir is None:
                return Path("current")
            out_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(out_dir / "library.json", encode_library(stored.library))
            return out_dir / "library.json"
        job_library = self.jobs_dir / value / "library.json"
        if value and "/" not in value and job_library.is_file():
            return job_library
        path = Path(value).expanduser()
        if not value or not path.is_file():
            raise ValidationError(
                "spec.experiences",
                f"{value!r} is neither 'current', a job with a library, nor a library file",
            )
        return path

    async def _run_supervised(self, record: JobRecord, resources: Resources, out_dir: Path) -> dict[str, Any]:
        """An sft, rft or distill run in a worker thread (trainer/sft). It keeps no mid-run checkpoint:
        after a restart it runs again from the start. Its adapter is installed named by the job id."""
        from zoo.trainer.sft.job import run_sft
        from zoo.trainer.sft.spec import SftSpec

        spec = SftSpec.parse({**record.spec, "kind": record.kind})
        if record.kind == "distill":
            library = await asyncio.to_thread(self.library_file, spec.experiences, out_dir, resources.current)
            spec = spec.model_copy(update={"experiences": str(library)})

        def train(on_step: Any, on_collect: Any) -> dict[str, Any]:
            return run_sft(
                spec, resources.model_path, out_dir, model_id=resources.backend.model_id,  # type: ignore[arg-type]
                device=resources.device, on_step=on_step, embedder=resources.embedder, serving=self.serving,
                on_collect=on_collect,
            )  # fmt: skip

        return await self._in_worker(record, resources, out_dir, train)

    async def _run_gspo(self, record: JobRecord, resources: Resources, out_dir: Path) -> dict[str, Any]:
        """The GSPO run in a worker thread. A cancel (or the daemon stopping) asks it to stop at its next
        step boundary and waits for it, so two jobs never train at once; the job store records every
        step with its event, the run's own checkpoints (in out_dir) are what a restart resumes from."""
        from zoo.trainer.gspo.job import run_gspo
        from zoo.trainer.gspo.spec import GspoSpec

        spec = GspoSpec.parse(record.spec)

        def train(on_step: Any, _on_collect: Any) -> dict[str, Any]:
            assert resources.model_path is not None
            return run_gspo(spec, resources.model_path, out_dir, device=resources.device, on_step=on_step)

        return await self._in_worker(record, resources, out_dir, train)

    async def _in_worker(
        self,
        record: JobRecord,
        resources: Resources,
        out_dir: Path,
        train: Callable[[Any, Any], dict[str, Any]],
    ) -> dict[str, Any]:
        """A LoRA job (`train(on_step, on_collect)`) in a worker thread. A cancel (or the daemon stopping)
        asks it to stop at its next step boundary (or chunk of rollouts) and waits for it, so two jobs never
        train at once; the job store records every step with its event, and a supervised job's rollouts as
        "collect" events. Its adapter is then installed, named by the job id."""
        if resources.model_path is None:
            raise RuntimeError(self.gspo_refusal or f"{record.kind} needs a local model")
        job_id = record.id
        loop = asyncio.get_running_loop()
        stop = threading.Event()

        def on_step(point: dict[str, Any]) -> None:  # in the worker thread
            if point["step"] >= self.store.get(job_id).step:
                self.store.checkpoint(
                    job_id, point["step"], {"out_dir": str(out_dir)}, ("step_completed", point)
                )
            else:  # redoing steps after the run's own last checkpoint (checkpoint_every > 1)
                self.store.append_event(job_id, "step_completed", point)
            loop.call_soon_threadsafe(self._notify, job_id)
            if self.metrics is not None:
                self.metrics.job_steps.labels(record.kind).inc()
            if stop.is_set() or self.store.get(job_id).cancel_requested:
                raise StopRequested

        def on_collect(point: dict[str, Any]) -> None:  # in the worker thread
            self.store.append_event(job_id, "collect", point)
            loop.call_soon_threadsafe(self._notify, job_id)
            if stop.is_set() or self.store.get(job_id).cancel_requested:
                raise StopRequested

        work = asyncio.ensure_future(asyncio.to_thread(train, on_step, on_collect))
        try:
            result = await asyncio.shield(work)
        except StopRequested:
            raise asyncio.CancelledError from None
        except asyncio.CancelledError:
            stop.set()
            with contextlib.suppress(StopRequested, Exception):
                await work
            raise
        if self.adapters is not None:
            # The training is done whatever happens here: a failed install is reported, not a failed job.
            try:
                installed = await asyncio.to_thread(self.adapters.install, job_id, Path(result["adapter"]))
            except Exception as e:
                result["adapter_install_error"] = f"{type(e).__name__}: {e}"
                log.warning("adapter not installed", job=job_id, adapter=result["adapter"], error=str(e))
            else:
                result["adapter_name"] = job_id
                log.info("adapter installed", job=job_id, adapter=job_id, path=str(installed))
        return result
