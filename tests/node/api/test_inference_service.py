"""InferenceService end to end: a real daemon on its devnet (genesis library), the real bundled model
and the real embedder, over a real gRPC socket."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest
from web3 import Web3

from tests.conftest import NodeProcess, devnet_serving_node
from tests.lora import random_adapter
from tests.node.approve import approve, next_version
from zoo.devnet.genesis import genesis_library
from zoo.inference.provenance.weights import file_sha256
from zoo.node.client import NodeClient
from zoo.registry.chain import LedgerClient
from zoo.registry.merkle import library_root
from zoo.v1 import inference_pb2 as pb
from zoo.v1 import node_pb2

GEOMETRY = "How do I find the area of a triangle with base 6 and height 4?"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    with devnet_serving_node(tmp_path_factory.mktemp("inference-node")) as n:
        yield n


def infer(client: NodeClient, **kw) -> pb.InferResponse:
    sampling = pb.SamplingParams(**kw.pop("sampling", {}))
    return client.inference.Infer(pb.InferRequest(sampling=sampling, **kw), timeout=kw.pop("timeout", 120))


def test_geometry_query_retrieves_geometry_experience(node: NodeProcess) -> None:
    with NodeClient(node.address) as c:
        r = infer(c, prompt=GEOMETRY, k=2, sampling={"max_tokens": 8})
        unrelated = infer(c, prompt="Write a haiku about autumn leaves.", sampling={"max_tokens": 4})
        st = c.status()
    assert list(unrelated.experiences) == []  # nothing in the library is for it (best match 0.11)
    genesis = genesis_library()
    geometry = {e.id for e in genesis.experiences if e.domain == "math.geometry"}
    finance = {e.id for e in genesis.experiences if e.domain.startswith("finance")}
    assert r.experiences[0].id in geometry
    assert not {e.id for e in r.experiences} & finance
    assert r.experiences[0].score >= r.experiences[-1].score
    # The relevance gate is reported, and no experience below it reached the prompt.
    assert st.min_similarity == pytest.approx(0.35)
    assert all(e.score >= st.min_similarity for e in r.experiences)
    assert r.text and r.model_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert r.library_root == "0x" + library_root(genesis).hex() and r.library_version >= 1
    assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 8
    # What the answer needs for replay is all there.
    assert r.sampling.max_tokens == 8 and r.sampling.HasField("seed")
    # Usage counters count what was served.
    assert all(st.experience_usage[e.id] >= 1 for e in r.experiences)


def test_domain_filter_and_retrieve(node: NodeProcess) -> None:
    with NodeClient(node.address) as c:
        # The relevance gate (Retrieve shows what Infer would be given): no finance lesson is close enough
        # to a geometry question; min_score -1 lifts it and the domain filter alone applies.
        gated = c.inference.Retrieve(pb.RetrieveRequest(query=GEOMETRY, k=5, domain="finance"))
        assert list(gated.experiences) == []
        r = c.inference.Retrieve(pb.RetrieveRequest(query=GEOMETRY, k=5, domain="finance", min_score=-1))
        assert r.experiences and all(e.id for e in r.experiences)
        texts = {e.text for e in r.experiences}
        finance = {e.text for e in genesis_library().experiences if e.domain.startswith("finance")}
        assert texts <= finance
        assert (
            c.inference.Retrieve(pb.RetrieveRequest(query=GEOMETRY, domain="nosuchdomain")).experiences == []
        )
        none = infer(c, prompt=GEOMETRY, disable_experiences=True, sampling={"max_tokens": 4})
        assert list(none.experiences) == []


def test_stream_equals_unary_and_is_deterministic(node: NodeProcess) -> None:
    with NodeClient(node.address) as c:
        a = infer(c, prompt="Name a prime number.", sampling={"max_tokens": 16})
        b = infer(c, prompt="Name a prime number.", sampling={"max_tokens": 16})
        chunks = list(
            c.inference.InferStream(
                pb.InferRequest(prompt="Name a prime number.", sampling=pb.SamplingParams(max_tokens=16))
            )
        )
    assert a.text == b.text
    assert [x.id for x in a.experiences] == [x.id for x in b.experiences]
    deltas = "".join(ch.delta for ch in chunks[:-1])
    final = chunks[-1].final
    assert deltas == final.text == a.text
    assert len(chunks) > 2


def test_seeded_sampling_replays(node: NodeProcess) -> None:
    with NodeClient(node.address) as c:
        s = {"max_tokens": 12, "temperature": 1.0, "top_p": 0.9, "seed": 42}
        a = infer(c, prompt="Write a word.", sampling=s)
        b = infer(c, prompt="Write a word.", sampling=s)
    assert a.text == b.text and a.sampling.seed == 42


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"prompt": "hi", "k": 500}, "k"),
        ({"prompt": "hi", "sampling": {"max_tokens": 100000}}, "sampling.max_tokens"),
        ({"prompt": "hi", "sampling": {"temperature": 3.0}}, "sampling.temperature"),
        ({"prompt": "hi", "sampling": {"top_p": 1.5}}, "sampling.top_p"),
        ({"prompt": "hi", "domain": "Bad Domain"}, "domain"),
        ({"prompt": "hi", "library_root": "0x12"}, "library_root"),
        ({}, "messages"),
        ({"prompt": "hi", "messages": [pb.ChatMessage(role="user", content="x")]}, "messages"),
        ({"messages": [pb.ChatMessage(role="robot", content="x")]}, "messages[0].role"),
        (
            {"prompt": "hi", "tools": [pb.Tool(name="f", parameters='{"type": "nonsense"}')]},
            "tools[0].parameters",
        ),
        ({"prompt": "hi", "tools": [pb.Tool(name="f", parameters="{")]}, "tools[0].parameters"),
        ({"prompt": "hi", "tools": [pb.Tool(name="f")], "tool_choice": "g"}, "tool_choice"),
        ({"prompt": "hi", "tool_choice": "required"}, "tool_choice"),
        (
            {
                "messages": [
                    pb.ChatMessage(role="user", content="x"),
                    pb.ChatMessage(role="tool", content="1", tool_call_id="c9"),
                ]
            },
            "messages[1].tool_call_id",
        ),
    ],
)
def test_bad_requests_are_invalid_argument(node: NodeProcess, kw: dict, field: str) -> None:
    with NodeClient(node.address) as c, pytest.raises(grpc.RpcError) as e:
        infer(c, **kw)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith(field)


def test_oversized_prompt_names_the_limit(node: NodeProcess) -> None:
    with NodeClient(node.address) as c, pytest.raises(grpc.RpcError) as e:
        infer(c, prompt="word " * 9000, sampling={"max_tokens": 8})
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with NodeClient(node.address) as c:
        backend = {s.name: s.detail for s in c.status().components}["model"]
    context = 2048 if "llamacpp" in backend else 8192  # llamacpp: model.context_length's default
    assert f"context of {context} tokens" in e.value.details()


def test_unknown_pinned_root_is_not_found(node: NodeProcess) -> None:
    with NodeClient(node.address) as c, pytest.raises(grpc.RpcError) as e:
        infer(c, prompt="hi", library_root="0x" + "ab" * 32)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_deadline_exceeded_and_node_recovers(node: NodeProcess) -> None:
    with NodeClient(node.address) as c:
        # The prompt's prefill alone outlasts the deadline (about 5 s for 1,200 tokens on 2 Zen 3 cores; 0.3 s
        # would need 4,000 tokens/s), where a short prompt's answer may end in under a second on its own.
        long_prompt = "word " * 1200
        with pytest.raises(grpc.RpcError) as e:
            c.inference.Infer(
                pb.InferRequest(
                    prompt=long_prompt, disable_experiences=True, sampling=pb.SamplingParams(max_tokens=64)
                ),
                timeout=0.3,
            )
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        t0 = time.monotonic()
        # Generation of the abandoned request stops at the next token, so the next one is not stuck behind it.
        r = infer(c, prompt="Say yes.", sampling={"max_tokens": 4})
        assert r.text is not None and time.monotonic() - t0 < 30


def test_queue_full_is_resource_exhausted(tmp_path, start_node) -> None:
    n = start_node({"inference": {"max_batch_size": 1, "max_queued": 0}}, name="tinyqueue")
    n.wait_component("model", "SERVING", timeout_s=180)
    with NodeClient(n.address) as c:
        # A stream that has started and is not finished holds the only slot.
        request = pb.InferRequest(
            prompt="Write a long story about a dragon.",
            sampling=pb.SamplingParams(max_tokens=300, stop=["zzzz-never"]),
            disable_experiences=True,
        )
        stream = c.inference.InferStream(request)
        first = next(stream)
        assert first.delta
        with pytest.raises(grpc.RpcError) as e:
            infer(c, prompt="hi", sampling={"max_tokens": 2})
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "queue is full" in e.value.details()
        stream.cancel()
        # The cancelled stream frees its slot: the node serves again.
        deadline = time.monotonic() + 60
        while True:
            try:
                assert infer(c, prompt="hi", sampling={"max_tokens": 2}).text is not None
                break
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
                time.sleep(0.2)


def test_pin_older_root_and_swap_under_load(node: NodeProcess) -> None:
    """20 concurrent requests while a new version is approved and swapped in: no errors, and each
    answer's experiences all come from the one library version it reports."""
    genesis = genesis_library()
    genesis_root = "0x" + library_root(genesis).hex()
    with NodeClient(node.address) as c:
        current = c.status().library
    assert current.root == genesis_root, "this test expects to start from the genesis library"
    v2 = next_version(
        genesis,
        genesis_root,
        (
            "math.geometry",
            "When a triangle's height is unknown, drop a "
            "perpendicular from the apex and use the Pythagorean theorem.",
        ),
    )
    v2_ids = {e.id for e in v2.experiences}
    genesis_ids = {e.id for e in genesis.experiences}
    errors: list[BaseException] = []
    results: list[pb.InferResponse] = []

    def one(i: int) -> None:
        try:
            with NodeClient(node.address) as c:
                results.append(infer(c, prompt=f"{GEOMETRY} ({i})", k=5, sampling={"max_tokens": 2}))
        except BaseException as e:  # collected and asserted below
            errors.append(e)

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(one, i) for i in range(20)]
        threading.Event().wait(1.0)
        v2_root = approve(node.data_dir, v2)
        concurrent.futures.wait(futures)
    assert errors == [], node.log()[-12000:]
    assert len(results) == 20
    for r in results:
        ids = {e.id for e in r.experiences}
        assert ids <= (v2_ids if r.library_root == v2_root else genesis_ids)
    # The node reaches v2; an older root can still be pinned.
    deadline = time.monotonic() + 60
    with NodeClient(node.address) as c:
        while c.status().library.root != v2_root and time.monotonic() < deadline:
            time.sleep(0.2)
        assert c.status().library.root == v2_root
        pinned = infer(c, prompt=GEOMETRY, library_root=genesis_root, sampling={"max_tokens": 2})
        assert pinned.library_root == genesis_root and pinned.library_version == 1
        assert {e.id for e in pinned.experiences} <= genesis_ids
        query = pb.RetrieveRequest(query="perpendicular from the apex of a triangle", k=1)
        fresh = c.inference.Retrieve(query)
        while fresh.library_root != v2_root and time.monotonic() < deadline + 60:  # the index swaps in later
            time.sleep(0.2)
            fresh = c.inference.Retrieve(query)
        assert fresh.library_root == v2_root
        assert fresh.experiences[0].id in v2_ids - genesis_ids


