"""Proofs of inference on a real node serving the bundled model through the transformers backend (no chain;
gRPC and HTTP over sockets): an HTTP answer's proof is accepted by the node's VerifyAnswer, names the
transformers kernels, and a tampered one is rejected; the backend's own length limit is enforced."""

from __future__ import annotations

import dataclasses
import json

import grpc
import httpx
import pytest

from tests.node.provenance.test_node_provenance import check_proof
from zoo.inference.provenance import answer_proof
from zoo.inference.transformers_backend import MAX_PROVEN_TOKENS
from zoo.node.client import NodeClient
from zoo.v1 import inference_pb2 as pb

pytestmark = pytest.mark.numerics


def test_a_transformers_node_proves_its_answers_and_checks_proofs(start_node) -> None:
    node = start_node(extra={"model": {"backend": "transformers", "threads": 2}})
    node.wait_component("model", "SERVING", timeout_s=180)
    body = {"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "max_tokens": 40, "zoo": {"proof": True},
            "messages": [{"role": "user", "content": "Name two rivers and where they flow."}]}  # fmt: skip
    r = httpx.post(str(node.info["http"]) + "/v1/chat/completions", json=body, timeout=180)
    assert r.status_code == 200, r.text
    proof = answer_proof.parse(r.json()["zoo"]["proof"])
    assert proof.kernels.startswith("transformers ") and "torch " in proof.kernels
    with NodeClient(node.address) as c:
        assert proof.model == "0x" + c.status().model_sha256
        verdict = check_proof(c, proof)
        assert verdict.accepted, verdict.reason
        assert all(ch.exponent_matches == 128 for ch in verdict.chunks)  # the prover's prefill, recomputed
        early = dataclasses.replace(proof, output_ids=(*proof.output_ids[:3], 77, *proof.output_ids[4:]))
        assert not check_proof(c, early).accepted
        with pytest.raises(grpc.RpcError) as e:  # a llama.cpp proof of the same weights: other kernels
            check_proof(c, dataclasses.replace(proof, kernels="llama-cpp-python 0.3.16; AVX2"))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "transformers" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            c.inference.VerifyAnswer(pb.VerifyAnswerRequest(proof=json.dumps({"format": 1})), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    r = httpx.post(str(node.info["http"]) + "/v1/chat/completions",
                   json={**body, "max_tokens": MAX_PROVEN_TOKENS + 1}, timeout=60)  # fmt: skip
    assert r.status_code == 400 and f"at most {MAX_PROVEN_TOKENS} new tokens" in r.text, r.text
