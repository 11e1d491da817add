"""`zoo-node train tf-grpo` and `zoo-node library propose --from-job`, run as an operator runs them.

Every command is a real `zoo-node` subprocess. Training talks to a scripted OpenAI-compatible HTTP server
(tests/trainer/scripted.py) through the node's openai backend, with the real bundled embedder; the
scripted server records every call, so a resumed run can be shown to redo no finished step. The success
path of `library propose --from-job` runs on a real devnet (anvil + IPFS): the job's learned library is
proposed, voted, executed and synced back as the data dir's next current version.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import base_config, write_config
from tests.devnet import cli_env, tear_down, zoo
from tests.trainer.scripted import ScriptedBackend, ScriptedServer, arithmetic_policy, one_wrong_in, ops_json
from tests.trainer.tfgrpo.test_tfgrpo import GOOD, tasks_file
from zoo.devnet.genesis import genesis_library
from zoo.devnet.manager import Devnet
from zoo.inference.embedder import SentenceTransformerEmbedder
from zoo.node.jobs.store import JobState, JobStore
from zoo.registry.canonical import SCHEMA_V4, decode_library
from zoo.registry.library_store import LibraryStore, StoredVersion
from zoo.trainer.tfgrpo.job import run_tf_grpo
from zoo.trainer.tfgrpo.llm import LLM
from zoo.trainer.tfgrpo.spec import TfGrpoSpec

CID = "bafkreif7mj3riqa7oiyf4da5lvx5epsszua32bcnfzccykznwxn75gnaaa"


def policy() -> Any:
    """The critic proposes GOOD; greedy (validation) answers are right once GOOD is in the prompt, so the
    lesson earns a better score whatever library the run starts from."""
    sampled = one_wrong_in(3)

    def correct(call: Any) -> bool:
        return GOOD in call.system if call.temperature == 0 else sampled(call)

    return arithmetic_policy(correct=correct, compare=lambda c: ops_json({"op": "add", "text": GOOD}))


def rollouts(server: ScriptedServer, since: int = 0) -> int:
    """Sampled (training) rollouts the server answered since call number `since`."""
    with server.recorder.lock:
        calls = server.recorder.calls[since:]
    return sum(1 for c in calls if c.stage == "rollout" and c.temperature > 0)


def settled(server: ScriptedServer) -> int:
    """The server's call count once no more requests arrive (a killed client's last ones may lag)."""
    count = -1
    while count != len(server.recorder.calls):
        count = len(server.recorder.calls)
        time.sleep(0.5)
    return count


# -- zoo-node train tf-grpo ---------------------------------------------------------------------------


class Trainer:
    """`zoo-node train tf-grpo` for one data dir whose model is a scripted server."""

    def __init__(self, tmp: Path, server: ScriptedServer, **sections: Any) -> None:
        self.server = server
        self.config = write_config(
            tmp / "node.toml",
            base_config(
                tmp / "data",
                {"model": {"backend": "openai", "base_url": server.url, "name": "scripted"}, **sections},
            ),
        )
        self.dataset = tasks_file(tmp, 4)
        self.validation = tasks_file(tmp, 2, "val.jsonl", 10)

    def args(self, out: Path, *extra: str) -> list[str]:
        return [
            "train",
            "tf-grpo",
            "--dataset",
            str(self.dataset),
            "--validation",
            str(self.validation),
            "--epochs",
            "1",
            "--batch-size",
            "2",
            "--group-size",
            "3",
            "--out",
            str(out),
            "--config",
            str(self.config),
            *extra,
        ]

    def __call__(self, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        return zoo(*self.args(out, *extra), timeout=300)


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[Trainer]:
    with ScriptedServer(policy()) as server:
        yield Trainer(tmp_path, server)


def test_train_writes_outputs_refuses_a_rerun_and_resumes_a_finished_run(trainer: Trainer, tmp_path) -> None:
    out = tmp_path / "run"
    done = trainer(out)
    assert done.returncode == 0, done.stderr
    assert "step 1:" in done.stderr and "step 2:" in done.stderr and "completed" in done.stderr
    lib = decode_library((out / "library.json").read_bytes())
    assert GOOD in [e.text for e in lib.experiences]
    assert lib.version == 1 and lib.parent_root == "" and lib.base_model == "scripted"
    report = json.loads((out / "report.json").read_text())
    assert [p["step"] for p in report["curve"]] == [1, 2]
    checkpoint = json.loads((out / "checkpoint.json").read_text())
    assert checkpoint["step"] == 2 and checkpoint["spec"]["group_size"] == 3
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert rollouts(trainer.server) == 2 * 2 * 3  # 2 steps x 2 tasks x G = 3
    library_bytes = (out / "library.json").read_bytes()

    again = trainer(out)
    assert again.returncode == 2 and "--resume" in again.stderr
    assert (out / "library.json").read_bytes() == library_bytes

    calls = settled(trainer.server)
    resumed = trainer(out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed after step 2" in resumed.stderr and "step 1:" not in resumed.stderr
    assert "baseline validation score" not in resumed.stderr
    # Every step was done: the resumed run makes no LLM call at all and rebuilds the same draft.
    assert len(trainer.server.recorder.calls) == calls
    assert (out / "library.json").read_bytes() == library_bytes
    assert len(json.loads((out / "report.json").read_text())["curve"]) == 2


@pytest.mark.parametrize("override", [None, "system"])
def test_a_run_places_lessons_where_the_node_serves_them(tmp_path: Path, override: str | None) -> None:
    """inference.lesson_position = "user": the run's rollouts carry the learned lesson right before the
    question, and the spec records it; --lesson-position overrides the node's setting."""
    with ScriptedServer(policy()) as server:
        trainer = Trainer(tmp_path, server, inference={"lesson_position": "user"})
        out = tmp_path / "run"
        done = trainer(out, *(["--lesson-position", override] if override else []))
        assert done.returncode == 0, done.stderr
        position = override or "user"
        assert json.loads((out / "checkpoint.json").read_text())["spec"]["lesson_position"] == position
        assert position in decode_library((out / "library.json").read_bytes()).description
        with_lesson = [c for c in server.recorder.calls if c.stage == "rollout" and GOOD in str(c.messages)]
        assert with_lesson, "the step-2 rollouts carry the step-1 lesson"
        assert all((GOOD in c.user) == (position == "user") for c in with_lesson)
        assert all((GOOD in c.system) == (position == "system") for c in with_lesson)