def test_requests_wait_for_a_slot_up_to_max_wait(start_node) -> None:
    """One slot, a queue of two, a one-second wait: the first waiter is answered when the slot frees, a
    waiter whose wait runs out and one beyond the queue are refused, each saying which limit it hit."""
    n = start_node({"inference": {"max_batch_size": 1, "max_queued": 2, "max_wait_s": 1.5}}, name="waits")
    n.wait_component("model", "SERVING", timeout_s=180)
    hold = pb.InferRequest(
        prompt="Write a long story about a dragon.",
        sampling=pb.SamplingParams(max_tokens=300, stop=["zzzz-never"]),
        disable_experiences=True,
    )
    quick = pb.InferRequest(prompt="hi", sampling=pb.SamplingParams(max_tokens=2), disable_experiences=True)
    with NodeClient(n.address) as c, concurrent.futures.ThreadPoolExecutor(4) as pool:
        stream = c.inference.InferStream(hold)
        assert next(stream).delta  # the only slot is taken
        waiters = [pool.submit(c.inference.Infer, quick, timeout=60) for _ in range(2)]
        time.sleep(0.3)
        with pytest.raises(grpc.RpcError) as full:
            c.inference.Infer(quick, timeout=60)
        assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "queue is full" in full.value.details()
        for w in waiters:  # nobody frees the slot within max_wait_s
            with pytest.raises(grpc.RpcError) as late:
                w.result()
            assert late.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "inference.max_wait_s" in late.value.details()
        waiter = pool.submit(c.inference.Infer, quick, timeout=60)
        time.sleep(0.3)
        stream.cancel()  # frees the slot: the waiter runs
        answer = waiter.result()
        assert answer.usage.queue_ms >= 200 and answer.usage.completion_tokens > 0
        serving = c.status().serving
    assert serving.max_batch_size == 1 and serving.max_queued == 2
    assert serving.refused_queue_full == 1 and serving.refused_wait_timeout == 2
    assert serving.queued_then_admitted == 1 and serving.running == 0 and serving.waiting == 0
    metrics = httpx.get(n.metrics_url).text
    assert 'zoo_inference_refused_total{reason="wait_timeout"} 2.0' in metrics
    assert "zoo_inference_queue_wait_seconds_count 2.0" in metrics


