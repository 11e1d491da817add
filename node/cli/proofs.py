"""`zoo-node verify-answer`: have a node that serves the same weights check an answer's proof of inference
(one prefill of its prompt and tokens: zoo.inference.provenance.answer_proof).

The input is a proof's JSON, or an answer that carries one: an OpenAI-compatible answer with `zoo.proof`,
or an InferResponse as JSON (`proof` as JSON text). When the answer also carries a receipt, the receipt must
name this proof (its `proof` hash) and the same weights. Exit 0: accepted; 1: rejected, saying why; 2: input
that is not a proof; 3: it cannot be checked there (no node reachable, or the node serves other weights:
the message names the hash the proof needs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from zoo.node.cli.console import err, out
from zoo.node.cli.options import ConfigOpt, DataDirOpt, NodeAddressOpt
from zoo.node.cli.receipts import read_document


def proof_and_receipt(doc: Any) -> tuple[Any, Any]:
    """The proof a document is or carries (JSON text or object), and the receipt beside it (or None)."""
    if not isinstance(doc, dict):
        return doc, None
    zoo = doc.get("zoo")
    if isinstance(zoo, dict) and "proof" in zoo:
        return zoo["proof"], zoo.get("receipt")
    if "proof" in doc and "format" not in doc:  # an InferResponse: the proof as JSON text
        return doc["proof"], doc.get("receipt")
    return doc, None


def verify_answer(
    source: str = typer.Argument(
        ..., help="A JSON file (a proof, or an answer carrying one); - reads stdin."
    ),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
    address: str | None = NodeAddressOpt,
) -> None:
    """Check an answer's proof of inference on a node serving the same weights: accepted or rejected."""
    import grpc

    from zoo.inference.provenance import answer_proof
    from zoo.inference.provenance.toploc import ProofError
    from zoo.node.cli.context import load
    from zoo.node.client import NodeClient, NodeNotRunning
    from zoo.node.provenance.receipts import parse as parse_receipt
    from zoo.registry.errors import ValidationError
    from zoo.v1 import inference_pb2

    raw, raw_receipt = proof_and_receipt(read_document(source))
    try:
        proof = answer_proof.parse(raw if isinstance(raw, str) else json.dumps(raw))
        receipt = parse_receipt(raw_receipt) if raw_receipt is not None else None
    except (ProofError, ValidationError) as e:
        err.print(f"[red]not a proof: {escape(str(e))}[/red]")
        raise typer.Exit(2) from None
    if receipt is not None:
        problems = []
        if receipt.proof != proof.sha256():
            problems.append("the receipt names another proof (or none): the proof was swapped or altered")
        if receipt.model != proof.model:
            problems.append(f"the receipt names the weights {receipt.model}, the proof {proof.model}")
        for problem in problems:
            err.print(f"[red]rejected: {escape(problem)}[/red]")
        if problems:
            raise typer.Exit(1)
    cfg = load(config, data_dir=data_dir and str(data_dir))
    try:
        client = NodeClient(address) if address else NodeClient.from_data_dir(cfg.data_dir)
        request = inference_pb2.VerifyAnswerRequest(proof=json.dumps(proof.to_json()))
        answer = client.inference.VerifyAnswer(request, timeout=max(client.timeout_s, 120.0))
    except NodeNotRunning as e:
        err.print(f"[red]{e}[/red] (start one with `zoo-node start`, or pass --address)")
        raise typer.Exit(3) from None
    except grpc.RpcError as e:
        code = e.code()
        err.print(f"[red]the node cannot check it: {code.name}: {escape(e.details() or '')}[/red]")
        raise typer.Exit(2 if code == grpc.StatusCode.INVALID_ARGUMENT else 3) from None
    where = f"node {client.address}, weights sha256 {answer.model_sha256}"
    if not answer.accepted:
        err.print(f"[red]rejected: {escape(answer.reason)}[/red] ({where})")
        raise typer.Exit(1)
    out.print(f"accepted: {escape(answer.reason)} ({where}, {answer.verify_ms:.0f} ms)")
    worst = min((c.exponent_matches for c in answer.chunks), default=0)
    out.print(f"chunks   {len(answer.chunks)}; fewest exponent matches {worst} of 128")
    out.print(f"receipt  {'names this proof' if receipt is not None else 'none given'}")