def test_an_interrupted_run_resumes_with_only_the_steps_left(tmp_path: Path) -> None:
    with ScriptedServer(policy(), delay_s=0.2) as server:
        trainer = Trainer(tmp_path, server)
        out = tmp_path / "run"
        proc = subprocess.Popen(
            [sys.executable, "-m", "zoo.node.cli", *trainer.args(out)],
            env=cli_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            # Ctrl-C in a terminal reaches a process whose SIGINT is at its default; a test run started in
            # the background (nohup, `&` in a script) would hand down an ignored SIGINT instead.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            # Poll the checkpoint, not stderr (rich may hold lines back when it is not a terminal).
            checkpoint = out / "checkpoint.json"
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None:
                if checkpoint.exists() and json.loads(checkpoint.read_text())["step"] == 1:
                    break
                time.sleep(0.02)
            else:
                raise AssertionError(f"no step-1 checkpoint: {proc.stderr.read() if proc.stderr else ''}")
            server.delay_s = 2.0  # every later LLM call of step 2 is slow: the run cannot finish first
            proc.send_signal(signal.SIGINT)
            _, rest = proc.communicate(timeout=60)
            assert proc.returncode == 130, rest
        finally:
            server.delay_s = 0.0
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert "interrupted; continue with the same command and --resume" in rest
        assert json.loads((out / "checkpoint.json").read_text())["step"] == 1
        assert not (out / "library.json").exists()

        calls = settled(server)
        resumed = trainer(out, "--resume")
        assert resumed.returncode == 0, resumed.stderr
        assert "resumed after step 1" in resumed.stderr
        assert "step 2:" in resumed.stderr and "step 1:" not in resumed.stderr
        assert rollouts(server, since=calls) == 2 * 3  # step 2 only: 2 tasks x G = 3
        report = json.loads((out / "report.json").read_text())
        assert [p["step"] for p in report["curve"]] == [1, 2]
        assert GOOD in [e.text for e in decode_library((out / "library.json").read_bytes()).experiences]


def test_train_bad_input_is_exit_2_before_any_llm_call(trainer: Trainer, tmp_path: Path) -> None:
    bad_group = trainer(tmp_path / "a", "--group-size", "0")
    assert bad_group.returncode == 2 and "group_size" in bad_group.stderr

    missing = zoo(
        *[a if a != str(trainer.dataset) else "/nonexistent.jsonl" for a in trainer.args(tmp_path / "b")]
    )
    assert missing.returncode == 2 and "/nonexistent.jsonl" in missing.stderr

    no_checkpoint = trainer(tmp_path / "c", "--resume")
    assert no_checkpoint.returncode == 2 and "no checkpoint" in no_checkpoint.stderr

    assert trainer.server.recorder.calls == []
    assert not any((tmp_path / d).exists() for d in "abc")


def test_a_context_too_small_for_the_job_is_one_line_naming_the_settings(tmp_path: Path) -> None:
    with ScriptedServer(policy()) as server:
        trainer = Trainer(tmp_path, server)
        model = {"backend": "openai", "base_url": server.url, "name": "scripted", "context_length": 256}
        trainer.config.write_text(base_config(tmp_path / "data", {"model": model}))
        done = trainer(tmp_path / "out")
    assert done.returncode == 2, done.stderr
    # 256 tokens hold no rollout of 256 tokens: said before any step, as the job's own line.
    assert "a rollout call needs" in done.stderr and "model.context_length" in done.stderr
    assert "rollout_max_tokens" in done.stderr
    assert "Traceback" not in done.stderr and "Error:" not in done.stderr


# -- library propose --from-job ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


def learn(
    data_dir: Path, tmp: Path, embedder: Any, base: StoredVersion | None, model_sha256: str = ""
) -> tuple[str, dict[str, Any]]:
    """A TF-GRPO job run in process on `base`, recorded as SUCCEEDED with its files in DATA/jobs/<id>/."""
    spec = TfGrpoSpec.parse(
        {
            "dataset": str(tasks_file(tmp, 4)),
            "validation": str(tasks_file(tmp, 2, "val.jsonl", 10)),
            "epochs": 1,
            "batch_size": 2,
            "group_size": 3,
            "experience_kinds": "lessons",  # what it learns is the scripted critic's one lesson
            "lookup_start": False,
        }
    )

    async def emit(type_: str, data: dict[str, Any]) -> None:
        pass

    async def save(step: int, state: dict[str, Any], event: tuple[str, dict[str, Any]]) -> None:
        pass

    with JobStore(data_dir / "jobs.sqlite") as jobs:
        job = jobs.create("tf-grpo", spec.to_json())
        jobs.start(job.id)
        result = asyncio.run(
            run_tf_grpo(
                spec,
                LLM(ScriptedBackend(policy()), 4),
                embedder,
                base.library if base is not None else None,
                base.root if base is not None else "",
                author=f"job:{job.id}",
                out_dir=data_dir / "jobs" / job.id,
                emit=emit,
                save=save,
                model_sha256=model_sha256,
            )
        )
        jobs.finish(job.id, JobState.SUCCEEDED, result=result)
    return job.id, result


def propose(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return zoo("library", "propose", *args, "--config", str(config))


def test_propose_from_job_refuses_what_it_cannot_propose(tmp_path: Path, embedder) -> None:
    data_dir = tmp_path / "data"
    config = write_config(tmp_path / "node.toml", base_config(data_dir))

    none_yet = propose(config, "--from-job", "job-000000000000")
    assert none_yet.returncode != 0 and "no jobs have run" in none_yet.stderr

    job_id, result = learn(data_dir, tmp_path, embedder, None)
    assert result["parent_root"] == ""
    unknown = propose(config, "--from-job", "job-000000000000")
    assert unknown.returncode != 0 and "does not exist" in unknown.stderr

    with JobStore(data_dir / "jobs.sqlite") as jobs:
        queued = jobs.create("tf-grpo", {}).id
        failed = jobs.create("tf-grpo", {}).id
        jobs.start(failed)
        jobs.finish(failed, JobState.FAILED, error="boom")
    for other, state in ((queued, "queued"), (failed, "failed")):
        refused = propose(config, "--from-job", other)
        assert refused.returncode != 0
        assert f"job {other} is {state}" in refused.stderr and "only a succeeded job" in refused.stderr

    # The job learned on an empty library; meanwhile the data dir's current version became genesis.
    store = LibraryStore(data_dir)
    store.activate(store.put(genesis_library(), CID))
    stale = propose(config, "--from-job", job_id)
    assert stale.returncode != 0
    assert "run the job again on the current library" in " ".join(stale.stderr.split())
    assert store.draft() is None and not (store.dir / "builds").exists()  # nothing was built


@pytest.fixture
def devnet_dir(tmp_path: Path) -> Iterator[Path]:
    data_dir = tmp_path / "data"
    try:
        # Tied to this test process too (pdeathsig), so even a crashed run leaves no chain behind.
        _info, reused = Devnet(data_dir).up(die_with_parent=True)
        assert not reused
        yield data_dir
    finally:
        tear_down(data_dir)


def test_propose_from_job_on_a_devnet_becomes_the_next_version(
    devnet_dir: Path, tmp_path: Path, embedder
) -> None:
    config = write_config(tmp_path / "node.toml", base_config(devnet_dir, {"chain": {"mode": "devnet"}}))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        result = zoo(*args, "--config", str(config))
        assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
        return result

    assert "activated version 1" in cli("library", "sync").stdout
    store = LibraryStore(devnet_dir)
    genesis = store.current()
    assert genesis is not None and genesis.version == 1

    # The job's draft names the weights it was made on (a node passes its served model's hash): a library
    # of format 4, proposed, voted, executed and synced like any other.
    job_id, result = learn(devnet_dir, tmp_path, embedder, genesis, model_sha256="cd" * 32)
    job_lib = decode_library((devnet_dir / "jobs" / job_id / "library.json").read_bytes())
    assert job_lib.version == 2 and job_lib.parent_root == genesis.root == result["parent_root"]
    assert job_lib.schema == SCHEMA_V4 and job_lib.base_model_sha256 == "cd" * 32

    # Its model is no base model the DAO approved yet: refused, naming the command that proposes it.
    model = "cd" * 32
    unapproved = zoo("library", "propose", "--from-job", job_id, "--config", str(config))
    assert unapproved.returncode == 1 and "has not approved" in unapproved.stderr
    assert f"zoo-node dao propose-model {model}" in unapproved.stderr
    settings = Devnet(devnet_dir).info().settings

    def passed(proposal: str) -> None:
        cli("devnet", "warp", "1")
        for key in ("dev0", "dev1", "dev2"):
            cli("dao", "vote", proposal, "--for", "--key", key)
        cli("devnet", "warp", str(settings["voting_period_s"] + settings["execution_delay_s"] + 1))
        cli("dao", "execute", proposal)

    assert "no base model approved yet" in cli("dao", "models").stdout
    made = re.search(
        rf"proposed (0x[0-9a-f]{{64}}): approve base model {model} ",
        cli("dao", "propose-model", model).stdout,
    )
    assert made, "propose-model printed no proposal"
    passed(made.group(1))
    assert cli("dao", "models").stdout.split() == [model]
    again = zoo("dao", "propose-model", model, "--config", str(config))
    assert again.returncode == 1 and "already approved" in again.stderr

    proposed = cli("library", "propose", "--from-job", job_id)
    root = result["root"]
    match = re.search(rf"proposed version 2 as (0x[0-9a-f]{{64}}): root {root} ", proposed.stdout)
    assert match, proposed.stdout
    proposal = match.group(1)

    passed(proposal)

    synced = cli("library", "sync")
    assert f"activated version 2 root {root}" in synced.stdout
    current = LibraryStore(devnet_dir).current()
    assert current is not None and current.version == 2 and current.root == root
    assert current.library.base_model_sha256 == "cd" * 32
    assert [e.id for e in current.library.experiences] == [e.id for e in job_lib.experiences]
    # What it learned: the genesis lessons, untouched, plus the scripted critic's lesson.
    learned = {e.text for e in current.library.experiences} - {e.text for e in genesis.library.experiences}
    assert learned == {GOOD}
    assert {e.id for e in genesis.library.experiences} < {e.id for e in current.library.experiences}