def test_json_schema_response_format_over_grpc(node: NodeProcess) -> None:
    schema = '{"type": "object", "properties": {"area": {"type": "number"}}, "required": ["area"]}'
    fmt = pb.ResponseFormat(type="json_schema", json_schema=schema)
    with NodeClient(node.address) as c:
        r = infer(c, prompt=GEOMETRY, response_format=fmt, sampling={"max_tokens": 40})
        assert r.finish_reason == "stop"
        assert isinstance(json.loads(r.text)["area"], int | float)
        with pytest.raises(grpc.RpcError) as e:
            infer(c, prompt="hi", response_format=pb.ResponseFormat(type="json_schema", json_schema="{oops"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("response_format.json_schema")


def test_tool_calls_over_grpc(node: NodeProcess) -> None:
    add = pb.Tool(
        name="add",
        description="Add two numbers.",
        parameters=json.dumps(
            {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            }
        ),
    )
    ask = pb.ChatMessage(role="user", content="What is 2 + 3? Use the add tool.")
    with NodeClient(node.address) as c:
        r = infer(c, messages=[ask], tools=[add], tool_choice="add", sampling={"max_tokens": 60})
        assert r.finish_reason == "tool_calls" and len(r.tool_calls) >= 1
        call = r.tool_calls[0]
        arguments = json.loads(call.arguments)
        assert call.name == "add" and set(arguments) == {"a", "b"} and call.id.startswith("call_")
        assert "<tool_call>" not in r.text  # the text beside the calls, not the calls
        # The result goes back; with tool_choice none the model answers in text.
        history = [
            ask,
            pb.ChatMessage(role="assistant", tool_calls=[call]),
            pb.ChatMessage(role="tool", tool_call_id=call.id, content=str(arguments["a"] + arguments["b"])),
        ]
        answer = infer(c, messages=history, tools=[add], tool_choice="none", sampling={"max_tokens": 30})
        assert answer.text and not answer.tool_calls and answer.finish_reason in ("stop", "length")


def test_a_payload_that_is_not_protobuf_is_invalid_argument(node: NodeProcess) -> None:
    with grpc.insecure_channel(node.address) as channel:
        raw = channel.unary_unary("/zoo.v1.InferenceService/Infer")
        with pytest.raises(grpc.RpcError) as e:
            raw(b"\xff\xff\xff\xff not protobuf", timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid protobuf message" in e.value.details()


def test_worked_examples_are_served_with_their_kind(node: NodeProcess) -> None:
    """A version holding a worked example (format 2) goes through governance; Retrieve and Infer rank it
    with the lessons and say it is an example, with its answer."""
    from zoo.registry.experience import Experience
    from zoo.registry.library import Library
    from zoo.registry.library_store import LibraryStore

    current = LibraryStore(node.data_dir).current()
    assert current is not None
    base_model = current.library.base_model
    worked = Experience.create(
        kind="example",
        text="How long is 3 zorbs in the house unit?",
        answer="3000 zim",
        domain="units.house",
        confidence=0.7,
        author="job:test",
        base_model=base_model,
    )
    experiences = [*current.library.experiences, worked]
    nxt = Library.create(
        version=current.version + 1, parent_root=current.root, experiences=experiences, base_model=base_model
    )
    root = approve(node.data_dir, nxt)
    question = "How long is 5 zorbs in the house unit?"
    deadline = time.monotonic() + 120
    with NodeClient(node.address) as c:
        # Retrieval keeps the previous index until the new one is built and swapped in whole, which can
        # lag the library's activation: wait for what Retrieve serves, not for the status.
        found = c.inference.Retrieve(pb.RetrieveRequest(query=question, k=3))
        while found.library_root != root and time.monotonic() < deadline:
            time.sleep(0.2)
            found = c.inference.Retrieve(pb.RetrieveRequest(query=question, k=3))
        library = next((x.detail for x in c.status().components if x.name == "library"), "")
        assert found.library_root == root, f"not serving {root}: {library}\n{node.log()[-3000:]}"
        top = found.experiences[0]
        assert (top.id, top.kind, top.text, top.answer) == (worked.id, "example", worked.text, "3000 zim")
        assert all(e.kind == "lesson" for e in found.experiences[1:])
        r = infer(c, prompt=question, k=3, sampling={"max_tokens": 8})
        assert r.experiences[0].id == worked.id and r.experiences[0].kind == "example"
        assert r.experiences[0].answer == "3000 zim"


def test_named_adapter_over_grpc_and_http(node: NodeProcess, tmp_path: Path) -> None:
    """An adapter copied into the node's adapters directory is served by name over gRPC and, as a model
    of its own, over the HTTP API; unknown and malformed names are refused with the right codes."""
    from zoo.inference.adapters import AdapterDirectory
    from zoo.inference.bundled_models import prepare_bundled_chat_model
    from zoo.node.config import default_cache_dir

    model = prepare_bundled_chat_model(default_cache_dir()).path
    AdapterDirectory(node.data_dir / "adapters").install(
        "tuned", random_adapter(model, tmp_path / "a", seed=3)
    )
    request = {"prompt": GEOMETRY, "disable_experiences": True, "sampling": {"max_tokens": 8}}
    with NodeClient(node.address) as c:
        base = infer(c, **request)
        tuned = infer(c, adapter="tuned", **request)
        assert base.adapter == "" and tuned.adapter == "tuned"
        assert tuned.text != base.text
        assert infer(c, **request).text == base.text  # the base model is untouched
        for name, code, words in (
            ("missing", grpc.StatusCode.NOT_FOUND, "no adapter 'missing'"),
            ("../tuned", grpc.StatusCode.INVALID_ARGUMENT, "adapter: must be"),
        ):
            with pytest.raises(grpc.RpcError) as err:
                infer(c, adapter=name, **request)
            assert err.value.code() == code and words in err.value.details()
    http = str(node.info["http"]) + "/v1"
    models = httpx.get(f"{http}/models").json()["data"]
    assert {m["id"]: m.get("parent") for m in models}["tuned"] == base.model_id
    # The adapter's card carries its weights' hash: the manifest of its directory's files, each by content.
    installed = node.data_dir / "adapters" / "tuned"
    manifest = "".join(f"{file_sha256(installed / f)}  {f}\n" for f in sorted(os.listdir(installed)))
    adapter_card = next(m for m in models if m["id"] == "tuned")
    assert adapter_card["sha256"] == hashlib.sha256(manifest.encode()).hexdigest()
    body = {"model": "tuned", "messages": [{"role": "user", "content": GEOMETRY}], "max_tokens": 8,
            "zoo": {"disable_experiences": True}}  # fmt: skip
    r = httpx.post(f"{http}/chat/completions", json=body, timeout=120)
    assert r.status_code == 200 and r.json()["model"] == "tuned"
    assert r.json()["choices"][0]["message"]["content"] == tuned.text
    r = httpx.post(f"{http}/chat/completions", json={**body, "model": "nope"}, timeout=120)
    assert r.status_code == 404 and "'tuned'" in r.json()["error"]["message"]


# ---------------------------------------------------------------------------------------------- credits


def usage_report(node: NodeProcess) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "zoo.node.cli",
            "usage",
            "report",
            "--json",
            "--config",
            str(node.config_file),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def test_signed_answers_are_metered_for_their_authors_and_client(node: NodeProcess) -> None:
    from eth_account import Account

    account = Account.from_key("0x" + "55" * 32)
    before = usage_report(node)
    with NodeClient(node.address, signer=account) as c:
        r = infer(c, prompt=GEOMETRY, k=2, sampling={"max_tokens": 4})
        replayed = c.status()
    tokens = r.usage.prompt_tokens + r.usage.completion_tokens
    after = usage_report(node)  # committed before the answer was sent: no waiting
    assert after["epoch"] == before["epoch"]
    earned_before = {a["author"]: a["units"] for a in before["authors"]}
    earned = {a["author"]: a["units"] - earned_before.get(a["author"], 0) for a in after["authors"]}
    # The answer's tokens went to the authors of the experiences it used (the devnet's genesis job, and
    # the job of a version an earlier test approved), all of them.
    assert set(earned) <= {"job:devnet-genesis", "job:test"} and tokens > 0
    assert sum(earned.values()) >= tokens and after["answered"] > before["answered"]
    clients = {c["client"]: c for c in after["clients"]}
    assert clients[account.address] == {"client": account.address, "units": tokens, "requests": 1, "spent": 0}
    assert replayed.node_address.startswith("0x") and replayed.allows_anonymous


def test_a_replayed_or_forged_signature_is_unauthenticated(node: NodeProcess) -> None:
    from eth_account import Account

    from zoo.node.credits.signing import HEADER, sign_request

    with NodeClient(node.address) as c:
        node_address = c.status().node_address
        request = pb.InferRequest(prompt=GEOMETRY, sampling=pb.SamplingParams(max_tokens=2))
        key, method = Account.from_key("0x" + "66" * 32), "/zoo.v1.InferenceService/Infer"
        header = sign_request(key, node_address, method, request.SerializeToString())
        assert c.inference.Infer(request, metadata=[(HEADER, header)], timeout=120).text is not None
        with pytest.raises(grpc.RpcError) as e:
            c.inference.Infer(request, metadata=[(HEADER, header)], timeout=120)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "was used already" in e.value.details()
        other = pb.InferRequest(prompt="Something else entirely?", sampling=pb.SamplingParams(max_tokens=2))
        # Signed for the first request's bytes, and for Infer, not InferStream: forged for this call.
        fresh = sign_request(key, node_address, method, request.SerializeToString())
        with pytest.raises(grpc.RpcError) as e:
            c.inference.InferStream(other, metadata=[(HEADER, fresh)], timeout=120).next()
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "not 0x" in e.value.details()
    metrics = httpx.get(node.metrics_url, timeout=30).text
    assert 'zoo_signed_requests_total{outcome="replayed"}' in metrics
    assert 'zoo_signed_requests_total{outcome="forged"}' in metrics


def test_a_credit_holder_is_charged_for_its_answers(node: NodeProcess) -> None:
    from eth_account import Account

    from zoo.devnet.dev_ledger import give_credits
    from zoo.devnet.manager import Devnet

    account = Account.from_key("0x" + "88" * 32)
    info = Devnet(node.data_dir).info()
    assert info is not None and info.ledger_address
    assert give_credits(info, account, 10**6) == 10**6
    # Signed, but without its consent to be charged here: served like anyone, charged nothing.
    with NodeClient(node.address, signer=account) as c:
        infer(c, prompt=GEOMETRY, k=1, sampling={"max_tokens": 3})
    clients = {c["client"]: c for c in usage_report(node)["clients"]}
    assert clients[account.address]["spent"] == 0 and clients[account.address]["requests"] == 1
    # With it (a SpendAuthorization for this node and epoch, signed by the client library).
    with NodeClient(node.address, signer=account, spend=10**5) as c:
        r = infer(c, prompt=GEOMETRY, k=1, sampling={"max_tokens": 3})
    tokens = r.usage.prompt_tokens + r.usage.completion_tokens
    clients = {c["client"]: c for c in usage_report(node)["clients"]}
    # price_per_token 1.0: the answer cost the holder its tokens, metered for the node's next report.
    assert clients[account.address]["spent"] == tokens > 0
    with NodeClient(node.address) as c:
        st = c.status()
        # Settlement runs beside serving: the node's devnet registered it on the ledger (a DAO call
        # proposal) when it started, so its rounds serve (no `dao propose-node` to run).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            settlement = next(x for x in c.status().components if x.name == "settlement")
            if settlement.state == node_pb2.COMPONENT_STATE_SERVING:
                break
            time.sleep(0.5)
    assert st.serving.credit_holders_admitted >= 1 and st.serving.reserved_slots == 1
    assert settlement.state == node_pb2.COMPONENT_STATE_SERVING, settlement
    w3 = Web3(Web3.HTTPProvider(info.rpc_url))
    assert LedgerClient(w3, info.ledger_address).is_registered(st.node_address)
