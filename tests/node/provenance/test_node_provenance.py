"""Provenance on a real node (its devnet, the bundled llama.cpp model, the real embedder, gRPC and HTTP over
sockets): signed receipts of answers, checked by `zoo-node verify-receipt`; and a library bound to model
weights by hash (format 4): a version made for other weights stays out of the prompts, and the node says so
in its status, metrics and log; one made for the served weights is used; older formats as before."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from eth_account import Account

from tests.conftest import NodeProcess, devnet_serving_node
from tests.node.api.test_inference_service import GEOMETRY, infer
from tests.node.approve import approve, next_version
from zoo.devnet.genesis import genesis_library
from zoo.inference.bundled_models import bundled_gguf
from zoo.inference.provenance import answer_proof
from zoo.inference.provenance.answer_proof import AnswerProof
from zoo.inference.provenance.documents import output_document, sha256_hex
from zoo.inference.provenance.weights import file_sha256
from zoo.node.api.serving import receipt_from_proto
from zoo.node.client import NodeClient
from zoo.node.credits.meter import UsageMeter
from zoo.node.credits.metered_receipt import MeteredReceipt
from zoo.node.provenance.receipts import ZERO32, ZERO_ADDRESS, check, parse
from zoo.registry.library import Library
from zoo.registry.merkle import library_root
from zoo.v1 import inference_pb2 as pb
from zoo.v1 import library_pb2, node_pb2

OTHER_WEIGHTS = "ab" * 32


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with devnet_serving_node(tmp_path_factory.mktemp("binding-node")) as n:
        yield n


def bound(library: Library, sha256: str) -> Library:
    kept = ("version", "parent_root", "base_model", "experiences", "description")
    return Library.create(**{f: getattr(library, f) for f in kept}, base_model_sha256=sha256)


def retrieval(node: NodeProcess) -> tuple[str, str]:
    with NodeClient(node.address) as c:
        found = next(x for x in c.status().components if x.name == "retrieval")
    return node_pb2.ComponentState.Name(found.state).removeprefix("COMPONENT_STATE_"), found.detail


def mismatch_gauge(node: NodeProcess) -> float:
    text = httpx.get(str(node.info["metrics"]), timeout=10).text
    return float(
        next(line.split()[1] for line in text.splitlines() if line.startswith("zoo_library_model_mismatch "))
    )


def activate(node: NodeProcess, library: Library) -> str:
    root = approve(node.data_dir, library)
    deadline = time.monotonic() + 90
    with NodeClient(node.address) as c:
        while c.status().library.root != root:
            assert time.monotonic() < deadline, node.log()[-3000:]
            time.sleep(0.2)
    return root


def served_under(c: NodeClient, root: str) -> pb.InferResponse:
    """The first answer served under `root`: the index of a version swaps in after the status names it
    active (a loaded fresh clone took over a second between the two), and an answer names the root it
    was served under."""
    deadline = time.monotonic() + 90
    while (answer := infer(c, prompt=GEOMETRY, k=3, sampling={"max_tokens": 2})).library_root != root:
        assert time.monotonic() < deadline, f"answers still under {answer.library_root}, not {root}"
        time.sleep(0.2)
    return answer


def test_a_library_for_other_weights_stays_out_of_prompts(node: NodeProcess) -> None:
    served = file_sha256(bundled_gguf())
    genesis = genesis_library()
    genesis_root = "0x" + library_root(genesis).hex()
    # The genesis library (format 1) names its model by name only: used, and the status says unchecked.
    state, detail = retrieval(node)
    assert state == "SERVING" and "by name only" in detail and "unchecked" in detail
    with NodeClient(node.address) as c:
        assert infer(c, prompt=GEOMETRY, k=3, sampling={"max_tokens": 2}).experiences

    other = bound(
        next_version(
            genesis,
            genesis_root,
            ("math.geometry", "When a triangle has a base and height, halve their product."),
        ),
        OTHER_WEIGHTS,
    )
    other_root = activate(node, other)
    with NodeClient(node.address) as c:
        answer = served_under(c, other_root)
        # The answer names the version it was asked under, and carries none of its experiences.
        assert list(answer.experiences) == []
        # An older version pinned by root is still used: the binding is per version.
        pinned = infer(c, prompt=GEOMETRY, k=3, library_root=genesis_root, sampling={"max_tokens": 2})
        assert pinned.experiences
    wait = time.monotonic() + 30  # the component's probe (every second) sees the new version after it
    while retrieval(node)[0] != "DEGRADED" and time.monotonic() < wait:
        time.sleep(0.2)
    state, detail = retrieval(node)
    assert state == "DEGRADED" and f"sha256 {OTHER_WEIGHTS[:16]}" in detail and served[:16] in detail
    assert mismatch_gauge(node) == 1
    assert "library made for other model weights" in node.log()
    with NodeClient(node.address) as c:  # GetLibrary says which weights the version names
        listed = c.library.GetLibrary(library_pb2.GetLibraryRequest(page_size=1)).library
    assert (listed.root, listed.base_model_sha256) == (other_root, OTHER_WEIGHTS)

    mine = bound(
        next_version(
            other,
            other_root,
            ("math.geometry", "When asked for a triangle area, multiply base by height and halve it."),
        ),
        served,
    )
    mine_root = activate(node, mine)
    with NodeClient(node.address) as c:
        answer = served_under(c, mine_root)
    assert answer.experiences and {e.id for e in answer.experiences} <= {e.id for e in mine.experiences}
    wait = time.monotonic() + 30
    while retrieval(node)[0] != "SERVING" and time.monotonic() < wait:
        time.sleep(0.2)
    state, detail = retrieval(node)
    assert state == "SERVING" and "unchecked" not in detail and mismatch_gauge(node) == 0


# ------------------------------------------------------------------------------------------------ receipts


def verify(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zoo.node.cli", "verify-receipt", str(path), *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_a_grpc_answer_carries_a_receipt_its_node_signed_on_request(node: NodeProcess) -> None:
    request = pb.InferRequest(prompt=GEOMETRY, k=3, receipt=True, sampling=pb.SamplingParams(max_tokens=6))
    with NodeClient(node.address) as c:
        st = c.status()
        answer = c.inference.Infer(request, timeout=120)
        chunks = list(c.inference.InferStream(request, timeout=120))
        plain = c.inference.Infer(pb.InferRequest(prompt=GEOMETRY, sampling=pb.SamplingParams(max_tokens=2)))
    assert not plain.HasField("receipt")  # only on request
    for response in (answer, chunks[-1].final):
        receipt = parse(receipt_from_proto(response.receipt))
        check(receipt)  # signed by the node it names
        assert receipt.node == st.node_address and receipt.model == "0x" + st.model_sha256
        assert receipt.library == (response.library_root or ZERO32) and receipt.adapter == ZERO32
        assert receipt.output == sha256_hex(output_document([response.text]))
        assert (receipt.prompt_tokens, receipt.completion_tokens) == (
            response.usage.prompt_tokens, response.usage.completion_tokens,
        )  # fmt: skip
        assert receipt.request == sha256_hex(request.SerializeToString())  # the bytes the client sent
        assert receipt.client == ZERO_ADDRESS and abs(receipt.timestamp - time.time()) < 300
    # A signed request's receipt names its signer.
    account = Account.create()
    with NodeClient(node.address, signer=account) as c:
        signed = c.inference.Infer(request, timeout=120)
    got = parse(receipt_from_proto(signed.receipt))
    assert got.client == account.address
    # Every answer's receipt is in the epoch's receipts log, committed with its usage before the answer
    # went out; the one the client holds among them, as it was given.
    meter = UsageMeter(node.data_dir / "usage.sqlite", read_only=True)
    try:
        logged = [
            MeteredReceipt.parse(json.loads(x)) for x in meter.receipt_leaves(meter.epoch_of(got.timestamp))
        ]
    finally:
        meter.close()
    assert got in [m.receipt for m in logged]
    for m in logged:
        check(m.receipt)
    plain_output = sha256_hex(output_document([plain.text]))
    assert any(m.receipt.output == plain_output for m in logged)  # asked for no receipt: logged all the same


def test_an_http_answer_carries_a_receipt_that_verify_receipt_checks(
    node: NodeProcess, tmp_path: Path
) -> None:
    http = str(node.info["http"]) + "/v1"
    body = {"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "max_tokens": 6, "zoo": {"receipt": True},
            "messages": [{"role": "user", "content": GEOMETRY}]}  # fmt: skip
    r = httpx.post(f"{http}/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()
    receipt = answer["zoo"]["receipt"]
    assert receipt["output"] == sha256_hex(output_document([answer["choices"][0]["message"]["content"]]))
    good = tmp_path / "answer.json"
    good.write_text(json.dumps(answer))
    ok = verify(good, "--node", receipt["node"])
    assert ok.returncode == 0 and "matches the answer's text" in ok.stdout, ok.stderr
    # The answer altered: its text is no longer what the node signed.
    altered = json.loads(good.read_text())
    altered["choices"][0]["message"]["content"] += " (edited)"
    (tmp_path / "altered.json").write_text(json.dumps(altered))
    refused = verify(tmp_path / "altered.json")
    assert refused.returncode == 1 and "not the output the receipt names" in refused.stderr
    # The receipt altered (more tokens billed): it no longer recovers to its node.
    inflated = json.loads(good.read_text())
    inflated["zoo"]["receipt"]["completion_tokens"] += 100
    (tmp_path / "inflated.json").write_text(json.dumps(inflated))
    refused = verify(tmp_path / "inflated.json")
    assert refused.returncode == 1 and "forged or altered" in refused.stderr
    # A receipt replayed with another answer does not name its text.
    other = httpx.post(f"{http}/chat/completions", json={**body, "max_tokens": 3}, timeout=120).json()
    other["zoo"]["receipt"] = receipt
    (tmp_path / "replayed.json").write_text(json.dumps(other))
    assert other["choices"][0]["message"]["content"] != answer["choices"][0]["message"]["content"]
    replayed = verify(tmp_path / "replayed.json")
    assert replayed.returncode == 1 and "not the output the receipt names" in replayed.stderr, replayed.stderr
    # Another node or other weights asked for: refused, naming them.
    assert "not 0x" in verify(good, "--node", "0x" + "11" * 20).stderr
    assert verify(good, "--model", "ab" * 32).returncode == 1
    # Not a receipt at all: usage error.
    (tmp_path / "junk.json").write_text('{"zoo": {"receipt": {"node": 1}}}')
    assert verify(tmp_path / "junk.json").returncode == 2
    assert verify(tmp_path / "missing.json").returncode == 2


def test_a_request_for_a_receipt_is_refused_where_it_is_malformed(node: NodeProcess) -> None:
    http = str(node.info["http"]) + "/v1"
    body = {"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "max_tokens": 2, "zoo": {"receipt": "yes please"},
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    r = httpx.post(f"{http}/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and "receipt" in r.text
    with NodeClient(node.address) as c, pytest.raises(grpc.RpcError) as e:
        c.inference.Infer(pb.InferRequest(receipt=True), timeout=30)  # no prompt: refused before anything
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# ------------------------------------------------------------------------------------------------ proofs


def verify_answer(node: NodeProcess, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zoo.node.cli", "verify-answer", str(path), "--address", node.address],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def check_proof(c: NodeClient, proof: AnswerProof | dict) -> pb.VerifyAnswerResponse:
    doc = proof.to_json() if isinstance(proof, AnswerProof) else proof
    return c.inference.VerifyAnswer(pb.VerifyAnswerRequest(proof=json.dumps(doc)), timeout=120)


def test_a_grpc_answer_carries_a_proof_that_the_node_accepts_and_cheats_it_rejects(node: NodeProcess) -> None:
    request = pb.InferRequest(
        prompt=GEOMETRY, k=3, receipt=True, proof=True, sampling=pb.SamplingParams(max_tokens=40)
    )
    with NodeClient(node.address) as c:
        st = c.status()
        answer = c.inference.Infer(request, timeout=120)
        streamed = list(c.inference.InferStream(request, timeout=120))[-1].final
        plain = c.inference.Infer(pb.InferRequest(prompt=GEOMETRY, sampling=pb.SamplingParams(max_tokens=2)))
        assert plain.proof == ""  # only on request
        assert answer.experiences, f"the claim below differs by its experiences ({answer.library_root})"
        for response in (answer, streamed):
            proof = answer_proof.parse(response.proof)
            assert proof.model == "0x" + st.model_sha256 and proof.temperature == 0
            assert len(proof.output_ids) == response.usage.completion_tokens
            assert len(proof.prompt_ids) == response.usage.prompt_tokens  # experiences included
            assert parse(receipt_from_proto(response.receipt)).proof == proof.sha256()  # the receipt names it
            verdict = check_proof(c, proof)
            assert verdict.accepted, verdict.reason
            assert verdict.model_sha256 == st.model_sha256 and len(verdict.chunks) == 2
        proof = answer_proof.parse(answer.proof)
        # The last token replaced by the least likely one the verifier sees: no commitment reads it, the
        # token check does.
        last = dataclasses.replace(proof, output_ids=(*proof.output_ids[:-1], 0))
        verdict = check_proof(c, last)
        assert not verdict.accepted and f"output token {len(proof.output_ids) - 1}" in verdict.reason
        # An earlier token changed: the states after it are not the committed ones (or the token check).
        early = dataclasses.replace(proof, output_ids=(*proof.output_ids[:3], 77, *proof.output_ids[4:]))
        assert not check_proof(c, early).accepted
        # Another prompt claimed (the experiences left out): the states do not match.
        bare = c.inference.Infer(
            pb.InferRequest(prompt=GEOMETRY, disable_experiences=True, proof=True,
                            sampling=pb.SamplingParams(max_tokens=2)), timeout=120,
        )  # fmt: skip
        claimed = dataclasses.replace(proof, prompt_ids=answer_proof.parse(bare.proof).prompt_ids)
        verdict = check_proof(c, claimed)
        assert not verdict.accepted and "do not match their commitment" in verdict.reason
        # Other weights named: this node cannot check it, and says which weights it needs.
        with pytest.raises(grpc.RpcError) as e:
            check_proof(c, dataclasses.replace(proof, model="0x" + OTHER_WEIGHTS))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert OTHER_WEIGHTS in e.value.details() and st.model_sha256 in e.value.details()
        # Made by other kernels (another llama.cpp build): not checkable here, saying which.
        with pytest.raises(grpc.RpcError) as e:
            check_proof(c, dataclasses.replace(proof, kernels="llama-cpp-python 0.0.1; AVX2"))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "0.0.1" in e.value.details()
        # Not a proof: refused before any prefill.
        for text in ("{}", "junk", json.dumps({**proof.to_json(), "commitments": "AAAA"})):
            with pytest.raises(grpc.RpcError) as e:
                c.inference.VerifyAnswer(pb.VerifyAnswerRequest(proof=text), timeout=30)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_verify_answer_checks_an_http_answer_and_its_receipt(node: NodeProcess, tmp_path: Path) -> None:
    http = str(node.info["http"]) + "/v1"
    body = {"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "max_tokens": 24, "temperature": 0.8, "seed": 3,
            "top_p": 0.9,
            "zoo": {"receipt": True, "proof": True},
            "messages": [{"role": "user", "content": GEOMETRY}]}  # fmt: skip
    r = httpx.post(f"{http}/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["zoo"]["proof"]["temperature"] == 0.8
    good = tmp_path / "answer.json"
    good.write_text(json.dumps(answer))
    ok = verify_answer(node, good)
    assert ok.returncode == 0 and "accepted" in ok.stdout and "names this proof" in ok.stdout, ok.stderr
    # A proof swapped for another answer's: its receipt names another proof.
    swapped = json.loads(good.read_text())
    swapped["zoo"]["proof"]["output_ids"][-1] = 31_000  # a rare token: far outside the 0.9 nucleus
    (tmp_path / "swapped.json").write_text(json.dumps(swapped))
    refused = verify_answer(node, tmp_path / "swapped.json")
    assert refused.returncode == 1 and "names another proof" in refused.stderr
    # The proof alone, tampered: the node rejects it.
    (tmp_path / "tampered.json").write_text(json.dumps(swapped["zoo"]["proof"]))
    refused = verify_answer(node, tmp_path / "tampered.json")
    assert refused.returncode == 1 and "rejected" in refused.stderr
    # Other weights: not checkable here (exit 3), naming the hash it needs.
    other = {**answer["zoo"]["proof"], "model": "0x" + OTHER_WEIGHTS}
    (tmp_path / "other.json").write_text(json.dumps(other))
    elsewhere = verify_answer(node, tmp_path / "other.json")
    assert elsewhere.returncode == 3 and OTHER_WEIGHTS in elsewhere.stderr
    (tmp_path / "junk.json").write_text('{"format": "zoo.answer-proof/1"}')
    assert verify_answer(node, tmp_path / "junk.json").returncode == 2
    # A proof covers one answer, of at most 64 new tokens (what was measured to verify).
    r = httpx.post(f"{http}/chat/completions", json={**body, "n": 2}, timeout=60)
    assert r.status_code == 400 and "n must be 1" in r.text
    r = httpx.post(f"{http}/chat/completions", json={**body, "max_tokens": 65}, timeout=60)
    assert r.status_code == 400 and "at most 64 new tokens" in r.text, r.text
    with NodeClient(node.address) as c, pytest.raises(grpc.RpcError) as e:
        c.inference.Infer(
            pb.InferRequest(prompt=GEOMETRY, proof=True, sampling=pb.SamplingParams(max_tokens=100))
        )
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 64" in e.value.details()
