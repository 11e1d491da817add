"""Signed requests and durable metering (node.credits): the EIP-712 digest against eth_account, every
refusal the verifier makes, usage shares, the meter's group commit, and `kill -9` of a process metering.
The node-level paths (gRPC metadata, HTTP header, usage of real answers) are in
tests/node/api/test_inference_service.py."""

from __future__ import annotations

import asyncio
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_hash.auto import keccak
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import NodeProcess
from zoo.node.client import NodeClient, SignedAuth
from zoo.node.credits.meter import Served, UsageMeter, shares_of
from zoo.node.credits.signing import (
    HEADER,
    SignatureError,
    body_digest,
    parse_header,
    recover_signer,
    request_digest,
    sign_request,
    typed_request,
)
from zoo.node.credits.verifier import RequestVerifier, TooManyNonces
from zoo.v1 import inference_pb2 as pb

CLIENT = Account.from_key("0x" + "11" * 32)
NODE = Account.from_key("0x" + "22" * 32).address
METHOD = "/zoo.v1.InferenceService/Infer"
BODY = b"\n\x05hello"
N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def verifier(clock: Clock, **kw) -> RequestVerifier:
    return RequestVerifier(NODE, not_before=clock.t - 3600, clock=clock, **kw)


def signed(clock: Clock, **kw) -> str:
    kw.setdefault("timestamp", int(clock.t))
    return sign_request(CLIENT, kw.pop("node", NODE), kw.pop("method", METHOD), kw.pop("body", BODY), **kw)


@settings(max_examples=40, deadline=None)
@given(
    method=st.text(max_size=80),
    body=st.binary(max_size=300),
    timestamp=st.integers(0, 2**64 - 1),
    nonce=st.integers(0, 2**64 - 1),
)
def test_the_digest_is_eip712_as_eth_account_computes_it(
    method: str, body: bytes, timestamp: int, nonce: int
) -> None:
    message = encode_typed_data(full_message=typed_request(NODE, method, body, timestamp, nonce))
    expected = keccak(b"\x19" + message.version + message.header + message.body)
    assert request_digest(bytes.fromhex(NODE[2:]), method, body_digest(body), timestamp, nonce) == expected


def test_a_signed_request_names_its_signer_once() -> None:
    clock = Clock()
    v = verifier(clock)
    header = signed(clock)
    assert v.verify(header, METHOD, BODY).address == CLIENT.address
    with pytest.raises(SignatureError, match=r"nonce \d+ of 0x.* was used already") as e:
        v.verify(header, METHOD, BODY)
    assert e.value.reason == "replayed"
    # A fresh nonce is a fresh request.
    assert v.verify(signed(clock), METHOD, BODY).address == CLIENT.address


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"body": b"another body"}, "not 0x.*'s for this request"),
        ({"method": "POST /v1/completions"}, "not 0x.*'s for this request"),
        ({"node": Account.from_key("0x" + "33" * 32).address}, "not 0x.*'s for this request"),
    ],
)
def test_a_signature_covers_body_method_and_node(change: dict, match: str) -> None:
    clock = Clock()
    header = signed(clock, **change)
    with pytest.raises(SignatureError, match=match) as e:
        verifier(clock).verify(header, METHOD, BODY)
    assert e.value.reason == "forged"


def test_a_signature_claimed_for_another_signer_is_forged() -> None:
    clock = Clock()
    other = Account.from_key("0x" + "44" * 32).address
    header = signed(clock).replace(f"signer={CLIENT.address}", f"signer={other}")
    with pytest.raises(SignatureError, match=f"not {other}'s") as e:
        verifier(clock).verify(header, METHOD, BODY)
    assert e.value.reason == "forged"


