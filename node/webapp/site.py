"""Serving the web app: its built pages at `/` and `/assets/*`, and the read-only data they show at `/app/*`.

    GET  /                  the page (index.html of the build)
    GET  /assets/NAME       the bundle's files (app.js, app.css)
    GET  /app/config.json   the chain the node follows: registry and ledger addresses, their ABIs (the
                            contracts' own solc output), whether the status is shown
    POST /app/chain         read-only JSON-RPC to that chain (chain_proxy.py)
    GET  /app/ipfs/CID      a library's bytes, checked against the CID (from this node's store or IPFS)
    GET  /app/status.json   this node's status, as GetStatus gives it (404 when http.app_status is off)
    POST /app/draft/experience   a contributor's new or edited experience as its canonical document
    POST /app/draft/build        a draft as canonical library bytes, root, size and CID (drafts.py)
    POST /app/publish            canonical library bytes pinned to this node's IPFS, once a proposal on
                                 chain names their CID (or with the admin token)
    POST /app/effect             a library proposal's (or a draft's) measured effect on a shipped task file
    GET  /app/jobs.json          the node's learning jobs         } the admin token only, sent by the
    POST /app/jobs/ID/cancel     cancel one                       } operator's browser, never served

Every answer of these routes carries a Content-Security-Policy that lets the page run its own scripts and
styles and connect to its own origin only: no inline script, no other origin, no framing. The page never
holds a key and no answer here contains a secret (the admin token is only compared with what a request
sends). Domain errors take their status from the API's one table (api_error_for).
"""

from __future__ import annotations

import asyncio
import hmac
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from zoo.node.api.http.error_bodies import api_error_for
from zoo.node.logs import get_logger
from zoo.node.webapp import drafts
from zoo.node.webapp.chain_proxy import MAX_REQUEST_BYTES, ChainProxy, too_large
from zoo.node.webapp.effect import Effects, task_files
from zoo.registry.errors import IntegrityError, ValidationError, ZooError
from zoo.registry.ipfs import local_cid

log = get_logger(__name__)

DIST = Path(__file__).resolve().parent / "dist"  # what setup builds from src/ (./zoo, "web app")
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}
ASSET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
CONTENT_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".map": "application/json",
}
CID_TEXT = re.compile(r"[A-Za-z0-9]{10,128}")
NAMED_TTL_S = 3.0  # how long the CIDs proposals name are kept before the chain is read again


