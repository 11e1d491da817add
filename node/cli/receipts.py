"""`zoo-node verify-receipt`: check a node's signed receipt of an answer, offline (no node, no chain).

The input is a receipt's JSON, or a whole answer that carries one: an OpenAI-compatible answer with
`zoo.receipt` (its choices' texts are then checked against the receipt's output hash), or an InferResponse
as JSON (`receipt` beside `text`). Exit 0: signed by the node it names (and matching the answer, the node
and the model asked for); 1: refused, saying why; 2: input that is not a receipt.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from zoo.node.cli.console import err, out


def read_document(source: str) -> Any:
    """The JSON document in file `source` (- : stdin); exit 2, saying why, when there is none."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
        return json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        err.print(f"[red]cannot read a JSON document from {escape(source)}: {escape(str(e))}[/red]")
        raise typer.Exit(2) from None


def _answer_texts(doc: dict[str, Any]) -> list[str] | None:
    """The texts an answer holds, in choice order (a chat answer's message contents, a completion's texts,
    an InferResponse's text); None when it holds none."""
    if isinstance(doc.get("choices"), list):
        choices = [c if isinstance(c, dict) else {} for c in doc["choices"]]
        return [(c.get("message") or {}).get("content") or c.get("text") or "" for c in choices]
    return [doc["text"]] if isinstance(doc.get("text"), str) else None


def _receipt_and_texts(doc: Any) -> tuple[Any, list[str] | None]:
    """The receipt a document is or carries, and the answer's texts when it carries one."""
    if not isinstance(doc, dict):
        return doc, None
    zoo = doc.get("zoo")
    if isinstance(zoo, dict) and "receipt" in zoo:
        return zoo["receipt"], _answer_texts(doc)
    if "receipt" in doc:
        return doc["receipt"], _answer_texts(doc)
    return doc, None


def verify_receipt(
    source: str = typer.Argument(..., help="A JSON file (receipt or answer carrying one); - reads stdin."),
    node: str | None = typer.Option(None, "--node", help="Require this node's address (0x…)."),
    model: str | None = typer.Option(None, "--model", help="Require these weights (their SHA-256)."),
) -> None:
    """Check that a receipt was signed by the node it names, and that it matches the answer it came with."""
    from zoo.inference.provenance.documents import output_document, sha256_hex
    from zoo.node.credits.signing import SignatureError
    from zoo.node.provenance.receipts import ZERO32, check, hex32, parse
    from zoo.registry.errors import ValidationError

    raw, texts = _receipt_and_texts(read_document(source))
    try:
        receipt = parse(raw)
        wanted_model = hex32(model) if model else None
    except ValidationError as e:
        err.print(f"[red]not a receipt: {escape(str(e))}[/red]")
        raise typer.Exit(2) from None
    problems = []
    try:
        check(receipt)
    except SignatureError as e:
        problems.append(str(e))
    if node is not None and node.lower() != receipt.node.lower():
        problems.append(f"signed by node {receipt.node}, not {node}")
    if wanted_model is not None and wanted_model != receipt.model:
        problems.append(f"names the weights {receipt.model}, not {wanted_model}")
    if texts is not None and sha256_hex(output_document(texts)) != receipt.output:
        problems.append("the answer's text is not the output the receipt names (altered, or another answer)")
    if problems:
        for problem in problems:
            err.print(f"[red]refused: {escape(problem)}[/red]")
        raise typer.Exit(1)
    out.print(f"valid: signed by node {receipt.node}")
    out.print(f"model    {receipt.model if receipt.model != ZERO32 else 'unknown (a remote backend)'}")
    if receipt.adapter != ZERO32:
        out.print(f"adapter  {receipt.adapter}")
    out.print(f"library  {receipt.library if receipt.library != ZERO32 else 'none'}")
    out.print(f"client   {receipt.client if int(receipt.client, 16) else 'anonymous'}")
    out.print(f"tokens   {receipt.prompt_tokens} prompt, {receipt.completion_tokens} completion")
    out.print(f"signed   at {receipt.timestamp} (Unix time)")
    checked = "matches the answer's text" if texts is not None else "not checked (no answer given)"
    out.print(f"output   {checked}")
