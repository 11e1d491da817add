"""A small client for the Kubo RPC API (POST /api/v0/...) on httpx, with content verified against CIDs.

Written to Kubo's documented RPC API and tested against js-ipfs, which serves the same API; it uses
only add, cat, files/stat, pin/add, pin/ls and version. ipfshttpclient refuses daemons newer than Kubo
0.8 and is unmaintained, hence this client. It is synchronous; async callers run it in a worker thread.

Libraries are added as CIDv1 with raw leaves in base32 (`bafk...` for one block, `bafy...` beyond
262,144 bytes). A raw CID is checked locally by hashing; a UnixFS (dag-pb) CID is checked by asking the
daemon to hash the bytes again with only-hash=true and the same layout (default chunker, raw leaves),
so content laid out differently by another tool fails the check rather than passing it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import httpx
from multiformats import CID, multihash

from zoo.registry.errors import (
    ContentTooLarge,
    IntegrityError,
    IpfsError,
    IpfsTimeout,
    IpfsUnavailable,
    ValidationError,
)
from zoo.registry.unixfs import unixfs_cid

RAW_CID_MAX = 262_144  # Kubo's default chunk size: content up to this size is one raw block
DEFAULT_MAX_CAT = 64 * 1024 * 1024
# The HTTP read waits this much longer than the daemon-side timeout, so the daemon answers first.
_GRACE = 5.0
# The layout unixfs.py computes, pinned so a daemon configured with another import profile cannot
# produce CIDs that every node would then fail to verify.
_ADD_PARAMS = {
    "cid-version": "1",
    "raw-leaves": "true",
    "chunker": "size-262144",
    "hash": "sha2-256",
    "cid-base": "base32",
    "progress": "false",
}


def local_cid(data: bytes) -> str:
    """The CIDv1 (base32) `add` gives `data`, computed here: a raw block up to RAW_CID_MAX bytes, a UnixFS
    DAG of raw leaves beyond (see unixfs.py)."""
    return unixfs_cid(data)


def parse_cid(cid: str) -> CID:
    try:
        return CID.decode(cid)
    except (ValueError, KeyError, TypeError) as err:
        raise ValidationError("cid", f"{cid[:100]!r} is not a CID: {err}") from None


def verify_local(cid: str, data: bytes) -> None:
    """Check `data` against a CID without a daemon: raw blocks (any hash function multiformats knows) and
    CIDv1 UnixFS files in the daemons' default layout; IntegrityError if it differs, ValidationError for
    a CID this cannot check (CIDv0, other codecs)."""
    parsed = parse_cid(cid)
    if parsed.codec.name == "dag-pb" and parsed.version == 1 and parsed.hashfun.name == "sha2-256":
        if unixfs_cid(data) != normalise_cid(cid):
            raise IntegrityError(
                f"content ({len(data)} bytes) does not hash to {cid}", cid=cid, size=len(data)
            )
        return
    if parsed.codec.name != "raw":
        kind = f"{parsed.codec.name} CIDv{parsed.version}"
        raise ValidationError("cid", f"{cid} is a {kind}, which only an IPFS daemon can check")
    try:
        matches = multihash.digest(data, parsed.hashfun) == bytes(parsed.digest)
    except (KeyError, ValueError, TypeError) as err:
        raise ValidationError("cid", f"unsupported hash function {parsed.hashfun.name}: {err}") from None
    if not matches:
        raise IntegrityError(f"content ({len(data)} bytes) does not hash to {cid}", cid=cid, size=len(data))


def normalise_cid(cid: str) -> str:
    """The CIDv1 base32 spelling of a CID, so CIDs from different sources compare as strings."""
    return str(parse_cid(cid).set(version=1, base="base32"))


def _duration(seconds: float) -> str:
    # Go's duration syntax, which both Kubo and js-ipfs accept for the global `timeout` option.
    return f"{max(1, round(seconds * 1000))}ms"


class IpfsClient:
    """Client of one daemon's RPC API, e.g. IpfsClient("http://127.0.0.1:5001")."""

    def __init__(
        self, api_url: str, timeout: float = 30.0, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=f"{self.api_url}/api/v0/", timeout=timeout + _GRACE, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> IpfsClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- commands ------------------------------------------------------------------------------------

    def version(self) -> dict[str, Any]:
        """The daemon's version object (Kubo: {"Version": "0.x.y", "Commit": ..., "Repo": ..., ...})."""
        with self._request("version") as response:
            return self._json(response)

    def add(self, data: bytes, *, pin: bool = True, only_hash: bool = False) -> str:
        """Store `data` (pinned unless pin=False) and return its CID; only_hash=True just computes it."""
        return self._add(data, {**_ADD_PARAMS, "pin": _flag(pin), "only-hash": _flag(only_hash)})

    def cat(self, cid: str, *, timeout: float | None = None, max_size: int = DEFAULT_MAX_CAT) -> bytes:
        """The content behind a CID, unverified (see fetch_verified); more than max_size bytes is an error."""
        parse_cid(cid)
        wait = self.timeout if timeout is None else timeout
        # `length` makes the daemon stop after one byte too many; the loop below enforces the limit anyway.
        params = {"arg": cid, "timeout": _duration(wait), "length": str(max_size + 1)}
        deadline = time.monotonic() + wait + _GRACE
        chunks: list[bytes] = []
        size = 0
        with self._request("cat", params=params, timeout=wait) as response:
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > max_size:
                    raise ContentTooLarge(f"cat {cid}: content exceeds max_size={max_size} bytes", cid=cid)
                if time.monotonic() > deadline:
                    # httpx's read timeout is per read; this bounds a daemon that trickles bytes.
                    raise IpfsTimeout(f"cat {cid}: no complete answer within {wait:.1f} s", cid=cid)
                chunks.append(chunk)
        return b"".join(chunks)

    def declared_size(self, cid: str, *, timeout: float | None = None) -> int | None:
        """The size the content's root block declares (files/stat: one block fetched, not the content);
        None when the daemon cannot say. Only a hint: a hostile DAG can declare any size."""
        parse_cid(cid)
        wait = self.timeout if timeout is None else timeout
        params = {"arg": f"/ipfs/{cid}", "timeout": _duration(wait)}
        try:
            with self._request("files/stat", params=params, timeout=wait) as response:
                size = self._json(response).get("Size")
        except (IpfsTimeout, IpfsUnavailable):
            raise
        except IpfsError:
            return None
        return size if type(size) is int and size >= 0 else None

    def pin(self, cid: str, *, timeout: float | None = None) -> None:
        """Pin a CID recursively (fetching it first if the daemon lacks it)."""
        parse_cid(cid)
        wait = self.timeout if timeout is None else timeout
        params = {"arg": cid, "recursive": "true", "timeout": _duration(wait)}
        with self._request("pin/add", params=params, timeout=wait) as response:
            self._json(response)

    def pins(self) -> set[str]:
        """CIDs pinned recursively, spelled as CIDv1 base32 (see normalise_cid)."""
        with self._request("pin/ls", params={"type": "recursive"}) as response:
            keys = self._json(response).get("Keys", {})
        if not isinstance(keys, dict):
            raise IpfsError("pin/ls: unexpected answer shape")
        return {normalise_cid(k) for k in keys}

    def cid_of(self, data: bytes) -> str:
        """The CID add() gives `data` (computed locally, exactly as the daemon would)."""
        return local_cid(data)

    def verify(self, cid: str, data: bytes) -> None:
        """Check that `data` is the content `cid` names; IntegrityError if not."""
        parsed = parse_cid(cid)
        codec = parsed.codec.name
        if codec == "raw":
            verify_local(cid, data)
            return
        if codec == "dag-pb" and parsed.version == 1:
            verify_local(cid, data)
            return
        if codec == "dag-pb":
            # Kubo's default layout for CIDv0 (no raw leaves), which only the daemon builds; no cid-base,
            # since base32 cannot spell a CIDv0 and the comparison is on normalised CIDs anyway.
            params = {
                "cid-version": str(parsed.version),
                "raw-leaves": _flag(parsed.version == 1),
                "only-hash": "true",
                "pin": "false",
                "progress": "false",
            }
            matches = normalise_cid(self._add(data, params)) == normalise_cid(cid)
        else:
            raise ValidationError("cid", f"cannot verify content of codec {codec} (only raw and dag-pb)")
        if not matches:
            raise IntegrityError(
                f"content ({len(data)} bytes) does not hash to {cid}", cid=cid, size=len(data)
            )

    def fetch_verified(
        self, cid: str, *, timeout: float | None = None, max_size: int = DEFAULT_MAX_CAT
    ) -> bytes:
        """cat() and verify(): the bytes returned are the ones the CID commits to.

        Content whose root declares more than max_size bytes is refused before anything is downloaded;
        content that lies about its size is cut off by cat() one byte past max_size.
        """
        declared = self.declared_size(cid, timeout=timeout)
        if declared is not None and declared > max_size:
            raise ContentTooLarge(
                f"{cid} declares {declared} bytes, over the limit of {max_size}; refused before download",
                cid=cid,
                size=declared,
            )
        data = self.cat(cid, timeout=timeout, max_size=max_size)
        self.verify(cid, data)
        return data

    # -- transport -----------------------------------------------------------------------------------

    def _add(self, data: bytes, params: dict[str, str]) -> str:
        files = {"file": ("data", data, "application/octet-stream")}
        with self._request("add", params=params, files=files) as response:
            body = response.read()
        # Kubo answers one JSON object per line (progress, then each file); the last names the content.
        cid = None
        for line in body.splitlines():
            if line.strip():
                cid = _parse_json(line, "add").get("Hash", cid)
        if not isinstance(cid, str):
            raise IpfsError(f"add: the daemon's answer names no CID: {body[:200]!r}")
        return cid

    @contextmanager
    def _request(
        self,
        command: str,
        *,
        params: dict[str, str] | None = None,
        files: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Iterator[httpx.Response]:
        """POST a command (the RPC API refuses GET), streaming the answer; errors become IpfsError kinds."""
        request_timeout = httpx.USE_CLIENT_DEFAULT if timeout is None else timeout + _GRACE
        try:
            with self._http.stream(
                "POST", command, params=params, files=files, timeout=request_timeout
            ) as response:
                if response.status_code != 200:
                    raise _daemon_error(command, response.status_code, response.read())
                yield response
        except httpx.HTTPError as err:
            raise _transport_error(err, self.api_url, command) from err

    @staticmethod
    def _json(response: httpx.Response) -> dict[str, Any]:
        return _parse_json(response.read(), str(response.request.url.path))


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _parse_json(raw: bytes, command: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        raise IpfsError(f"{command}: the daemon's answer is not JSON: {raw[:200]!r}") from None
    if not isinstance(value, dict):
        raise IpfsError(f"{command}: expected a JSON object, got {raw[:200]!r}")
    return value


def _daemon_error(command: str, status: int, body: bytes) -> IpfsError:
    # Kubo reports failures as {"Message": ..., "Code": ..., "Type": "error"} with status 500 (or 4xx).
    try:
        message = str(json.loads(body).get("Message") or body[:500].decode("utf-8", "replace"))
    except (ValueError, AttributeError):
        message = body[:500].decode("utf-8", "replace") or f"HTTP {status}"
    # An expired `timeout` option reads "request timed out" in js-ipfs, "context deadline exceeded" in Kubo.
    kind = IpfsTimeout if "timed out" in message or "deadline exceeded" in message else IpfsError
    return kind(f"{command}: {message}", status=status, daemon_message=message)


def _transport_error(err: httpx.HTTPError, api_url: str, command: str) -> IpfsError:
    if isinstance(err, httpx.ConnectError | httpx.ConnectTimeout):
        return IpfsUnavailable(f"IPFS RPC API at {api_url} is unreachable: {err}", api_url=api_url)
    if isinstance(err, httpx.TimeoutException):
        message = f"{command}: the daemon did not answer in time ({type(err).__name__})"
        return IpfsTimeout(message, api_url=api_url)
    return IpfsError(f"{command}: {type(err).__name__}: {err}", api_url=api_url)