@dataclass
class WebApp:
    """What the pages need from the daemon. Unset parts answer 404 naming what is missing."""

    rpc_url: str | None = None
    registry_address: str | None = None
    ledger_address: str | None = None
    abis: Callable[[], dict[str, Any]] = dict  # contract name -> ABI, read once
    fetch_cid: Callable[[str], Awaitable[bytes]] | None = None  # bytes checked against the CID
    status: Callable[[], Awaitable[dict[str, Any]]] | None = None  # None: http.app_status is off
    proposed_cids: Callable[[], Awaitable[set[str]]] | None = None  # CIDs library proposals on chain name
    held: Callable[[str], bool] = lambda _cid: False  # whether this node's store holds a CID's bytes
    publish: Callable[[bytes], Awaitable[str]] | None = None  # pins bytes to IPFS, returns their CID
    admin_token: Callable[[], str] | None = None  # publishes without a proposal (never sent to a page)
    max_library_bytes: int = 64 * 1024 * 1024
    effects: Effects | None = None  # None: this node measures no effects (it serves no model)
    jobs: Any = None  # the node's JobRunner (admin only)
    api_key: str | None = None  # server.api_key: what the model's time costs (effects) needs, when set
    from_block: int = 0  # where the registry's history starts (chain.from_block)
    dist: Path = DIST
    _proxy: ChainProxy | None = field(default=None, init=False, repr=False)
    _abis: dict[str, Any] | None = field(default=None, init=False, repr=False)
    _named: tuple[float, set[str]] = field(default=(0.0, set()), init=False, repr=False)
    _named_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)
    _heavy: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(2), init=False, repr=False)

    def add_routes(self, app: FastAPI) -> None:
        routes: list[tuple[str, str, Callable[..., Awaitable[Response]]]] = [
            ("GET", "/", self.index),
            ("GET", "/assets/{name}", self.asset),
            ("GET", "/app/config.json", self.config),
            ("POST", "/app/chain", self.chain),
            ("GET", "/app/ipfs/{cid}", self.ipfs),
            ("GET", "/app/status.json", self.node_status),
            ("POST", "/app/draft/experience", self.draft_experience),
            ("POST", "/app/draft/build", self.draft_build),
            ("POST", "/app/publish", self.publish_library),
            ("POST", "/app/effect", self.effect),
            ("GET", "/app/jobs.json", self.list_jobs),
            ("POST", "/app/jobs/{job_id}/cancel", self.cancel_job),
        ]
        for method, path, handler in routes:
            app.add_api_route(path, handler, methods=[method], response_model=None, include_in_schema=False)

    async def close(self) -> None:
        if self._proxy is not None:
            await self._proxy.close()

    # -- pages ---------------------------------------------------------------------------------------

    async def index(self) -> Response:
        page = self.dist / "index.html"
        if not page.is_file():
            return _text(503, f"the web app is not built here ({page} is missing): run ./zoo setup")
        return _file(page, "text/html; charset=utf-8", cache="no-cache")

    async def asset(self, name: str) -> Response:
        path = self.dist / "assets" / name
        kind = CONTENT_TYPES.get(Path(name).suffix)
        if not ASSET_NAME.fullmatch(name) or ".." in name or kind is None or not path.is_file():
            return _text(404, f"no asset {name[:128]!r}")
        return _file(path, kind, cache="no-cache")

    # -- data ----------------------------------------------------------------------------------------

    async def config(self) -> Response:
        if self._abis is None and self.rpc_url:
            try:
                self._abis = await asyncio.to_thread(self.abis)
            except Exception as e:  # solc's output unreadable: the pages say so, the status page still works
                log.error("the web app could not read the contracts' ABIs", exc_info=e)
        return _json(
            {
                "chain": self.rpc_url is not None and self._abis is not None,
                "registry": self.registry_address,
                "ledger": self.ledger_address,
                "from_block": self.from_block,
                "abi": self._abis or {},
                "status": self.status is not None,
                "tasks": task_files() if self.effects is not None else [],
            }
        )

    async def named(self, fresh: bool = False) -> set[str]:
        """The CIDs library proposals on chain name (normalised), read at most every NAMED_TTL_S (`fresh`:
        read now, as when a proposal was just made)."""
        if self.proposed_cids is None:
            return set()
        async with self._named_lock:
            at, cids = self._named
            if fresh or time.monotonic() - at > NAMED_TTL_S:
                cids = await self.proposed_cids()
                self._named = (time.monotonic(), cids)
        return cids

    async def chain(self, request: Request) -> Response:
        if self.rpc_url is None:
            return _json(_rpc_error("this node follows no chain"), 404)
        if self._proxy is None:
            others = {self.ledger_address} if self.ledger_address else set()
            self._proxy = ChainProxy(self.rpc_url, str(self.registry_address), others)
        body = await _body(request, MAX_REQUEST_BYTES)
        if body is None:
            return _json(too_large())
        return _json(await self._proxy.answer(body))

    async def ipfs(self, cid: str) -> Response:
        if not CID_TEXT.fullmatch(cid):
            return _text(400, f"{cid[:128]!r} is not a CID")
        if self.fetch_cid is None:
            return _text(404, "this node reaches no library content (no IPFS, no peers)")
        try:
            if not await asyncio.to_thread(self.held, cid) and _normal(cid) not in await self.named():
                return _text(
                    404, f"no library proposal on chain names {cid}: this node relays no other content"
                )
            if self._heavy.locked():
                return _text(429, "this node is fetching other content: ask again in a moment")
            async with self._heavy:
                data = await self.fetch_cid(cid)
        except IntegrityError as e:
            return _text(502, f"the content found for {cid} does not match it: {e}")
        except ZooError as e:
            error = api_error_for(e)  # one not in the table is logged, and said as not fetched
            return (
                _text(502, f"{cid}: not fetched")
                if error.status == 500
                else _text(error.status, f"{cid}: {e}")
            )
        except Exception as e:  # the chain could not be read: said, logged
            log.error("the web app could not fetch content", cid=cid, exc_info=e)
            return _text(502, f"{cid}: not fetched (the node's log says why)")
        return Response(data, media_type="application/octet-stream", headers=_headers("no-cache"))

    async def node_status(self) -> Response:
        if self.status is None:
            return _text(404, "this node does not show its status here (http.app_status = false)")
        return _json(await self.status())

    # -- contributors ------------------------------------------------------------------------------

    async def draft_experience(self, request: Request) -> Response:
        return await self._validated(request, drafts.experience, drafts.MAX_EXPERIENCE_BODY)

    async def draft_build(self, request: Request) -> Response:
        return await self._validated(request, drafts.build, self.max_library_bytes)

    async def _validated(
        self, request: Request, make: Callable[[Any], dict[str, Any]], limit: int
    ) -> Response:
        from zoo.registry import untrusted_json

        data = await _body(request, limit)
        if data is None:
            return _problem(413, f"the body is over {limit} bytes")
        if self._heavy.locked():
            return _problem(429, "this node is building other drafts: ask again in a moment")
        try:
            async with self._heavy:
                return _json(await asyncio.to_thread(lambda: make(untrusted_json.loads(data))))
        except ValidationError as e:
            return _problem(400, str(e), getattr(e, "field", None))
        except (ValueError, UnicodeDecodeError) as e:
            return _problem(400, f"the body is not JSON: {e}")

    async def publish_library(self, request: Request) -> Response:
        if self.publish is None:
            return _problem(503, "this node has no IPFS to publish to (ipfs.api_url)")
        data = await _body(request, self.max_library_bytes)
        if data is None:
            return _problem(
                413, f"a library is at most {self.max_library_bytes} bytes (ipfs.max_library_bytes)"
            )
        if self._heavy.locked():
            return _problem(429, "this node is publishing other content: ask again in a moment")
        async with self._heavy:
            cid = await asyncio.to_thread(local_cid, data)  # a hash: checked before anything costly
            try:
                allowed = self._admin(request) or cid in await self.named() or cid in await self.named(True)
            except Exception as e:
                log.error("the web app could not read the proposals", exc_info=e)
                return _problem(503, "this node cannot read the chain's proposals now")
            if not allowed:
                return _problem(
                    403,
                    f"no library proposal on chain names {cid}: propose it first (the wallet signs), then "
                    "publish, or send the admin token",
                )
            try:
                library = await asyncio.to_thread(drafts.publishable, data)
            except ValidationError as e:
                return _problem(400, f"not a library's canonical bytes: {e}", getattr(e, "field", None))
            try:
                published = await self.publish(data)
            except Exception as e:
                log.error("the web app could not publish", cid=cid, exc_info=e)
                return _problem(502, "IPFS did not take it (the node's log says why)")
        if _normal(published) != cid:
            return _problem(502, f"IPFS named the bytes {published}, not {cid}")
        log.info("web app published a library", cid=published, version=library.version)
        return _json({"cid": published, "version": library.version, "size": len(library.experiences)})

    async def effect(self, request: Request) -> Response:
        from zoo.registry import untrusted_json

        if self.effects is None:
            return _problem(404, "this node measures no effects: it serves no model (a light node)")
        if self.api_key and not _bearer(request, self.api_key):
            return _unauthorized("the API key is needed (server.api_key): measuring uses the model")
        data = await _body(request, self.max_library_bytes + 4096)
        if data is None:
            return _problem(413, f"the body is over {self.max_library_bytes + 4096} bytes")
        try:
            body = untrusted_json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            return _problem(400, f"the body is not JSON: {e}")
        try:
            shape = 'must be {"proposal": "0x…", "task": NAME} or {"draft": LIBRARY, "task": NAME}'
            if not isinstance(body, dict) or not isinstance(body.get("task"), str):
                raise ValidationError("body", shape)
            if isinstance(body.get("draft"), str):
                return _json(await self.effects.measure_draft(body["draft"].encode(), body["task"]))
            if not isinstance(body.get("proposal"), str):
                raise ValidationError("body", shape)
            return _json(await self.effects.measure(body["proposal"], body["task"]))
        except ZooError as e:
            return _domain_problem(e)
        except Exception as e:  # the model failed mid-evaluation: said, logged, the node goes on
            log.error("measuring a proposal's effect failed", exc_info=e)
        return _problem(500, "the evaluation failed (the node's log says why)")

    # -- operators ---------------------------------------------------------------------------------

    async def list_jobs(self, request: Request) -> Response:
        if not self._admin(request):
            return _unauthorized()
        records = await asyncio.to_thread(self.jobs.store.list, limit=100) if self.jobs is not None else []
        return _json({"jobs": [self._job(r) for r in records]})

    async def cancel_job(self, request: Request, job_id: str) -> Response:
        if not self._admin(request):
            return _unauthorized()
        if self.jobs is None:
            return _problem(404, "this node runs no jobs")
        try:
            return _json(self._job(self.jobs.cancel(job_id)))  # on the loop: it wakes the job's task
        except ZooError as e:
            return _domain_problem(e)

    def _job(self, record: Any) -> dict[str, Any]:
        from google.protobuf.json_format import MessageToDict

        from zoo.node.api.job_service import job_message

        message = job_message(record, str(self.jobs.jobs_dir / record.id))
        job = MessageToDict(message, preserving_proto_field_name=True)
        return {**job, "state": record.state.value.upper()}  # RUNNING, not JOB_STATE_RUNNING

    def _admin(self, request: Request) -> bool:
        token = self.admin_token() if self.admin_token is not None else ""
        return bool(token) and _bearer(request, token)


