"""Benchmark the node's check of a signed request (node.credits): what a zoo-signature costs per request.

For --requests requests signed in advance (fresh nonces, one client), the node's RequestVerifier.verify
is timed one request at a time: header parsing, the EIP-712 digest, secp256k1 recovery (coincurve) and
the replay bookkeeping, for a small and a large body. Baselines in the same run, on the same requests:

  sha256(body)         hashing the body alone (the floor: a signature over the body must read it)
  secp256k1 recover    the public key recovery alone (coincurve, C): the floor of any signature check
  eth_account          the same check through eth_account (encode_typed_data + recover_message), the
                       library path the node's hand-written digest replaces

The issue's goal: at most 0.2 ms per request.

Run: .venv/bin/python benchmarks/signing.py [--requests 3000]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from collections.abc import Callable

from eth_account import Account
from eth_account.messages import encode_typed_data

from zoo.node.credits.signing import (
    body_digest,
    parse_header,
    recover_signer,
    request_digest,
    sign_request,
    typed_request,
)
from zoo.node.credits.verifier import RequestVerifier

METHOD = "/zoo.v1.InferenceService/Infer"


def timed(fn: Callable[[int], object], n: int) -> list[float]:
    """Microseconds of fn(i) for each i."""
    samples = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        samples.append((time.perf_counter() - t) * 1e6)
    return samples


def measure(size: int, requests: int) -> dict[str, list[float]]:
    """Per-request microseconds of each check, for bodies of `size` bytes."""
    client = Account.from_key("0x" + "11" * 32)
    node = Account.from_key("0x" + "22" * 32).address
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    headers = [sign_request(client, node, METHOD, body) for _ in range(requests)]
    verifier = RequestVerifier(node, not_before=0)
    parsed = [parse_header(h) for h in headers]
    node_bytes = bytes.fromhex(node[2:])
    digests = [request_digest(node_bytes, METHOD, body_digest(body), h.timestamp, h.nonce) for h in parsed]

    def library_check(i: int) -> None:
        h = parsed[i]
        message = encode_typed_data(full_message=typed_request(node, METHOD, body, h.timestamp, h.nonce))
        assert Account.recover_message(message, signature=h.signature) == h.signer

    return {
        "node: RequestVerifier.verify": timed(lambda i: verifier.verify(headers[i], METHOD, body), requests),
        "sha256(body)": timed(lambda i: hashlib.sha256(body).digest(), requests),
        "secp256k1 recover": timed(lambda i: recover_signer(digests[i], parsed[i].signature), requests),
        "eth_account recover": timed(library_check, min(requests, 500)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    print(f"{'body':>8}  {'check':<28}{'p50 µs':>9}{'mean µs':>9}{'p99 µs':>9}  {'vs node p50':>11}")
    for size in (1_000, 16_000):
        rows = measure(size, args.requests)
        node_p50 = statistics.median(rows["node: RequestVerifier.verify"])
        for name, samples in rows.items():
            samples.sort()
            p50, p99 = statistics.median(samples), samples[int(len(samples) * 0.99) - 1]
            print(
                f"{size:>7}B  {name:<28}{p50:>9.1f}{statistics.fmean(samples):>9.1f}{p99:>9.1f}"
                f"  {p50 / node_p50:>10.2f}×"
            )
    print("goal: the node's check at most 200 µs per request")


if __name__ == "__main__":
    main()
