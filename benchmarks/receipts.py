"""Benchmark what the receipts behind usage reports cost (node.credits.receipt_log): per answer metered,
and per receipt audited.

Since each answer's receipt is signed and committed with its usage, metering an answer does more: the
prompt's hash (the JSON of the messages as the model saw them), the EIP-712 signature, and about 1 KB more
per answer in the same SQLite transaction. Measured on a real UsageMeter on this machine's disk, in
alternating rounds, beside the baseline of the same run:

  usage only        what metering did before receipts (the usage rows, one commit and fsync)
  usage + receipt   the same answers with their receipts signed and committed with them

each one answer at a time (every commit its own fsync: the worst case) and 16 at once (grouped into one
commit, as concurrent answers are). Then, for the epoch's --receipts receipts: the published document's
bytes per receipt, building it with its tree (what settlement adds), and the audit (`credits audit`: every
signature recovered, every record recomputed) per receipt, beside checking the report's records against
their root alone (what `credits show` does).

Run: ./zoo bench receipts [--answers 400 --rounds 3 --receipts 5000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import wait
from pathlib import Path
from types import SimpleNamespace

import coincurve
from eth_hash.auto import keccak
from eth_utils import to_checksum_address

from zoo.inference.provenance.documents import prompt_document, sha256_hex
from zoo.node.credits.meter import Served, UsageMeter, credited_of
from zoo.node.credits.receipt_log import ReceiptsDocument, audit, encode_document, receipts_ref
from zoo.node.provenance.receipts import Notary
from zoo.registry.usage_report import build_report

EPOCH_S = 86_400
AUTHORS = [to_checksum_address("0x" + f"{i + 1:040x}") for i in range(8)]
LESSON = "When a triangle's sides are 3, 4 and 5, it is right-angled: check a^2 + b^2 = c^2 first. " * 4


def messages(i: int) -> list[dict[str, str]]:
    """A prompt as the engine assembles it: a system turn with three experiences, the user's question."""
    lessons = "\n".join(f"[e{i % 50 + k}] {LESSON}" for k in range(3))
    return [{"role": "system", "content": f"Lessons:\n{lessons}"},
            {"role": "user", "content": f"Question {i}: is a 3-4-5 triangle right-angled?"}]  # fmt: skip


def served(i: int) -> list[Served]:
    return [Served(f"e{i % 50 + k}", AUTHORS[(i + k) % len(AUTHORS)], k == 0) for k in range(3)]


def outcome(i: int, prompt_sha256: str) -> SimpleNamespace:
    """The fields of an InferOutcome a receipt reads."""
    return SimpleNamespace(
        choices=[], text=f"Yes: 9 + 16 = 25 ({i}).", adapter="", library_root="ab" * 32,
        prompt_sha256=prompt_sha256, prompt_tokens=180, completion_tokens=40, proof=None,
    )  # fmt: skip


def usage(meter: UsageMeter, notary: Notary | None, i: int) -> object:
    """One answer's usage as answer_metering builds it (with its receipt when `notary` is given)."""
    from zoo.node.credits.metered_receipt import MeteredReceipt

    now = meter.now()
    leaf = b""
    if notary is not None:
        prompt = sha256_hex(prompt_document(messages(i), None, None))
        receipt = notary.receipt(outcome(i, prompt), "0x" + "11" * 32, "", timestamp=int(now))
        leaf = MeteredReceipt.of(receipt, credited_of(served(i)), 0).leaf()
    return meter.usage_of(220, served(i), epoch=meter.epoch_of(now), receipt=leaf)


def per_answer_ms(meter: UsageMeter, notary: Notary | None, n: int, at_once: int) -> float:
    """Milliseconds per answer metered, `at_once` answers submitted together, then waited for."""
    t0 = time.perf_counter()
    for start in range(0, n, at_once):
        wait([meter.submit(usage(meter, notary, start + k)) for k in range(at_once)])  # type: ignore[arg-type]
    return (time.perf_counter() - t0) * 1e3 / n


def main(args: argparse.Namespace) -> None:
    key = coincurve.PrivateKey(os.urandom(32))
    node = to_checksum_address(keccak(key.public_key.format(compressed=False)[1:])[12:])
    notary = Notary(key.secret, node, "cd" * 32)
    with tempfile.TemporaryDirectory(prefix="zoo-bench-receipts-") as tmp:
        meter = UsageMeter(Path(tmp) / "usage.sqlite", EPOCH_S)
        try:
            print(
                f"metering ({args.answers} answers a round, {args.rounds} alternating rounds; ms per answer)"
            )
            for at_once in (1, 16):
                plain: list[float] = []
                signed: list[float] = []
                for _ in range(args.rounds):
                    plain.append(per_answer_ms(meter, None, args.answers, at_once))
                    signed.append(per_answer_ms(meter, notary, args.answers, at_once))
                p, s = statistics.median(plain), statistics.median(signed)
                print(f"  {at_once:2} at once: usage only {p:.3f}, usage + receipt {s:.3f}: {s / p:.2f}x "
                      f"(+{s - p:.3f} ms)")  # fmt: skip
            epoch = meter.epoch_of()
            leaves = meter.receipt_leaves(epoch)[: args.receipts]
        finally:
            meter.close()
    t0 = time.perf_counter()
    data = encode_document(node, epoch, leaves)
    ref = receipts_ref("bafkreibench", leaves)
    build_s = time.perf_counter() - t0
    document = ReceiptsDocument.decode(data)
    earned: dict[str, int] = {}
    for m in document.receipts:
        for a, u in m.shares().items():
            earned[a] = earned.get(a, 0) + u
    report = build_report(node, epoch, EPOCH_S, earned, {}, 10**12, {}, ref)
    t0 = time.perf_counter()
    problems = audit(report, document, 10**12)
    audit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    report.tree().root  # noqa: B018 - the baseline: the records against their root
    root_s = time.perf_counter() - t0
    assert problems == [], problems
    n = len(leaves)
    print(f"\nthe epoch's receipts ({n}): {len(data) / n:.0f} bytes each published; document and tree "
          f"built in {build_s * 1e3:.0f} ms ({build_s * 1e6 / n:.1f} us a receipt)")  # fmt: skip
    print(f"  audit {audit_s * 1e6 / n:.0f} us a receipt ({audit_s:.2f} s in all; {len(report.records)} "
          f"records borne out), beside the records' root alone: {root_s * 1e3:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--answers", type=int, default=400, help="answers metered per round and mode")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    ap.add_argument("--receipts", type=int, default=5000, help="receipts audited (of those metered)")
    main(ap.parse_args())