def _bearer(request: Request, secret: str) -> bool:
    """Whether the request sends `Authorization: Bearer <secret>` (compared as bytes, in constant time)."""
    for name, value in request.scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), secret.encode())
    return False


def _normal(cid: str) -> str:
    from zoo.registry.ipfs import normalise_cid

    try:
        return normalise_cid(cid)
    except ValueError:
        return cid


async def _body(request: Request, limit: int) -> bytes | None:
    """The body's bytes; None past `limit`."""
    data = bytearray()
    async for piece in request.stream():
        data += piece
        if len(data) > limit:
            return None
    return bytes(data)


def _unauthorized(
    message: str = "the admin token is needed: send 'Authorization: Bearer <token>' (DATA_DIR/admin.token)",
) -> Response:
    body = {"error": {"message": message, "field": None}}
    return JSONResponse(body, status_code=401, headers={**_headers(), "WWW-Authenticate": "Bearer"})


def _domain_problem(e: ZooError) -> Response:
    """A domain error in the web app's shape, its status from the API's table (one not in it: logged, 500)."""
    error = api_error_for(e)
    return _problem(error.status, error.message, error.param)


def _problem(status: int, message: str, field: str | None = None) -> Response:
    return _json({"error": {"message": message, "field": field}}, status)


def _headers(cache: str = "no-store") -> dict[str, str]:
    return {**SECURITY_HEADERS, "Cache-Control": cache}


def _file(path: Path, kind: str, *, cache: str) -> Response:
    return Response(path.read_bytes(), media_type=kind, headers=_headers(cache))


def _json(data: Any, status: int = 200) -> Response:
    return JSONResponse(data, status_code=status, headers=_headers())


def _rpc_error(message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": message}}


def _text(status: int, message: str) -> Response:
    return Response(
        message + "\n", status_code=status, media_type="text/plain; charset=utf-8", headers=_headers()
    )