def test_malleable_and_impossible_signatures_are_refused() -> None:
    clock = Clock()
    header = parse_header(signed(clock))
    digest = request_digest(
        bytes.fromhex(NODE[2:]), METHOD, body_digest(BODY), header.timestamp, header.nonce
    )
    assert recover_signer(digest, header.signature).hex() == CLIENT.address[2:].lower()
    r, s, v = header.signature[:32], int.from_bytes(header.signature[32:64], "big"), header.signature[64]
    twin = r + (N - s).to_bytes(32, "big") + bytes([55 - v])  # the same signer's other valid signature
    with pytest.raises(SignatureError, match="out of range"):
        recover_signer(digest, twin)
    with pytest.raises(SignatureError, match="out of range"):
        recover_signer(digest, bytes(64) + b"\x1b")
    with pytest.raises(SignatureError, match="out of range"):
        recover_signer(digest, header.signature[:64] + b"\x05")


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("", "must be signer=0x"),
        ("signer=0x12,timestamp=1,nonce=1,signature=0x00", "signer must be 0x and 40 hex"),
        (f"signer={NODE},timestamp=1,nonce=1", "lacks signature"),
        (f"signer={NODE},timestamp=-1,nonce=1,signature=0x" + "00" * 65, "timestamp must be an integer"),
        (f"signer={NODE},timestamp=1,nonce={2**64},signature=0x" + "00" * 65, "nonce must be an integer"),
        (f"signer={NODE},timestamp=1,nonce=1,signature=0x" + "00" * 64, "130 hex digits"),
        (f"signer={NODE},signer={NODE},timestamp=1,nonce=1,signature=0x" + "00" * 65, "names signer twice"),
        (f"signer={NODE},timestamp=1,nonce=1,signature=0x" + "00" * 65 + ",extra=1", "got a part 'extra=1'"),
        ("x" * 600, "more than 512"),
    ],
)
def test_malformed_headers_are_refused_saying_what_is_wrong(value: str, match: str) -> None:
    with pytest.raises(SignatureError, match=match) as e:
        verifier(Clock()).verify(value, METHOD, BODY)
    assert e.value.reason == "malformed"


def test_stale_timestamps_are_refused_either_way_and_before_start() -> None:
    clock = Clock()
    v = RequestVerifier(NODE, max_skew_s=60, not_before=clock.t - 120, clock=clock)
    for skew in (-61, 61):
        with pytest.raises(SignatureError, match="more than 60 s apart") as e:
            v.verify(signed(clock, timestamp=int(clock.t) + skew), METHOD, BODY)
        assert e.value.reason == "stale"
    assert v.verify(signed(clock, timestamp=int(clock.t) - 60), METHOD, BODY)
    # Nonces are not kept across a restart, so what was signed before the node started is refused.
    restarted = RequestVerifier(NODE, max_skew_s=60, not_before=clock.t, clock=clock)
    with pytest.raises(SignatureError, match="before this node started"):
        restarted.verify(signed(clock, timestamp=int(clock.t) - 1), METHOD, BODY)


def test_nonces_are_forgotten_once_stale_and_bounded() -> None:
    clock = Clock()
    v = verifier(clock, max_skew_s=10, max_remembered=3)
    for _ in range(3):
        v.verify(signed(clock), METHOD, BODY)
    with pytest.raises(TooManyNonces, match="holds 3 recent nonces"):
        v.verify(signed(clock), METHOD, BODY)
    clock.t += 11  # every remembered request is stale now: a replay of one would be refused as stale
    assert v.verify(signed(clock), METHOD, BODY) and v.remembered() == 1


def test_shares_go_to_the_authors_of_cited_experiences_else_of_all_served() -> None:
    a, b, c = "0x" + "a" * 40, "0x" + "b" * 40, "job:tfgrpo-1"
    served = [Served("exp-2", b, False), Served("exp-1", a, True), Served("exp-3", a, True)]
    assert shares_of(101, served) == {a: 101}  # only the cited ones earn
    uncited = [Served("exp-2", b, False), Served("exp-1", a, False), Served("exp-3", c, False)]
    assert shares_of(100, uncited) == {a: 34, b: 33, c: 33}  # the remainder to the first by id
    assert sum(shares_of(7, uncited).values()) == 7
    assert shares_of(0, served) == {} and shares_of(50, []) == {}


