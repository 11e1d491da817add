"""`zoo-node library …`: inspect verified versions, edit a draft, build, publish, propose, verify, sync.

Works on the data dir's local store directly (no running daemon needed). The draft is the operator's
working copy of the next version: version = current + 1, parent = the current root.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from zoo.node.cli.console import err, out
from zoo.node.cli.context import connect, load, reverts
from zoo.node.cli.options import ConfigOpt, DataDirOpt, KeyOpt

app = typer.Typer(
    help="The experience library: versions, draft, publish, verify, sync.", no_args_is_help=True
)

DEFAULT_BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _cfg(config: Path | None, data_dir: Path | None) -> Any:
    return load(config, data_dir=data_dir and str(data_dir))


def _store(cfg: Any) -> Any:
    from zoo.registry.library_store import LibraryStore

    return LibraryStore(cfg.data_dir)


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]{message}[/red]", highlight=False)
    return typer.Exit(code)


def _domain_errors() -> tuple[type[Exception], ...]:
    from zoo.registry.errors import ZooError

    return (ZooError,)


def _draft(store: Any) -> Any:
    """The draft, started from the current version when there is none yet."""
    from zoo.registry.library import Library

    draft = store.draft()
    cur = store.current()
    if draft is not None and (cur is None or draft.version > cur.version):
        return draft
    if draft is not None:
        # The draft's version was approved (or overtaken) meanwhile: start the next one from the chain's.
        err.print(f"draft version {draft.version} is superseded by version {cur.version}; starting anew")
        store.discard_draft()
    if cur is None:
        return Library.create(version=1, base_model=DEFAULT_BASE_MODEL, description="draft")
    lib = cur.library
    return Library.create(
        version=lib.version + 1,
        parent_root=cur.root,
        base_model=lib.base_model,
        base_model_sha256=lib.base_model_sha256,  # a draft keeps the model its parent was made for
        experiences=lib.experiences,
        description=lib.description,
    )


def _select(store: Any, which: str | None) -> Any:
    """A library by version number, 'draft', or (None) the current version."""
    if which == "draft":
        return _draft(store)
    if which is None:
        cur = store.current()
        if cur is None:
            raise _fail(
                "no verified library version is active in this data dir (run `zoo-node library sync`)"
            )
        return cur.library
    if not which.isdigit():
        raise _fail(f"a version is a number or 'draft' (got {which!r})", 2)
    return store.get(version=int(which)).library


def _load_version(config: Path | None, data_dir: Path | None, which: str | None) -> Any:
    """`_select` in the configured data dir's store; a domain error exits 1 with its message."""
    try:
        return _select(_store(_cfg(config, data_dir)), which)
    except _domain_errors() as e:
        raise _fail(str(e)) from None


def _replace_experiences(lib: Any, experiences: Any) -> Any:
    from zoo.registry.library import Library

    return Library.create(
        version=lib.version,
        parent_root=lib.parent_root,
        base_model=lib.base_model,
        base_model_sha256=lib.base_model_sha256,
        experiences=experiences,
        description=lib.description,
    )


