"""A routed request that asks for a proof, sent to a peer that serves another model under the same name:
the router's own check of the peer's proof (one prefill of its weights) catches it, the peer loses score
and is banned at the second offence, and the honest peer answers.

The peers are real gRPC servers over sockets, each answering with a real engine on a real llama.cpp model:
the honest one on the bundled Q4_1, the cheat on a Q8_0 made from it by llama.cpp's quantizer, advertising
the Q4_1's name and hash. The cheat's lie (its capabilities, and the hash its proofs name) is written by the
test: it stands in for a node whose software lies."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is built by ./zoo setup")
import llama_cpp

from zoo.inference.bundled_models import bundled_gguf
from zoo.inference.engine import InferenceEngine, InferOutcome, InferParams
from zoo.inference.llamacpp.llamacpp_backend import LlamaCppBackend
from zoo.inference.provenance import answer_proof
from zoo.inference.provenance.weights import file_sha256
from zoo.node.api.serving import proof_text
from zoo.node.p2p.messages import Capabilities
from zoo.node.p2p.peers import PeerBook
from zoo.node.p2p.routing import NoCapablePeer, Router, engine_check
from zoo.v1 import inference_pb2 as pb
from zoo.v1 import inference_pb2_grpc

# Catching Q8_0 rests on measured numbers (its worst chunk's mantissa mean 2.3 or more against a bound of
# 1.5): ./zoo test runs it again under the AVX2 build (passed there too, on an AVX-512 CPU capped to AVX2).
pytestmark = pytest.mark.numerics

BUNDLED = "HuggingFaceTB/SmolLM2-135M-Instruct"
HONEST, CHEAT, FRANK = (f"12D3KooW{name * 44}"[:52] for name in ("H", "C", "F"))


class NoLibrary:
    def resolve(self, root: str) -> tuple:
        return None, "", 0, None


class Peer(inference_pb2_grpc.InferenceServiceServicer):
    """A peer reduced to its model: Infer answered by a real engine; `claim`, when set, is the weights'
    hash its proofs name whatever weights made them (a lying node's)."""

    def __init__(self, engine: InferenceEngine, claim: str = "") -> None:
        self.engine, self.claim, self.asked = engine, claim, 0

    async def Infer(self, request: pb.InferRequest, context: grpc.aio.ServicerContext) -> pb.InferResponse:
        self.asked += 1
        params = InferParams([{"role": "user", "content": request.prompt}], disable_experiences=True,
                             max_tokens=request.sampling.max_tokens, proof=request.proof)  # fmt: skip
        outcome = None
        async for item in self.engine.stream(params):
            if isinstance(item, InferOutcome):
                outcome = item
        assert outcome is not None
        proof = outcome.proof
        if proof is not None and self.claim:
            proof = dataclasses.replace(proof, model="0x" + self.claim)
        return pb.InferResponse(text=outcome.text, proof=proof_text(proof) if proof is not None else "")


def q8_0(where: Path) -> Path:
    """The bundled model requantized to Q8_0 by llama.cpp's own quantizer."""
    dest = where / "SmolLM2-135M-Instruct.Q8_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, True, 2
    assert llama_cpp.llama_model_quantize(str(bundled_gguf()).encode(), str(dest).encode(), params) == 0
    return dest


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    yield {"q4_1": bundled_gguf(), "q8_0": q8_0(tmp_path_factory.mktemp("q8"))}


def engine(path: Path) -> InferenceEngine:
    backend = LlamaCppBackend.load(path, BUNDLED, max_batch_size=4, context_length=1024, threads=2)
    return InferenceEngine(backend, NoLibrary(), model_sha256=file_sha256(path))


def test_a_peer_serving_other_weights_under_the_same_name_is_caught_by_its_proof(
    weights: dict[str, Path], tmp_path: Path
) -> None:
    asyncio.run(_routes(weights, tmp_path))


async def _routes(weights: dict[str, Path], tmp_path: Path) -> None:
    served = file_sha256(weights["q4_1"])
    mine, other = engine(weights["q4_1"]), engine(weights["q8_0"])
    peers = {HONEST: Peer(mine), CHEAT: Peer(other, claim=served), FRANK: Peer(other)}
    servers, book = [], PeerBook(tmp_path / "peers.json", ttl_s=600)
    for load, peer_id in enumerate((CHEAT, FRANK, HONEST)):  # asked in this order (least loaded first)
        servicer = peers[peer_id]
        server = grpc.aio.server()
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        # What each advertises: the bundled model by name and by the Q4_1's hash (the cheats lie).
        caps = Capabilities(models=[BUNDLED], model_sha256=served, grpc=f"127.0.0.1:{port}", load=load / 10,
                            backend="llamacpp")  # fmt: skip
        book.set_capabilities(peer_id, caps)
    router = Router(book, timeout_s=120, check_proof=engine_check(lambda: mine), model_sha256=served)
    ask = lambda proof: router.infer(  # noqa: E731
        pb.InferRequest(prompt="Why is the sea salty?", model=BUNDLED, proof=proof,
                        sampling=pb.SamplingParams(max_tokens=40)),
    )  # fmt: skip
    try:
        # What this node cannot check is no offence: a proof of another llama.cpp build, or while loading.
        honest = (
            await Peer(mine).Infer(
                pb.InferRequest(prompt="Hi", proof=True, sampling=pb.SamplingParams(max_tokens=4)), None
            )
        ).proof
        proof = answer_proof.parse(honest)
        assert (await engine_check(lambda: mine)(proof)).accepted
        elsewhere = dataclasses.replace(proof, kernels="llama-cpp-python 0.0.1; AVX2")
        assert await engine_check(lambda: mine)(elsewhere) is None
        assert await engine_check(lambda: None)(proof) is None
        # Without a proof asked for, nothing tells the cheat's answer apart: it answers (least loaded).
        assert (await ask(False)).served_by == CHEAT
        # With one: the cheat's proof (of Q8_0's states, naming Q4_1) fails this node's check; it is
        # penalised and the next peer asked. FRANK names its own weights, which it does not advertise.
        answer = await ask(True)
        assert answer.served_by == HONEST and answer.proof
        assert peers[CHEAT].asked == 2 and peers[FRANK].asked == 1
        for peer_id in (CHEAT, FRANK):
            record = next(r for r in book.records() if r.peer_id == peer_id)
            assert record.offences == {"wrong_model": 1} and record.score <= -19.9
        # A second offence bans: the cheats are no longer asked at all.
        assert (await ask(True)).served_by == HONEST
        assert book.banned(CHEAT) and book.banned(FRANK)
        assert [p for p, _ in router.candidates(BUNDLED)] == [HONEST]
        # With the honest peer gone too, the request fails, naming why each refused.
        book.penalise(HONEST, "wrong_model")
        book.penalise(HONEST, "wrong_model")
        with pytest.raises(NoCapablePeer):
            await ask(True)
    finally:
        for server in servers:
            await server.stop(None)
        await router.close()
        await mine.backend.close()
        await other.backend.close()
