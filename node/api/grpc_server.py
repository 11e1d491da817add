"""Assemble the gRPC server: services, health (per component), reflection, interceptor, TLS."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from zoo.node.api.interceptor import NodeInterceptor
from zoo.node.api.node_service import PLANNED, unimplemented_handler
from zoo.node.components.supervisor import Supervisor
from zoo.node.config import NodeConfig
from zoo.node.credits.identity import Identify
from zoo.node.lifecycle import State, Status
from zoo.node.metrics import NodeMetrics
from zoo.registry.errors import ZooError
from zoo.v1 import node_pb2

# The component that must be usable for the node as a whole to report SERVING: without a model the
# node cannot answer queries; without chain or IPFS it still serves its last verified library. A light node
# (model.backend = 'none') has its model disabled by configuration, which does not count against it.
ESSENTIAL = ("model",)

SERVICE_NAMES = (
    node_pb2.DESCRIPTOR.services_by_name["NodeService"].full_name,
    *PLANNED,
)


class BindError(ZooError):
    """The listen address cannot be bound."""


class HealthBridge:
    """Mirrors component states into the standard grpc.health.v1 service.

    Service names: "" (the node as a whole), each component by name ("chain", "ipfs", "model",
    "library"), and each zoo.v1 service (serving when the node is).
    """

    def __init__(self, supervisor: Supervisor) -> None:
        self.servicer = HealthServicer()
        self.supervisor = supervisor

    async def update(self, status: Status | None = None) -> None:
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        for s in self.supervisor.statuses.values():
            await self.servicer.set(s.name, serving if s.state.usable else not_serving)
        essential = [self.supervisor.statuses[n] for n in ESSENTIAL if n in self.supervisor.statuses]
        overall = all(s.state.usable or s.state is State.DISABLED for s in essential)
        for name in ("", *SERVICE_NAMES):
            await self.servicer.set(name, serving if overall else not_serving)

    async def shutdown(self) -> None:
        await self.servicer.enter_graceful_shutdown()


def build_server(
    cfg: NodeConfig,
    metrics: NodeMetrics,
    admin_token: str,
    health: HealthBridge,
    servicers: list[tuple[Callable[[Any, grpc.aio.Server], None], Any]],
    identify: Identify | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Create and bind the server; returns it with the bound port (not started yet)."""
    api_key = cfg.server.api_key.get_secret_value() if cfg.server.api_key else None
    interceptor = NodeInterceptor(
        metrics, admin_token, cfg.server.max_concurrent_rpcs, api_key=api_key, identify=identify
    )
    server = grpc.aio.server(
        interceptors=[interceptor],
        options=[
            ("grpc.max_receive_message_length", 16 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.so_reuseport", 0),  # a second node on the same port must fail, not share it
        ],
    )
    implemented = set()
    for add, servicer in servicers:
        add(servicer, server)
        implemented.add(add.__name__.removeprefix("add_").removesuffix("Servicer_to_server"))
    for full_name, (module, what) in PLANNED.items():
        if full_name.rsplit(".", 1)[1] not in implemented:
            server.add_generic_rpc_handlers((unimplemented_handler(full_name, module, what),))
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    address = cfg.server.listen
    try:
        if cfg.server.tls_cert and cfg.server.tls_key:
            creds = grpc.ssl_server_credentials(
                [(cfg.server.tls_key.read_bytes(), cfg.server.tls_cert.read_bytes())]
            )
            port = server.add_secure_port(address, creds)
        else:
            port = server.add_insecure_port(address)
    except OSError as e:
        raise BindError(f"cannot read TLS files: {e}") from None
    except RuntimeError as e:
        raise BindError(f"cannot listen on {address}: {e}") from None
    if port == 0:
        raise BindError(f"cannot listen on {address} (address in use or not local)")
    return server, port