@app.command()
def show(
    version: str | None = typer.Argument(None, help="Version number or 'draft' (default: current)."),
    as_json: bool = typer.Option(False, "--json", help="Print the canonical JSON."),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Show a library version (default: the current verified one)."""
    from zoo.registry.canonical import encode_library
    from zoo.registry.merkle import library_root

    lib = _load_version(config, data_dir, version)
    if as_json:
        out.print_json(encode_library(lib).decode())
        return
    out.print(
        f"[bold]library version {lib.version}[/bold] root 0x{library_root(lib).hex()} "
        f"({len(lib.experiences)} experiences, base model {lib.base_model})"
    )
    if lib.parent_root:
        out.print(f"parent {lib.parent_root}")
    table = Table("id", "kind", "domain", "conf", "text")
    for e in lib.experiences:
        shown = e.text if e.kind == "lesson" else f"Q: {e.text}\nA: {e.answer}"
        table.add_row(e.id, e.kind, e.domain, f"{e.confidence:.2f}", escape(shown))
    out.print(table)


@app.command()
def add(
    text: str | None = typer.Option(
        None, "--text", help="A lesson: at most 32 words, opening with its trigger (When/If/For/...)."
    ),
    question: str | None = typer.Option(None, "--question", help="A worked example's question."),
    answer: str | None = typer.Option(None, "--answer", help="The worked example's short correct answer."),
    reasoning: str | None = typer.Option(None, "--reasoning", help="The worked example's brief reasoning."),
    domain: str = typer.Option(..., "--domain", help="Dotted domain, e.g. math.geometry."),
    confidence: float = typer.Option(0.7, "--confidence", help="Reliability in [0, 1]."),
    example: list[str] = typer.Option([], "--example", help="An illustration of a lesson (repeatable)."),
    author: str = typer.Option("job:operator", "--author", help="0x address or job:<id>."),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Add an experience to the draft: a lesson (--text) or a worked example (--question and --answer)."""
    from zoo.registry.experience import Experience

    if (text is None) == (question is None):
        raise _fail("give a lesson's --text or a worked example's --question (with --answer), not both", 2)
    if question is None and (answer is not None or reasoning is not None):
        raise _fail("--answer and --reasoning belong to a worked example (--question)", 2)
    store = _store(_cfg(config, data_dir))
    try:
        draft = _draft(store)
        kind = "lesson" if question is None else "example"
        e = Experience.create(
            kind=kind,
            text=text if question is None else question,
            answer=answer,
            reasoning=reasoning,
            domain=domain,
            confidence=confidence,
            author=author,
            base_model=draft.base_model,
            examples=example,
        )
        if any(x.id == e.id for x in draft.experiences):
            raise _fail(f"the draft already has this {kind} ({e.id})")
        store.save_draft(_replace_experiences(draft, [*draft.experiences, e]))
    except _domain_errors() as ex:
        raise _fail(f"invalid experience: {ex}", 2) from None
    out.print(f"added {kind} {e.id} to draft version {draft.version}")


@app.command()
def edit(
    experience_id: str = typer.Argument(..., help="Id of the experience in the draft."),
    text: str | None = typer.Option(None, "--text"),
    domain: str | None = typer.Option(None, "--domain"),
    confidence: float | None = typer.Option(None, "--confidence"),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Change an experience in the draft (a new text or domain gives it a new content id)."""
    store = _store(_cfg(config, data_dir))
    changes = {
        k: v for k, v in {"text": text, "domain": domain, "confidence": confidence}.items() if v is not None
    }
    if not changes:
        raise _fail("nothing to change: pass --text, --domain or --confidence", 2)
    try:
        draft = _draft(store)
        old = draft.get(experience_id)
        new = old.replace(**changes)
        others = [x for x in draft.experiences if x.id != old.id]
        if any(x.id == new.id for x in others):
            raise _fail(f"the draft already has that lesson ({new.id})")
        store.save_draft(_replace_experiences(draft, [*others, new]))
    except _domain_errors() as ex:
        raise _fail(str(ex), 2) from None
    out.print(f"edited {old.id} -> {new.id}" if new.id != old.id else f"edited {old.id}")


@app.command()
def remove(
    experience_id: str = typer.Argument(...),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Remove an experience from the draft."""
    store = _store(_cfg(config, data_dir))
    try:
        draft = _draft(store)
        draft.get(experience_id)
        store.save_draft(_replace_experiences(draft, [x for x in draft.experiences if x.id != experience_id]))
    except _domain_errors() as ex:
        raise _fail(str(ex)) from None
    out.print(f"removed {experience_id} from draft version {draft.version}")


@app.command("import")
def import_(
    file: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="JSON: a library document or a list of experiences."
    ),
    replace: bool = typer.Option(
        False, "--replace", help="Replace the draft's experiences instead of adding."
    ),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Import experiences from JSON into the draft (validated; nothing changes if any is invalid)."""
    from zoo.registry.canonical import decode_library
    from zoo.registry.experience import Experience

    store = _store(_cfg(config, data_dir))
    raw = file.read_bytes()
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _fail(f"{file} is not JSON: {e}", 2) from None
    try:
        draft = _draft(store)
        if isinstance(doc, dict) and "schema" in doc:
            incoming = list(decode_library(raw, require_canonical=False).experiences)
        elif isinstance(doc, list):
            incoming = []
            for i, item in enumerate(doc):
                if not isinstance(item, dict):
                    raise _fail(f"{file}: item {i} is not an object", 2)
                fields = {"author": "job:import", "base_model": draft.base_model, **item}
                try:
                    incoming.append(Experience.create(**fields))
                except TypeError as e:
                    raise _fail(f"{file}: item {i}: {e}", 2) from None
        else:
            raise _fail(f"{file}: expected a library document or a JSON list of experiences", 2)
        merged = {e.id: e for e in ([] if replace else draft.experiences)}
        merged.update({e.id: e for e in incoming})
        store.save_draft(_replace_experiences(draft, merged.values()))
    except _domain_errors() as ex:
        raise _fail(f"{file}: {ex}", 2) from None
    out.print(f"imported {len(incoming)} experiences; draft version {draft.version} has {len(merged)}")


@app.command()
def export(
    file: Path = typer.Argument(..., dir_okay=False),
    version: str | None = typer.Option(
        None, "--version", help="Version number or 'draft' (default: current)."
    ),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Write a library version as canonical JSON."""
    from zoo.registry.canonical import encode_library
    from zoo.registry.fsutil import write_atomic

    lib = _load_version(config, data_dir, version)
    write_atomic(file, encode_library(lib))
    out.print(f"wrote version {lib.version} ({len(lib.experiences)} experiences) to {file}")


def _build(store: Any, library: Any = None) -> tuple[Any, bytes, Path]:
    """Freeze the draft (or `library`): canonical bytes, Merkle root and a proof for every experience."""
    from zoo.registry.canonical import encode_library
    from zoo.registry.fsutil import write_atomic
    from zoo.registry.merkle import leaf_hash, library_leaves, library_tree

    draft = _draft(store) if library is None else library
    tree = library_tree(draft)
    root = tree.root
    leaves = library_leaves(draft)
    bundle = {
        "version": draft.version,
        "root": "0x" + root.hex(),
        "parent_root": draft.parent_root,
        "proofs": {
            e.id: {**tree.prove(i).to_dict(), "leaf_hash": "0x" + leaf_hash(leaves[i]).hex()}
            for i, e in enumerate(draft.experiences)
        },
    }
    target = store.dir / "builds" / f"v{draft.version}-0x{root.hex()}"
    target.mkdir(parents=True, exist_ok=True)
    write_atomic(target / "library.json", encode_library(draft))
    write_atomic(target / "proofs.json", json.dumps(bundle, indent=1).encode())
    return draft, root, target


@app.command()
def build(config: Path | None = ConfigOpt, data_dir: Path | None = DataDirOpt) -> None:
    """Build the draft into a version: canonical bytes, Merkle root and a proof bundle."""
    try:
        draft, root, target = _build(_store(_cfg(config, data_dir)))
    except _domain_errors() as e:
        raise _fail(str(e)) from None
    out.print(f"built version {draft.version}: root 0x{root.hex()} ({len(draft.experiences)} experiences)")
    out.print(f"files: {target}/library.json, {target}/proofs.json")


@app.command()
def diff(
    a: str = typer.Argument(..., help="Version number or 'draft'."),
    b: str = typer.Argument(..., help="Version number or 'draft'."),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """What changed between two versions: added, removed and modified experiences."""
    store = _store(_cfg(config, data_dir))
    try:
        la, lb = _select(store, a), _select(store, b)
    except _domain_errors() as e:
        raise _fail(str(e)) from None
    from zoo.node.cli.dao_review import print_diff
    from zoo.registry.review import LibraryDiff

    changes = LibraryDiff.between(la, lb)
    print_diff(changes)
    out.print(changes.summary)


def _job_library(cfg: Any, store: Any, job_id: str) -> Any:
    """The library draft a succeeded job left, checked to extend the current version."""
    from zoo.node.jobs.store import JobState, JobStore
    from zoo.registry.canonical import decode_library

    path = Path(cfg.data_dir) / "jobs.sqlite"
    if not path.exists():
        raise _fail(f"no jobs have run in {cfg.data_dir}")
    with JobStore(path) as jobs:
        record = jobs.get(job_id)
    if record.state is not JobState.SUCCEEDED:
        raise _fail(f"job {job_id} is {record.state.value}; only a succeeded job has a library to propose")
    path = Path(cfg.data_dir) / "jobs" / job_id / "library.json"
    try:
        library = decode_library(path.read_bytes())
    except OSError as e:
        raise _fail(f"job {job_id} succeeded but its library {path} cannot be read: {e.strerror}") from None
    cur = store.current()
    current_root = cur.root if cur is not None else ""
    if library.parent_root != current_root:
        raise _fail(
            f"job {job_id} learned from the library with root {library.parent_root or '(none)'}, but the "
            f"current version is {cur.version if cur else 0} with root {current_root or '(none)'}; "
            "run the job again on the current library"
        )
    return library


def _publish(cfg: Any, store: Any, library: Any = None) -> tuple[Any, bytes, str]:
    from zoo.node.endpoints import EndpointsUnavailable, resolve_endpoints
    from zoo.registry.canonical import encode_library
    from zoo.registry.ipfs import IpfsClient

    draft, root, _target = _build(store, library)
    try:
        ipfs_api = resolve_endpoints(cfg).ipfs_api if cfg.chain.mode != "off" else cfg.ipfs.api_url
    except EndpointsUnavailable as e:
        raise _fail(str(e)) from None
    if not ipfs_api:
        raise _fail("no IPFS API configured (set ipfs.api_url, or run a devnet)")
    with IpfsClient(ipfs_api, timeout=cfg.ipfs.timeout_s) as ipfs:
        cid = ipfs.add(encode_library(draft), pin=True)
    return draft, root, cid


@app.command()
def publish(config: Path | None = ConfigOpt, data_dir: Path | None = DataDirOpt) -> None:
    """Build the draft and add its canonical bytes to IPFS (pinned); prints the CID."""
    cfg = _cfg(config, data_dir)
    try:
        draft, root, cid = _publish(cfg, _store(cfg))
    except _domain_errors() as e:
        raise _fail(f"publish failed: {e}") from None
    out.print(f"published version {draft.version} root 0x{root.hex()}")
    out.print(f"cid {cid}")


@app.command()
def propose(
    key: str | None = KeyOpt,
    from_job: str | None = typer.Option(
        None, "--from-job", help="Propose the library a finished learning job produced instead of the draft."
    ),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Publish the draft (or a job's learned library) and propose it on chain in one step."""
    from zoo.node.cli.dao_review import unapproved_model
    from zoo.registry.chain import format_proposal_id

    cfg = _cfg(config, data_dir)
    store = _store(cfg)
    try:
        library = _job_library(cfg, store, from_job) if from_job else None
    except _domain_errors() as e:
        raise _fail(f"publish failed: {e}") from None
    dao = connect(config, data_dir, key, need_key=True)
    with reverts():
        problem = unapproved_model(dao, library if library is not None else _draft(store))
    if problem is not None:
        raise _fail(f"refused: {problem}")
    try:
        draft, root, cid = _publish(cfg, store, library)
    except _domain_errors() as e:
        raise _fail(f"publish failed: {e}") from None
    with reverts():
        tx = dao.registry.propose(
            root, cid, tree_size=len(draft.experiences), parent_version=draft.version - 1
        )
        prop = dao.registry.proposal(tx.proposal_id)
    pid = format_proposal_id(tx.proposal_id)
    out.print(f"proposed version {draft.version} as {pid}: root 0x{root.hex()} cid {cid} (tx {tx.tx_hash})")
    if prop is not None:
        out.print(
            f"voting ends at chain time {prop.vote_end}; vote with `zoo-node dao vote {pid[:18]} --for`"
        )


@app.command()
def verify(
    experience_id: str = typer.Argument(...),
    version: int | None = typer.Option(None, "--version", help="Library version (default: current)."),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Print an experience's inclusion proof and check it on chain with the registry contract."""
    from zoo.registry.merkle import leaf_hash, prove_experience, verify_inclusion

    cfg = _cfg(config, data_dir)
    store = _store(cfg)
    try:
        stored = store.get(version=version) if version is not None else store.current()
        if stored is None:
            raise _fail("no verified library version is active (run `zoo-node library sync`)")
        proof, leaf = prove_experience(stored.library, experience_id)
    except _domain_errors() as e:
        raise _fail(str(e)) from None
    out.print_json(json.dumps({"experience": experience_id, "version": stored.version, "root": stored.root,
                               "leaf_hash": "0x" + leaf_hash(leaf).hex(), **proof.to_dict()}))  # fmt: skip
    local_ok = verify_inclusion(leaf, proof, bytes.fromhex(stored.root[2:]))
    dao = connect(config, data_dir, None, need_key=False)
    with reverts():
        onchain_ok = dao.registry.verify_inclusion_in_version(
            stored.version, leaf, proof.leaf_index, proof.path
        )
    out.print(f"local check: {'valid' if local_ok else 'INVALID'}; on-chain check against version "
              f"{stored.version}: {'valid' if onchain_ok else 'INVALID'}")  # fmt: skip
    if not (local_ok and onchain_ok):
        raise typer.Exit(1)


@app.command()
def sync(config: Path | None = ConfigOpt, data_dir: Path | None = DataDirOpt) -> None:
    """Fetch, verify and activate the chain's current library version once."""
    from web3 import Web3

    from zoo.node.endpoints import EndpointsUnavailable, resolve_endpoints
    from zoo.registry.chain import ChainError, RegistryClient
    from zoo.registry.ipfs import IpfsClient
    from zoo.registry.sync import LibrarySyncer

    cfg = _cfg(config, data_dir)
    try:
        ep = resolve_endpoints(cfg)
    except EndpointsUnavailable as e:
        raise _fail(str(e)) from None
    if not ep.ipfs_api:
        raise _fail("no IPFS API configured (set ipfs.api_url)")
    w3 = Web3(Web3.HTTPProvider(ep.rpc_url, request_kwargs={"timeout": 30}))
    with IpfsClient(ep.ipfs_api, timeout=cfg.ipfs.timeout_s) as ipfs:
        registry = RegistryClient(w3, ep.registry_address)
        limits = {"fetch_timeout_s": cfg.ipfs.timeout_s, "max_bytes": cfg.ipfs.max_library_bytes}
        syncer = LibrarySyncer(registry, ipfs, _store(cfg), **limits)
        try:
            result = syncer.sync_once()
        except (ChainError, *_domain_errors()) as e:
            raise _fail(f"sync failed (the current version is unchanged): {e}") from None
    cur = result.current
    if result.activated is not None:
        out.print(f"activated version {cur.version} root {cur.root}")
    elif cur is not None:
        out.print(f"already at the chain's version {cur.version} root {cur.root}")
    else:
        out.print("the chain has no library version yet")


@app.command()
def calibrate(
    dataset: Path = typer.Option(..., "--dataset", help="Validation tasks the library is for (JSONL)."),
    library: str = typer.Option("current", "--library", help="A library file, or 'current'."),
    outside: Path | None = typer.Option(None, "--outside", help="Tasks the library is not for (JSONL)."),
    margin: float = typer.Option(0.1, "--margin", min=0.0, max=2.0, help="How far below the weakest match."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    config: Path | None = ConfigOpt,
    data_dir: Path | None = DataDirOpt,
) -> None:
    """Suggest the relevance gate (inference.min_similarity) for a library: just below the weakest best
    match of its own validation tasks, so they keep their experiences while unrelated questions get none;
    with --outside, how many of those tasks it gates."""
    import json

    from zoo.inference.embedder import SentenceTransformerEmbedder
    from zoo.node.cli.eval import EvalError, read_library
    from zoo.registry.errors import ZooError
    from zoo.registry.library import Library
    from zoo.trainer.gate import calibrate as calibrate_gate
    from zoo.trainer.tasks.loading import load_jsonl

    cfg = _cfg(config, data_dir)
    try:
        experiences, what = read_library(cfg, library)
        tasks = {}
        for flag, path in (("--dataset", dataset), ("--outside", outside)):
            if path is None:
                continue
            if not path.is_file():
                raise EvalError(f"{flag} {path}: no such file")
            tasks[flag] = load_jsonl(path)
        if not experiences:
            raise EvalError(f"--library {library}: {what}: there is nothing to gate")
        lib = Library.create(version=1, base_model="calibration", experiences=experiences)
        found = calibrate_gate(lib, SentenceTransformerEmbedder(cfg.embedder.path), tasks["--dataset"],
                               tasks.get("--outside", []), margin)  # fmt: skip
    except (EvalError, ZooError, ValueError) as e:
        raise _fail(f"zoo-node library calibrate: {e}", 2) from None
    report = found.to_json()
    if as_json:
        print(json.dumps(report, sort_keys=True))
        return
    inside = report["inside"]
    out.print(f"library: {what}")
    out.print(f"validation tasks' best match: min {inside['min']:.3f}, median {inside['median']:.3f}")
    if report["outside"] is not None:
        o = report["outside"]
        out.print(f"outside tasks' best match: median {o['median']:.3f}, max {o['max']:.3f}; "
                  f"{report['outside_gated']:.0%} of them get no experience")  # fmt: skip
    now = cfg.inference.min_similarity
    out.print(f"suggested gate: [bold]inference.min_similarity = {report['threshold']}[/bold] "
              f"(now {now}; keeps {report['inside_kept']:.0%} of validation)")  # fmt: skip
