"""Map every exception to the status a client sees, in one table: `CODES` gives each exception class one gRPC
code, and `HTTP` gives each gRPC code one HTTP status (with OpenAI's error type and code), so a class's HTTP
status is fixed by its gRPC code. The gRPC interceptor and the HTTP API (http/error_bodies.py) both read them
through `status_for`; nothing adds a row at import time.

Every exception of zoo-node is a ZooError (registry/errors.py) and has a row here, of its own or of a base
below ZooError; the few that are not ZooErrors say why in their docstring ("Not a ZooError: ...").
tests/node/api/test_status_codes.py checks both, and that every key names an exception class that exists.

An exception takes the row of the first class in its MRO that has one, so a subclass's own row wins over
its base's. Rows are keyed by the class's dotted path, not by the class: this module imports none of them,
so the table names exceptions of every layer (of torch- and web3-heavy modules too, which the daemon loads
only when it needs them, and of the CLI and the daemon, which api may not import) without loading them.

INTERNAL rows are faults of this node (its setup, files, tools or code) that a client can do nothing
about, each named by a row of its own: like an exception in no row, they are answered INTERNAL, logged with
their traceback, and their text is not sent to the client.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import grpc

from zoo.registry import errors as reg

_C = grpc.StatusCode


class Unimplemented(reg.ZooError):
    """The RPC exists in the API but this node does not implement it yet."""


CODES: Mapping[str, grpc.StatusCode] = MappingProxyType(
    {
        # contracts: no ZooErrors (the layer below registry)
        # registry
        "zoo.registry.errors.ValidationError": _C.INVALID_ARGUMENT,
        "zoo.registry.validation.Problem": _C.INVALID_ARGUMENT,
        "zoo.registry.errors.NotFound": _C.NOT_FOUND,
        "zoo.registry.errors.IntegrityError": _C.DATA_LOSS,
        "zoo.registry.usage_report.ReportError": _C.DATA_LOSS,
        "zoo.registry.errors.IpfsUnavailable": _C.UNAVAILABLE,
        "zoo.registry.errors.IpfsTimeout": _C.DEADLINE_EXCEEDED,
        "zoo.registry.errors.IpfsError": _C.UNAVAILABLE,
        "zoo.registry.errors.Overloaded": _C.RESOURCE_EXHAUSTED,
        "zoo.registry.chain.chain_errors.ContractRevert": _C.FAILED_PRECONDITION,  # the chain refuses it
        "zoo.registry.chain.chain_errors.ChainError": _C.UNAVAILABLE,  # RPC failed, or not mined
        "zoo.registry.keys.KeyLoadError": _C.INTERNAL,
        # inference
        "zoo.inference.engine.Unsupported": _C.FAILED_PRECONDITION,
        "zoo.inference.engine.WrongModel": _C.FAILED_PRECONDITION,  # a proof of weights not served here
        "zoo.inference.adapters.AdapterLoadError": _C.FAILED_PRECONDITION,
        "zoo.inference.backend_protocol.BackendUnavailable": _C.UNAVAILABLE,
        "zoo.inference.backend_protocol.BackendError": _C.INTERNAL,  # the model or the remote server failed
        "zoo.inference.llamacpp.gguf.GgufLoadCancelled": _C.UNAVAILABLE,  # the node is stopping
        "zoo.inference.llamacpp.gguf.GgufLoadError": _C.INTERNAL,
        "zoo.inference.bundled_models.ModelUnavailable": _C.INTERNAL,
        "zoo.inference.provenance.toploc.ProofError": _C.INVALID_ARGUMENT,  # a proof that does not parse
        # devnet: this node's own tools
        "zoo.devnet.anvil.AnvilError": _C.INTERNAL,
        "zoo.devnet.chain_state.ChainStateError": _C.INTERNAL,
        "zoo.devnet.ipfs_daemon.IpfsDaemonError": _C.INTERNAL,
        "zoo.devnet.manager.DevnetError": _C.INTERNAL,
        # trainer
        "zoo.trainer.tfgrpo.llm.ContextTooSmall": _C.FAILED_PRECONDITION,
        "zoo.trainer.envs.isolated_commands.NetworkIsolationUnavailable": _C.FAILED_PRECONDITION,
        "zoo.trainer.gspo.episodes.EpisodeFormatError": _C.FAILED_PRECONDITION,  # the model's chat template
        "zoo.trainer.lora.zero.ZeroConfigError": _C.INVALID_ARGUMENT,
        "zoo.trainer.tfgrpo.critic.JsonReplyError": _C.INTERNAL,  # the model's reply (ask_json retries it)
        # node
        "zoo.node.credits.verifier.TooManyNonces": _C.RESOURCE_EXHAUSTED,
        "zoo.node.credits.consent.SpendUnavailable": _C.UNAVAILABLE,
        "zoo.node.credits.signing.SignatureError": _C.UNAUTHENTICATED,
        "zoo.node.jobs.store.JobStateError": _C.FAILED_PRECONDITION,
        "zoo.node.jobs.store.JobStoreVersionError": _C.INTERNAL,
        "zoo.node.jobs.foreground.TrainingError": _C.FAILED_PRECONDITION,
        "zoo.node.p2p.messages.MessageError": _C.INVALID_ARGUMENT,
        "zoo.node.p2p.host.P2PError": _C.UNAVAILABLE,
        "zoo.node.api.status_codes.Unimplemented": _C.UNIMPLEMENTED,
        "zoo.node.endpoints.EndpointsUnavailable": _C.UNAVAILABLE,
        "zoo.node.client.NodeNotRunning": _C.UNAVAILABLE,
        "zoo.node.cli.eval.EvalError": _C.INVALID_ARGUMENT,
        "zoo.node.config_loading.ConfigError": _C.INTERNAL,
        "zoo.node.datadir.DataDirLocked": _C.INTERNAL,
        "zoo.node.api.grpc_server.BindError": _C.INTERNAL,
        "zoo.node.daemon.StartupError": _C.INTERNAL,
        # a ZooError no row above names
        "zoo.registry.errors.ZooError": _C.INTERNAL,
        # not ours
        "builtins.PermissionError": _C.PERMISSION_DENIED,
        "builtins.TimeoutError": _C.DEADLINE_EXCEEDED,
        "builtins.ConnectionError": _C.UNAVAILABLE,
    }
)

# gRPC code -> (HTTP status, OpenAI error type, OpenAI error code); one entry for each code of CODES.
HTTP: Mapping[grpc.StatusCode, tuple[int, str, str | None]] = MappingProxyType(
    {
        _C.INVALID_ARGUMENT: (400, "invalid_request_error", None),
        _C.FAILED_PRECONDITION: (400, "invalid_request_error", "unsupported"),
        _C.NOT_FOUND: (404, "invalid_request_error", "not_found"),
        _C.RESOURCE_EXHAUSTED: (429, "rate_limit_error", "rate_limit_exceeded"),
        _C.UNAVAILABLE: (503, "server_error", "unavailable"),
        _C.DEADLINE_EXCEEDED: (504, "server_error", "timeout"),
        _C.UNAUTHENTICATED: (401, "authentication_error", "invalid_api_key"),
        _C.PERMISSION_DENIED: (403, "permission_error", None),
        _C.UNIMPLEMENTED: (501, "server_error", "not_implemented"),
        _C.DATA_LOSS: (500, "server_error", None),
        _C.INTERNAL: (500, "server_error", None),
    }
)


def row_of(exc_type: type[BaseException]) -> tuple[str, grpc.StatusCode] | None:
    """The row `exc_type` takes: (the dotted path of the class in its MRO that has one, its code)."""
    for cls in exc_type.__mro__:
        key = f"{cls.__module__}.{cls.__qualname__}"
        if key in CODES:
            return key, CODES[key]
    return None


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The status code and client-facing message for a domain error; None for one that is INTERNAL (an
    INTERNAL row, or no row): the caller logs it and answers INTERNAL without its text."""
    row = row_of(type(exc))
    if row is None or row[1] == _C.INTERNAL:
        return None
    return row[1], str(exc)
