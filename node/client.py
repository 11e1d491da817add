"""NodeClient: a small synchronous Python client for a running zoo-node (used by the CLI and users).

from zoo.node.client import NodeClient
client = NodeClient("127.0.0.1:50051")
print(client.status().node_version)

Signed requests (node.credits): NodeClient(address, signer=account) signs every inference call with an
Ethereum account (an eth_account LocalAccount or a hex private key); for the OpenAI-compatible HTTP API,
httpx.Client(auth=SignedAuth(account, node_address)) does the same (node_address: GetStatus.node_address),
and so does openai.OpenAI(..., http_client=that client).
"""

from __future__ import annotations

import json
from collections import namedtuple
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zoo.node.credits.signing import HEADER, sign_request
from zoo.v1 import inference_pb2_grpc, jobs_pb2, jobs_pb2_grpc, library_pb2_grpc, node_pb2, node_pb2_grpc


class NodeNotRunning(Exception):
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
    ) -> None:
        """api_key: the node's server.api_key, sent with every inference call when the node requires one.
        signer: an account (LocalAccount or hex private key) that signs every inference call."""
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
        if signer is not None:  # the node's address is asked for once, at the first signed call
            self.channel = grpc.intercept_channel(self.channel, _Signed(signer, self._node_address))
        self._node_address_cached = ""
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

    def _node_address(self) -> str:
        if not self._node_address_cached:
            self._node_address_cached = self.status().node_address
        return self._node_address_cached

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

    def list_jobs(self, limit: int = 50) -> jobs_pb2.ListJobsResponse:
        return self.jobs.ListJobs(
            jobs_pb2.ListJobsRequest(limit=limit), metadata=self.admin_metadata(), timeout=self.timeout_s
        )

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

    def __init__(self, signer: Any, node_address: Callable[[], str]) -> None:
        self._signer = signer
        self._node_address = node_address

    def _signed(self, details: Any, request: Any) -> Any:
        if not details.method.startswith("/zoo.v1.InferenceService/"):
            return details
        # The stub serialises with SerializeToString too: the same bytes (no map fields in these messages).
        header = sign_request(self._signer, self._node_address(), details.method, request.SerializeToString())
        return _CallDetails(
            details.method,
            details.timeout,
            [*(details.metadata or []), (HEADER, header)],
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._signed(details, request), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._signed(details, request), request)


class SignedAuth(httpx.Auth):
    """httpx authentication that signs each request to a node's HTTP API (zoo-signature header)."""

    requires_request_body = True

    def __init__(self, signer: Any, node_address: str) -> None:
        self._signer = signer
        self._node_address = node_address

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        where = f"{request.method} {request.url.path}"
        request.headers[HEADER] = sign_request(self._signer, self._node_address, where, request.content)
        yield request
