"""Learning jobs through a real daemon over gRPC: submit, watch, cancel, kill -9 and resume, bad input.

One test runs TF-GRPO with the real bundled model on CPU; the others point the node's openai backend at
a scripted OpenAI-compatible server (tests/trainer/scripted.py) so replies, timing and outcomes are
under the test's control.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from tests.conftest import NodeProcess, base_config, launch, write_config
from tests.trainer.scripted import ScriptedServer, arithmetic_policy, one_wrong_in, ops_json
from zoo.inference.defaults import DEFAULT_LESSON_POSITION
from zoo.node.client import NodeClient
from zoo.registry.canonical import decode_library, encode_library
from zoo.registry.merkle import library_root
from zoo.trainer.baselines import lookup_library
from zoo.trainer.tasks.loading import load_jsonl
from zoo.trainer.tasks.schema import Task, write_jsonl
from zoo.v1 import inference_pb2 as pb
from zoo.v1 import jobs_pb2

GOOD = "When adding two numbers, add the ones digits first and then the tens digits."


def tasks_file(path: Path, n: int, start: int = 0) -> str:
    tasks = [
        Task(
            id=f"add-{i}",
            question=f"What is {i} plus {i + 3}?",
            answer=str(2 * i + 3),
            domain="math.arithmetic",
        )
        for i in range(start, start + n)
    ]
    write_jsonl(path, tasks)
    return str(path)


def struct(spec: dict[str, Any]) -> Struct:
    s = Struct()
    s.update(spec)
    return s


def submit(c: NodeClient, spec: dict[str, Any], kind: str = "tf-grpo") -> jobs_pb2.Job:
    return c.jobs.SubmitJob(
        jobs_pb2.SubmitJobRequest(kind=kind, spec=struct(spec)), metadata=c.admin_metadata(), timeout=30
    )


def get(c: NodeClient, job_id: str) -> jobs_pb2.Job:
    return c.jobs.GetJob(jobs_pb2.GetJobRequest(id=job_id), metadata=c.admin_metadata(), timeout=10)


def watch(
    c: NodeClient, job_id: str, after: int = 0, timeout_s: float = 300
) -> Iterator[tuple[int, str, dict]]:
    stream = c.jobs.WatchJob(
        jobs_pb2.WatchJobRequest(id=job_id, after_seq=after), metadata=c.admin_metadata(), timeout=timeout_s
    )
    for e in stream:
        yield e.seq, e.type, json_format.MessageToDict(e.data)


def state(job: jobs_pb2.Job) -> str:
    return jobs_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")


def scripted_node(tmp: Path, url: str, name: str = "node") -> NodeProcess:
    data_dir = tmp / f"{name}-data"
    extra = {"model": {"backend": "openai", "base_url": url, "name": "scripted"}, "jobs": {"max_queued": 3}}
    node = launch(write_config(tmp / f"{name}.toml", base_config(data_dir, extra)), data_dir)
    node.wait_listening()
    node.wait_component("model", "SERVING")
    node.wait_component("retrieval", "DEGRADED")
    return node


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    policy = arithmetic_policy(
        correct=one_wrong_in(3), compare=lambda c: ops_json({"op": "add", "text": GOOD})
    )
    with ScriptedServer(policy) as s:
        yield s


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, server: ScriptedServer) -> Iterator[NodeProcess]:
    n = scripted_node(tmp_path_factory.mktemp("jobs"), server.url)
    yield n
    n.stop()


# -- the real model ------------------------------------------------------------------------------------


def test_tf_grpo_and_gspo_jobs_with_the_bundled_model(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    n = launch(write_config(tmp_path / "node.toml", base_config(data_dir)), data_dir)
    try:
        n.wait_listening()
        spec = {
            "dataset": tasks_file(tmp_path / "train.jsonl", 2),
            "validation": tasks_file(tmp_path / "val.jsonl", 1, start=10),
            "epochs": 1,
            "batch_size": 2,
            "group_size": 2,
            "temperature": 1.0,
            "rollout_max_tokens": 24,
            "critic_max_tokens": 40,
            "max_json_retries": 1,
        }
        # Submitted through the CLI, the way an operator does it.
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "zoo.node.cli",
                "job",
                "submit",
                "tf-grpo",
                "--data-dir",
                str(data_dir),
                *(f"--set={k}={json.dumps(v)}" for k, v in spec.items()),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        job_id = out.stdout.strip().splitlines()[-1]
        assert job_id.startswith("job-")
        with NodeClient(n.address, admin_token=n.admin_token) as c:
            events = list(watch(c, job_id, timeout_s=600))
            job = get(c, job_id)
            model_id = c.status().model_id
        types = [t for _, t, _ in events]
        assert [s for s, _, _ in events] == list(range(1, len(events) + 1))
        assert types[:4] == ["submitted", "started", "baseline", "step_started"]
        assert types[4:6] == ["rollouts", "rollouts"]
        assert types[-2:] == ["step_completed", "completed"], n.log()[-3000:]
        step = events[-2][2]
        assert step["rollouts"] == 4 and step["groups"] == 2 and step["step"] == 1
        informative = 2 - step["groups_skipped"]
        # rollouts + validation (baseline, and the candidate when something changed) + the critique
        assert step["llm_calls"] >= 4 + 2 * informative
        assert state(job) == "SUCCEEDED" and job.step == 1
        result = json_format.MessageToDict(job.result)
        lib = decode_library(Path(result["library"]).read_bytes())
        assert lib.version == 1 and lib.parent_root == "" and lib.base_model == model_id
        assert len(lib.experiences) == int(result["experiences"])
        report = json.loads(Path(result["report"]).read_text())
        assert len(report["curve"]) == 1 and report["cost"]["calls"] >= step["llm_calls"]
        assert Path(result["curve"]).read_bytes()[:4] == b"\x89PNG"
        assert Path(job.output_dir) == data_dir / "jobs" / job_id

        # A GSPO job on the same node: LoRA adapters trained on the local model, in the job's directory.
        gspo = {"dataset": spec["dataset"], "validation": spec["validation"], "batch_size": 1,
                "group_size": 2, "max_new_tokens": 4, "lora_rank": 2,
                "target_modules": ["q_proj"]}  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-m", "zoo.node.cli", "job", "submit", "gspo", "--data-dir", str(data_dir),
             *(f"--set={k}={json.dumps(v)}" for k, v in gspo.items())],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        gspo_id = out.stdout.strip().splitlines()[-1]
        with NodeClient(n.address, admin_token=n.admin_token) as c:
            events = list(watch(c, gspo_id, timeout_s=600))
            job = get(c, gspo_id)
        types = [t for _, t, _ in events]
        assert types[0] == "submitted" and types[-1] == "completed", n.log()[-3000:]
        steps = [d for _, t, d in events if t == "step_completed"]
        assert [d["step"] for d in steps] == [1, 2] and all(d["groups"] == 1 for d in steps)
        assert state(job) == "SUCCEEDED" and job.step == 2
        result = json_format.MessageToDict(job.result)
        adapter = Path(result["adapter"])
        assert adapter == data_dir / "jobs" / gspo_id / "adapter"
        assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 2
        assert json.loads(Path(result["report"]).read_text())["kind"] == "gspo"
        # ...and installed as a named adapter the node serves, so answers before and after compare.
        assert result["adapter_name"] == gspo_id
        assert (data_dir / "adapters" / gspo_id / "adapter_config.json").is_file()
        with NodeClient(n.address) as c:
            ask = pb.InferRequest(prompt="What is 2 + 3?", sampling=pb.SamplingParams(max_tokens=4))
            assert c.inference.Infer(ask, timeout=120).adapter == ""
            ask.adapter = gspo_id
            assert c.inference.Infer(ask, timeout=120).adapter == gspo_id

        # A distill job: a library file (every training task as a worked example) into an adapter the
        # node installs and serves, tagged with the library's root.
        library = lookup_library(load_jsonl(Path(spec["dataset"])), model_id)
        (tmp_path / "lookup.json").write_bytes(encode_library(library))
        distill = {"epochs": 1, "samples": 1, "max_new_tokens": 8, "lora_rank": 2, "dataset": spec["dataset"],
                   "validation": spec["validation"], "target_modules": ["q_proj"],
                   "validation_max_tokens": 8}  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-m", "zoo.node.cli", "job", "submit", "distill", "--data-dir", str(data_dir),
             "--experiences", str(tmp_path / "lookup.json"),
             *(f"--set={k}={json.dumps(v)}" for k, v in distill.items())],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        distill_id = out.stdout.strip().splitlines()[-1]
        with NodeClient(n.address, admin_token=n.admin_token) as c:
            events = list(watch(c, distill_id, timeout_s=600))
            job = get(c, distill_id)
        assert state(job) == "SUCCEEDED", n.log()[-3000:]
        assert [t for _, t, _ in events][-1] == "completed"
        result = json_format.MessageToDict(job.result)
        root = "0x" + library_root(library).hex()
        assert result["library_root"] == root and result["adapter_name"] == distill_id
        provenance = json.loads((data_dir / "adapters" / distill_id / "zoo_adapter.json").read_text())
        assert provenance["kind"] == "distill" and provenance["library_root"] == root
        with NodeClient(n.address) as c:
            ask = pb.InferRequest(prompt="What is 2 + 3?", sampling=pb.SamplingParams(max_tokens=4),
                                  adapter=distill_id)  # fmt: skip
            assert c.inference.Infer(ask, timeout=120).adapter == distill_id
    finally:
        n.stop()


# -- scripted model ------------------------------------------------------------------------------------


def test_job_rpcs_validate_input(node: NodeProcess, tmp_path: Path) -> None:
    with NodeClient(node.address, admin_token=node.admin_token) as c:
        cases = [
            (
                {"dataset": "/nonexistent/tasks.jsonl"},
                "tf-grpo",
                grpc.StatusCode.INVALID_ARGUMENT,
                "no such file",
            ),
            ({"group_size": 0}, "tf-grpo", grpc.StatusCode.INVALID_ARGUMENT, "group_size"),
            ({"epochs": 2.5}, "tf-grpo", grpc.StatusCode.INVALID_ARGUMENT, "epochs"),
            ({"no_such_knob": 1}, "tf-grpo", grpc.StatusCode.INVALID_ARGUMENT, "unknown field"),
            ({}, "lora", grpc.StatusCode.INVALID_ARGUMENT, "unknown job kind"),
            ({}, "distill", grpc.StatusCode.INVALID_ARGUMENT, "distill needs a library"),
            (
                {"experiences": "/nonexistent/lib.json"},
                "distill",
                grpc.StatusCode.INVALID_ARGUMENT,
                "neither 'current'",
            ),
            ({"learning_rate": 0}, "sft", grpc.StatusCode.INVALID_ARGUMENT, "learning_rate"),
            ({}, "sft", grpc.StatusCode.FAILED_PRECONDITION, "must be 'transformers'"),
            ({}, "", grpc.StatusCode.INVALID_ARGUMENT, "kind"),
            # GSPO needs local weights; this node's model is a remote (openai) one.
            ({}, "gspo", grpc.StatusCode.FAILED_PRECONDITION, "must be 'transformers'"),
            ({"group_size": 1}, "gspo", grpc.StatusCode.INVALID_ARGUMENT, "group_size"),
        ]
        for spec, kind, code, words in cases:
            with pytest.raises(grpc.RpcError) as e:
                submit(c, spec, kind)
            assert e.value.code() == code, (spec, kind, e.value.details())
            assert words in e.value.details()
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"question": "ok", "answer": "1"}\n{"question": ""}\n')
        with pytest.raises(grpc.RpcError) as e:
            submit(c, {"dataset": str(bad)})
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "line 2" in e.value.details()
        for call, request in [
            (c.jobs.GetJob, jobs_pb2.GetJobRequest(id="job-000000000000")),
            (c.jobs.CancelJob, jobs_pb2.CancelJobRequest(id="job-000000000000")),
        ]:
            with pytest.raises(grpc.RpcError) as e:
                call(request, metadata=c.admin_metadata(), timeout=10)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as e:
            get(c, "../../etc/passwd")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as e:
            list(watch(c, "job-000000000000"))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        # Without the admin token nothing of this is reachable.
        with pytest.raises(grpc.RpcError) as e:
            c.jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert c.health("") == "SERVING"


def test_scripted_job_succeeds_and_cancel_after_the_end_is_refused(node: NodeProcess, tmp_path: Path) -> None:
    spec = {
        "dataset": tasks_file(tmp_path / "t.jsonl", 2),
        "validation": tasks_file(tmp_path / "v.jsonl", 1, 10),
        "epochs": 1,
        "batch_size": 2,
        "group_size": 3,
        "experience_kinds": "lessons",  # the scripted critic's lesson is what this test counts
        "lookup_start": False,
    }
    with NodeClient(node.address, admin_token=node.admin_token) as c:
        job = submit(c, spec)
        assert state(job) in ("QUEUED", "RUNNING")
        # Unset prompt settings are the node's serving ones, stored with the job: train/serve parity.
        assert (job.spec["k"], job.spec["experience_budget_tokens"]) == (5, 512)
        events = list(watch(c, job.id))
        assert events[-1][1] == "completed"
        steps = [d for _, t, d in events if t == "step_completed"]
        assert steps[0]["operations_applied"] == 1 and steps[0]["decision"] == "kept"
        # Watching again from a sequence number replays only what came after it.
        assert [s for s, _, _ in watch(c, job.id, after=len(events) - 2)] == [len(events) - 1, len(events)]
        with pytest.raises(grpc.RpcError) as e:
            c.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=job.id), metadata=c.admin_metadata(), timeout=10)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        listed = c.list_jobs().jobs
        assert job.id in [j.id for j in listed]
        lib = decode_library((node.data_dir / "jobs" / job.id / "library.json").read_bytes())
        assert [e.text for e in lib.experiences] == [GOOD]
        assert lib.description.endswith(
            "(validated with k=5, an experience budget of 512 tokens, lessons in the "
            f"{DEFAULT_LESSON_POSITION} turn)"
        )
    metrics = httpx.get(node.metrics_url).text
    assert 'zoo_jobs_finished_total{kind="tf-grpo",state="succeeded"}' in metrics
    assert 'zoo_job_steps_total{kind="tf-grpo"}' in metrics
    # A job never touches the node's current library (nothing was approved here).
    assert not (node.data_dir / "library" / "current.json").exists()


def test_cancel_a_running_job(node: NodeProcess, server: ScriptedServer, tmp_path: Path) -> None:
    spec = {
        "dataset": tasks_file(tmp_path / "t.jsonl", 12),
        "validation_limit": 0,
        "epochs": 3,
        "batch_size": 2,
        "group_size": 3,
        "concurrency": 1,
    }
    server.delay_s = 0.2
    try:
        with NodeClient(node.address, admin_token=node.admin_token) as c:
            job = submit(c, spec)
            seen = []
            for _seq, type_, _ in watch(c, job.id):
                seen.append(type_)
                if type_ == "rollouts":
                    cancelled = c.jobs.CancelJob(
                        jobs_pb2.CancelJobRequest(id=job.id), metadata=c.admin_metadata(), timeout=10
                    )
                    assert cancelled.cancel_requested
            assert seen[-1] == "cancelled"
            after = get(c, job.id)
            assert state(after) == "CANCELLED" and after.step < 18
            assert not (node.data_dir / "jobs" / job.id / "library.json").exists()
            # The node keeps serving and runs the next job.
            quick = submit(
                c,
                {
                    "dataset": spec["dataset"],
                    "validation_limit": 0,
                    "train_limit": 1,
                    "epochs": 1,
                    "group_size": 2,
                },
            )
            assert [t for _, t, _ in watch(c, quick.id)][-1] == "completed"
    finally:
        server.delay_s = 0.0


def test_queue_bound_is_resource_exhausted(node: NodeProcess, server: ScriptedServer, tmp_path: Path) -> None:
    spec = {
        "dataset": tasks_file(tmp_path / "t.jsonl", 4),
        "validation_limit": 0,
        "epochs": 1,
        "group_size": 2,
        "concurrency": 1,
    }
    server.delay_s = 0.1
    try:
        with NodeClient(node.address, admin_token=node.admin_token) as c:
            jobs = [submit(c, spec) for _ in range(4)]  # one runs, three wait (jobs.max_queued = 3)
            with pytest.raises(grpc.RpcError) as e:
                for _ in range(3):
                    jobs.append(submit(c, spec))
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            for j in jobs:
                c.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=j.id), metadata=c.admin_metadata(), timeout=10)
            for j in jobs:
                assert [t for _, t, _ in watch(c, j.id)][-1] in ("cancelled", "completed")
    finally:
        server.delay_s = 0.0


def test_kill_9_mid_job_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    policy = arithmetic_policy(correct=one_wrong_in(3), compare=_per_question_lesson)
    with ScriptedServer(policy, delay_s=0.05) as server:
        spec = {
            "dataset": tasks_file(tmp_path / "t.jsonl", 6),
            "validation": tasks_file(tmp_path / "v.jsonl", 1, 10),
            "validation_limit": 0,  # no validation: every step keeps its lessons (what resume must redo)
            "epochs": 1,
            "batch_size": 2,
            "group_size": 3,
            "concurrency": 1,
            "merge_threshold": 0.999,
            "experience_kinds": "lessons",
            "lookup_start": False,
        }
        node = scripted_node(tmp_path, server.url)
        with NodeClient(node.address, admin_token=node.admin_token) as c:
            job = submit(c, spec)
            last = 0
            for seq, type_, data in watch(c, job.id):
                last = seq
                if type_ == "step_completed" and data["step"] == 1:
                    break
        # Let the second step get going, then kill the daemon without warning.
        time.sleep(0.3)
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait()
        calls_before_restart = len(server.recorder.calls)

        again = launch(node.config_file, node.data_dir)
        try:
            again.wait_listening()
            with NodeClient(again.address, admin_token=again.admin_token) as c:
                events = list(watch(c, job.id, after=last))
                job_after = get(c, job.id)
        finally:
            again.stop()
        types = [t for _, t, _ in events]
        assert "interrupted" in types and "resumed" in types, types
        resumed = next(d for _, t, d in events if t == "resumed")
        assert resumed["from_step"] >= 1
        completed_steps = [d["step"] for _, t, d in events if t == "step_completed"]
        assert completed_steps == list(range(int(resumed["from_step"]) + 1, 4))  # no completed step ran twice
        assert state(job_after) == "SUCCEEDED" and job_after.step == 3
        assert len(server.recorder.calls) > calls_before_restart

        # The same run without the crash learns the same lessons (every seed derives from the step).
        steady = scripted_node(tmp_path, server.url, name="steady")
        try:
            with NodeClient(steady.address, admin_token=steady.admin_token) as c:
                other = submit(c, spec)
                assert [t for _, t, _ in watch(c, other.id)][-1] == "completed"
        finally:
            steady.stop()
        a = decode_library((node.data_dir / "jobs" / job.id / "library.json").read_bytes())
        b = decode_library((steady.data_dir / "jobs" / other.id / "library.json").read_bytes())
        assert [e.id for e in a.experiences] == [e.id for e in b.experiences] and len(a.experiences) == 6


def _per_question_lesson(call: Any) -> str:
    q = call.user.split("What is ", 1)[1].split("?", 1)[0]
    return ops_json({"op": "add", "text": f"When asked what is {q}, add carefully and check the sum."})


def test_watch_follows_a_job_from_another_thread_while_it_runs(node: NodeProcess, tmp_path: Path) -> None:
    spec = {
        "dataset": tasks_file(tmp_path / "t.jsonl", 2),
        "validation_limit": 0,
        "epochs": 2,
        "batch_size": 1,
        "group_size": 2,
    }
    with NodeClient(node.address, admin_token=node.admin_token) as c:
        job = submit(c, spec)
        results: dict[str, list[str]] = {}

        def follow(name: str) -> None:
            with NodeClient(node.address, admin_token=node.admin_token) as cc:
                results[name] = [t for _, t, _ in watch(cc, job.id)]

        threads = [threading.Thread(target=follow, args=(f"w{i}",)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert results["w0"] == results["w1"] and results["w0"][-1] == "completed"
        assert results["w0"].count("step_completed") == 4


def test_openai_rollouts_run_concurrently_up_to_the_bound(
    node: NodeProcess, server: ScriptedServer, tmp_path: Path
) -> None:
    spec = {
        "dataset": tasks_file(tmp_path / "t.jsonl", 4),
        "validation_limit": 0,
        "epochs": 1,
        "batch_size": 4,
        "group_size": 4,
        "concurrency": 3,
    }
    server.delay_s = 0.2
    server.max_in_flight = 0
    try:
        with NodeClient(node.address, admin_token=node.admin_token) as c:
            job = submit(c, spec)
            assert [t for _, t, _ in watch(c, job.id)][-1] == "completed"
    finally:
        server.delay_s = 0.0
    # 16 rollouts were ready at once; no more than the bound ran together, and the bound was used.
    assert server.max_in_flight == 3


def test_a_job_that_fails_reports_why_and_the_queue_goes_on(
    node: NodeProcess, server: ScriptedServer, tmp_path: Path
) -> None:
    slow = {
        "dataset": tasks_file(tmp_path / "slow.jsonl", 2),
        "validation_limit": 0,
        "epochs": 1,
        "group_size": 2,
        "concurrency": 1,
    }
    doomed_file = Path(tasks_file(tmp_path / "doomed.jsonl", 2))
    server.delay_s = 0.3
    try:
        with NodeClient(node.address, admin_token=node.admin_token) as c:
            first = submit(c, slow)
            doomed = submit(c, {"dataset": str(doomed_file), "validation_limit": 0, "epochs": 1})
            doomed_file.unlink()  # gone before the job gets to run
            after = submit(c, slow)
            events = list(watch(c, doomed.id))
            assert events[-1][1] == "failed" and "no such file" in events[-1][2]["error"]
            failed = get(c, doomed.id)
            assert state(failed) == "FAILED" and "no such file" in failed.error
            assert [t for _, t, _ in watch(c, first.id)][-1] == "completed"
            assert [t for _, t, _ in watch(c, after.id)][-1] == "completed"
    finally:
        server.delay_s = 0.0
    assert not (node.data_dir / "jobs" / doomed.id / "library.json").exists()