def test_the_meter_totals_concurrent_requests_exactly(tmp_path: Path) -> None:
    clock = Clock(86_400 * 100 + 5)
    meter = UsageMeter(tmp_path / "usage.sqlite", epoch_s=86_400, clock=clock)
    a, b = "0x" + "a" * 40, "0x" + "b" * 40
    served = [Served("exp-1", a, True), Served("exp-2", b, False)]

    def answer(n: int) -> None:
        for _ in range(n):
            meter.submit(meter.usage_of(10, served, client="0x" + "c" * 40)).result()

    threads = [threading.Thread(target=answer, args=(50,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    clock.t += 86_400  # the next epoch
    meter.submit(meter.usage_of(3, served)).result()
    assert [(u.author, u.units, u.requests) for u in meter.by_author(100)] == [(a, 4000, 400)]
    assert meter.answered(100) == (400, 4000) and meter.answered(101) == (1, 3)
    assert meter.epochs() == [100, 101]
    assert meter.experience_counts() == {"exp-1": 401, "exp-2": 401}
    assert [(c.client, c.units, c.requests, c.spent) for c in meter.by_client(100)] == [
        ("0x" + "c" * 40, 4000, 400, 0)
    ]
    assert meter.by_client(101) == []  # anonymous
    meter.close()
    reopened = UsageMeter(tmp_path / "usage.sqlite", epoch_s=86_400, clock=clock)
    assert reopened.answered(100) == (400, 4000)
    assert reopened.experience_counts() == {"exp-1": 401, "exp-2": 401}  # all epochs, read back at open
    reopened.close()


_METERING_CHILD = textwrap.dedent(
    """
    import sys
    from zoo.node.credits.meter import Served, UsageMeter
    meter = UsageMeter(sys.argv[1], epoch_s=10**9)
    served = [Served("exp-1", "0x" + "a" * 40, True)]
    futures = []
    n = 0
    while True:  # keep many in flight, as concurrent answers are; acknowledge each once it is committed
        futures.append(meter.submit(meter.usage_of(1, served)))
        if len(futures) >= 16:
            futures.pop(0).result()
            n += 1
            print(n, flush=True)
    """
)


def test_kill_9_while_metering_loses_no_acknowledged_usage(tmp_path: Path) -> None:
    db = tmp_path / "usage.sqlite"
    acknowledged = 0
    rng = random.Random(7)
    for _round in range(5):
        child = subprocess.Popen(
            [sys.executable, "-c", _METERING_CHILD, str(db)], stdout=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + rng.uniform(0.3, 1.5)
        last = 0
        assert child.stdout is not None
        for line in child.stdout:
            last = int(line)
            if time.monotonic() > deadline and last > 0:
                break
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        # The child went on acknowledging until the kill reached it: those lines are in the pipe.
        for line in child.stdout:
            if line.endswith("\n"):
                last = int(line)
        acknowledged += last
        con = sqlite3.connect(db)
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        (answered,) = con.execute("SELECT SUM(answered) FROM requests").fetchone()
        (units,) = con.execute("SELECT SUM(units) FROM usage").fetchone()
        con.close()
        # Everything acknowledged is there; at most the requests in flight at the kill are there beyond it.
        assert acknowledged <= answered == units <= acknowledged + 16 * (_round + 1)
        acknowledged = answered  # what the next round starts from


# -- a node that serves signed requests only (no model needed: the refusals come first)


@pytest.fixture(scope="module")
def signed_only(tmp_path_factory: pytest.TempPathFactory):
    from tests.conftest import base_config, launch, write_config

    tmp = tmp_path_factory.mktemp("signed-only")
    data_dir = tmp / "data"
    cfg = write_config(tmp / "node.toml", base_config(data_dir, {"credits": {"allow_anonymous": False}}))
    node = launch(cfg, data_dir)
    node.wait_listening()
    yield node
    node.stop()


def test_a_node_serving_signed_requests_only_refuses_unsigned_ones(signed_only: NodeProcess) -> None:
    with NodeClient(signed_only.address) as c:
        status = c.status()
        assert not status.allows_anonymous and status.node_address.startswith("0x")
        with pytest.raises(grpc.RpcError) as e:
            c.inference.Infer(pb.InferRequest(prompt="hi"), timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "signed requests only" in e.value.details() and status.node_address in e.value.details()
    # A signed request passes the gate (and then waits for the model like any other). Signatures carry
    # whole seconds, and one from the second the node started in is refused as possibly older than the
    # node (its nonces from before a restart are forgotten): sign from the next second on.
    time.sleep(math.ceil(time.time()) - time.time())
    with NodeClient(signed_only.address, signer=CLIENT) as c:
        try:
            c.inference.Infer(
                pb.InferRequest(prompt="hi", sampling=pb.SamplingParams(max_tokens=1)), timeout=2
            )
        except grpc.RpcError as e:
            assert e.code() != grpc.StatusCode.UNAUTHENTICATED, e.details()
    base = str(signed_only.info["http"])
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "signature_unsigned"
    forged = signed(Clock(time.time()), node=status.node_address, body=b"{}")
    r = httpx.post(f"{base}/v1/chat/completions", json=body, headers={HEADER: forged}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "signature_forged"
    with httpx.Client(auth=SignedAuth(CLIENT, status.node_address), timeout=30) as http:
        r = http.post(f"{base}/v1/embeddings", json={"model": "x", "input": "hi"})
    assert r.status_code != 401, r.text


def test_the_credit_book_charges_at_most_what_is_held_and_what_the_client_allowed() -> None:
    from zoo.node.credits.book import CreditBook
    from zoo.registry.spend import SpendAuthorization

    def allows(units: int, epoch: int = 1, client: str = CLIENT.address) -> SpendAuthorization:
        return SpendAuthorization(client, NODE, epoch, units, b"")  # checked by Identify, not the book

    reads: list[str] = []
    balances = {CLIENT.address: 100}
    spent_in = {(CLIENT.address, 2): 45}  # the meter's record of an epoch's spends
    now = [0.0]

    def balance_of(client: str) -> int:
        reads.append(client)
        return balances.get(client, 0)

    book = CreditBook(
        balance_of, spent_unsettled=lambda c: 30, spent_in=lambda c, e: spent_in.get((c, e), 0),
        price_per_token=1.5, ttl_s=5, clock=lambda: now[0],
    )  # fmt: skip
    plenty = allows(1000)

    async def main() -> None:
        # A signed client that sent no consent is never a holder and never charged, whatever it holds.
        assert await book.available(CLIENT.address) == 0 and book.charge(CLIENT.address, 10) == 0
        assert await book.available(CLIENT.address, allows(1000, client=NODE)) == 0  # another's consent
        assert await book.available(CLIENT.address, plenty) == 70  # 100 on chain, 30 spent here unsettled
        assert book.charge(CLIENT.address, 10) == 0  # it holds credits, but this answer came without consent
        assert await book.is_holder(CLIENT.address, plenty) and not await book.is_holder("", plenty)
        assert (
            book.charge(CLIENT.address, 10, plenty) == 15 and book.charge(CLIENT.address, 100, plenty) == 55
        )
        assert book.charge(CLIENT.address, 5, plenty) == 0 and not await book.is_holder(
            CLIENT.address, plenty
        )
        assert book.charge("", 10, plenty) == 0 and book.charge(NODE, 10, allows(9, client=NODE)) == 0
        assert reads == [CLIENT.address]  # cached
        now[0] += 6
        balances[CLIENT.address] = 500
        # The consent bounds charges too: 80 allowed this epoch, of which 70 were charged already.
        small = allows(80)
        assert await book.available(CLIENT.address, small) == 10 and len(reads) == 2
        assert book.charge(CLIENT.address, 100, small) == 10 and book.charge(CLIENT.address, 1, small) == 0
        # Another epoch's consent counts from what that epoch's spends were (the meter's, read once).
        assert await book.available(CLIENT.address, allows(50, epoch=2)) == 5

        def broken(_client: str) -> int:
            raise ConnectionError("chain down")

        failing = CreditBook(broken)
        assert await failing.available(CLIENT.address, plenty) == 0  # served, without priority

        bounded = CreditBook(lambda c: 7, max_clients=2)
        for who in ("0x" + "1" * 40, "0x" + "2" * 40, "0x" + "3" * 40):
            assert await bounded.available(who, allows(100, client=who)) == 7
        # The oldest was dropped: read again when next seen.
        assert bounded.charge("0x" + "1" * 40, 1, allows(100, client="0x" + "1" * 40)) == 0
        assert bounded.charge("0x" + "3" * 40, 1, allows(100, client="0x" + "3" * 40)) == 1

    asyncio.run(main())


def test_a_spend_header_is_the_signers_consent_for_this_node_and_epoch() -> None:
    from zoo.node.credits.consent import SpendCheck, SpendUnavailable
    from zoo.node.credits.identity import Identify
    from zoo.node.credits.signing import parse_spend_header, spend_header
    from zoo.node.metrics import NodeMetrics
    from zoo.registry.spend import sign_spend_authorization

    ledger, chain = "0x" + "ab" * 20, [31337]
    check = SpendCheck(NODE, ledger, lambda: chain[0], lambda: 7)

    def header(account: object = CLIENT, epoch: int = 7, node: str = NODE, units: int = 500) -> str:
        a = sign_spend_authorization(account, 31337, ledger, node, epoch, units)
        return spend_header(a.epoch, a.units, a.signature)

    consent = check.check(header(), CLIENT.address)
    assert (consent.client, consent.node, consent.epoch, consent.units) == (CLIENT.address, NODE, 7, 500)
    with pytest.raises(SignatureError, match="authorizes epoch 6, but this node's epoch is 7") as stale:
        check.check(header(epoch=6), CLIENT.address)
    assert stale.value.reason == "stale"
    for forged in (header(account=Account.create()), header(node=CLIENT.address)):
        with pytest.raises(SignatureError, match="is not 0x") as caught:
            check.check(forged, CLIENT.address)
        assert caught.value.reason == "forged"
    chain[0] = 0
    with pytest.raises(SpendUnavailable, match="not reached its chain"):
        check.check(header(), CLIENT.address)
    chain[0] = 31337
    for bad, match in [
        ("epoch=7,units=5", "lacks signature"),
        ("epoch=7,units=-5,signature=0x" + "00" * 65, "units must be an integer"),
        ("epoch=7,epoch=7,units=5,signature=0x00", "once each"),
        ("epoch=7,units=5,signature=0x1234", "130 hex digits"),
        ("x" * 600, "more than 512"),
    ]:
        with pytest.raises(SignatureError, match=match):
            parse_spend_header(bad)
    # Through Identify: the consent rides on the signed request; alone, or at a node without a ledger,
    # it is refused saying why.
    clock = Clock()
    metrics = NodeMetrics("test")
    identify = Identify(verifier(clock), metrics, spends=check)
    body = b"{}"
    signature = sign_request(CLIENT, NODE, "POST /v1/x", body, timestamp=int(clock()), nonce=1)
    client = identify(signature, "POST /v1/x", body, header())
    assert client.address == CLIENT.address and client.spend == consent
    with pytest.raises(SignatureError, match="needs a zoo-signature header"):
        identify(None, "POST /v1/x", body, header())
    without_ledger = Identify(verifier(clock), metrics)
    again = sign_request(CLIENT, NODE, "POST /v1/x", body, timestamp=int(clock()), nonce=2)
    with pytest.raises(SignatureError, match="takes no credits"):
        without_ledger(again, "POST /v1/x", body, header())
