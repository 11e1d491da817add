"""NodeClient: a small synchronous Python client for a running zoo-node (used by the CLI and users).

from zoo.node.client import NodeClient
client = NodeClient("127.0.0.1:50051")
print(client.status().node_version)

Signed requests (node.credits): NodeClient(address, signer=account) signs every inference call with an
Ethereum account (an eth_account LocalAccount or a hex private key); for the OpenAI-compatible HTTP API,
httpx.Client(auth=SignedAuth(account, node_address)) does the same (node_address: GetStatus.node_address),
and so does openai.OpenAI(..., http_client=that client).

Spending credits (served first, charged per token): NodeClient(address, signer=account, spend=units) also
sends, with every call, the account's consent that this node may charge it up to `units` credits in the
current epoch (a SpendAuthorization, signed once per epoch; zoo.registry.spend); SignedAuth(account,
node_address, spend=authorization or a callable returning the current one) does the same over HTTP.
"""

from __future__ import annotations

import json
import time
from collections import namedtuple
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zoo.node.credits.signing import HEADER, SPEND_HEADER, sign_request, spend_header
from zoo.registry.errors import ZooError
from zoo.registry.spend import SpendAuthorization, sign_spend_authorization
from zoo.v1 import inference_pb2_grpc, jobs_pb2, jobs_pb2_grpc, library_pb2_grpc, node_pb2, node_pb2_grpc


class NodeNotRunning(ZooError):
    """No node is running for the given data directory."""


class NodeClient:
    def __init__(
        self,
        address: str,
        admin_token: str | None = None,
        tls_root_cert: bytes | None = None,
        use_tls: bool = False,
        timeout_s: float = 10.0,
        api_key: str | None = None,
        signer: Any = None,
        spend: int | None = None,
    ) -> None:
        """api_key: the node's server.api_key, sent with every inference call when the node requires one.
        signer: an account (LocalAccount or hex private key) that signs every inference call. spend: the
        credits per epoch the signer lets this node charge it (None: it spends none, served as anyone)."""
        if spend is not None and (signer is None or not 0 < spend < 2**256):
            raise ValueError("spend needs a signer and a number of credits from 1 to 2**256 - 1")
        self.address = address
        self.timeout_s = timeout_s
        self._token = admin_token
        if use_tls or tls_root_cert is not None:
            self.channel = grpc.secure_channel(
                address, grpc.ssl_channel_credentials(root_certificates=tls_root_cert)
            )
        else:
            self.channel = grpc.insecure_channel(address)
        if api_key:
            self.channel = grpc.intercept_channel(self.channel, _ApiKey(api_key))
        self.node = node_pb2_grpc.NodeServiceStub(self.channel)
        self._status_cached: node_pb2.NodeStatus | None = None
        if signer is not None:  # the node's address is asked for once, at the first signed call
            consent = _Consent(signer, spend, self._cached_status) if spend is not None else None
            self.channel = grpc.intercept_channel(self.channel, _Signed(signer, self._node_address, consent))
        self.inference = inference_pb2_grpc.InferenceServiceStub(self.channel)
        self.library = library_pb2_grpc.LibraryServiceStub(self.channel)
        self.jobs = jobs_pb2_grpc.JobServiceStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)

    @classmethod
    def from_data_dir(cls, data_dir: Path, **kwargs: Any) -> NodeClient:
        """Connect to the node running on this machine with DATA_DIR (reads node.json and admin.token)."""
        data_dir = Path(data_dir).expanduser()
        try:
            info = json.loads((data_dir / "node.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            raise NodeNotRunning(f"no zoo-node is running with data directory {data_dir}") from None
        token_file = data_dir / "admin.token"
        if "admin_token" not in kwargs and token_file.exists():
            kwargs["admin_token"] = token_file.read_text().strip()
        kwargs.setdefault("use_tls", bool(info.get("tls")))
        return cls(info["listen"], **kwargs)

    def admin_metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self._token}")] if self._token else []

    def _cached_status(self) -> node_pb2.NodeStatus:
        if self._status_cached is None:
            self._status_cached = self.status()
        return self._status_cached

    def _node_address(self) -> str:
        return self._cached_status().node_address

    def status(self) -> node_pb2.NodeStatus:
        return self.node.GetStatus(node_pb2.GetStatusRequest(), timeout=self.timeout_s)

    def peers(self) -> node_pb2.ListPeersResponse:
        return self.node.ListPeers(node_pb2.ListPeersRequest(), timeout=self.timeout_s)

    def health(self, service: str = "") -> str:
        """SERVING / NOT_SERVING / SERVICE_UNKNOWN for the node ("") or a component name."""
        resp = self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=self.timeout_s)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until the channel connects (not until SERVING: see health for that)."""
        grpc.channel_ready_future(self.channel).result(timeout=timeout_s)

    # -- learning jobs (admin: each call carries the admin token)

    def _admin(self, method: str, request: Any) -> Any:
        return getattr(self.jobs, method)(request, metadata=self.admin_metadata(), timeout=self.timeout_s)

    def list_jobs(self, limit: int = 50) -> jobs_pb2.ListJobsResponse:
        return self._admin("ListJobs", jobs_pb2.ListJobsRequest(limit=limit))

    def submit_job(self, kind: str, spec: dict[str, Any]) -> jobs_pb2.Job:
        from google.protobuf.struct_pb2 import Struct

        struct = Struct()
        struct.update(spec)
        return self._admin("SubmitJob", jobs_pb2.SubmitJobRequest(kind=kind, spec=struct))

    def get_job(self, job_id: str) -> jobs_pb2.Job:
        return self._admin("GetJob", jobs_pb2.GetJobRequest(id=job_id))

    def cancel_job(self, job_id: str) -> jobs_pb2.Job:
        return self._admin("CancelJob", jobs_pb2.CancelJobRequest(id=job_id))

    def watch_job(self, job_id: str) -> Any:
        """The job's events as they happen (a stream: no deadline)."""
        return self.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=job_id), metadata=self.admin_metadata())

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _CallDetails(
    namedtuple("_CallDetails", "method timeout metadata credentials wait_for_ready compression"),
    grpc.ClientCallDetails,
):
    pass


class _ApiKey(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer <api_key>` to InferenceService calls (admin calls carry their own)."""

    def __init__(self, api_key: str) -> None:
        self._metadata = ("authorization", f"Bearer {api_key}")

    def _with_key(self, details: Any) -> Any:
        if not details.method.startswith("/zoo.v1.InferenceService/"):
            return details
        return _CallDetails(
            details.method,
            details.timeout,
            [*(details.metadata or []), self._metadata],
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_key(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_key(details), request)


class _Signed(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds a zoo-signature header to InferenceService calls, over the request's bytes as sent."""

    def __init__(self, signer: Any, node_address: Callable[[], str], consent: _Consent | None = None) -> None:
        self._signer = signer
        self._node_address = node_address
        self._consent = consent

    def _signed(self, details: Any, request: Any) -> Any:
        if not details.method.startswith("/zoo.v1.InferenceService/"):
            return details
        # The stub serialises with SerializeToString too: the same bytes (no map fields in these messages).
        header = sign_request(self._signer, self._node_address(), details.method, request.SerializeToString())
        extra = [(HEADER, header)]
        if self._consent is not None:
            extra.append((SPEND_HEADER, self._consent.header()))
        return _CallDetails(
            details.method,
            details.timeout,
            [*(details.metadata or []), *extra],
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._signed(details, request), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._signed(details, request), request)


class _Consent:
    """The signer's spend authorization for the node's current epoch, signed once per epoch."""

    def __init__(self, signer: Any, units: int, status: Callable[[], node_pb2.NodeStatus]) -> None:
        self._signer, self._units, self._status = signer, units, status
        self._signed: SpendAuthorization | None = None

    def header(self) -> str:
        st = self._status()
        if not st.ledger_address or not st.credit_epoch_seconds:
            raise ValueError(f"the node at {st.listen_address} takes no credits (it names no UsageLedger)")
        epoch = int(time.time()) // st.credit_epoch_seconds
        if self._signed is None or self._signed.epoch != epoch:
            self._signed = sign_spend_authorization(
                self._signer, st.chain_id, st.ledger_address, st.node_address, epoch, self._units
            )
        return spend_header(epoch, self._units, self._signed.signature)


class SignedAuth(httpx.Auth):
    """httpx authentication that signs each request to a node's HTTP API (zoo-signature header) and, with
    `spend`, sends the signer's consent to be charged credits (zoo-spend header)."""

    requires_request_body = True

    def __init__(
        self,
        signer: Any,
        node_address: str,
        spend: SpendAuthorization | Callable[[], SpendAuthorization] | None = None,
    ) -> None:
        self._signer = signer
        self._node_address = node_address
        self._spend = spend

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        where = f"{request.method} {request.url.path}"
        request.headers[HEADER] = sign_request(self._signer, self._node_address, where, request.content)
        if self._spend is not None:
            consent = self._spend() if callable(self._spend) else self._spend
            request.headers[SPEND_HEADER] = spend_header(consent.epoch, consent.units, consent.signature)
        yield request
