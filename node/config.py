"""The node's configuration model: one section per table of the TOML file, each key typed, bounded and
documented (docs/configuration.md lists every key and default; tests/test_docs.py checks it against this).

Every setting has a default, so `zoo-node start` needs no file at all. Reading the file and the ZOO_NODE_*
environment overrides is `config_loading`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from zoo.inference.defaults import (
    DEFAULT_EXPERIENCE_BUDGET,
    DEFAULT_FACTOR_CAP,
    DEFAULT_FACTOR_ETA,
    DEFAULT_K,
    DEFAULT_LESSON_POSITION,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MIN_SIMILARITY,
    LessonPosition,
    ServingDefaults,
)


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "zoo-node"


def default_cache_dir() -> Path:
    """Where converted models and compiled contracts are cached (ZOO_NODE_CACHE_DIR overrides)."""
    env = os.environ.get("ZOO_NODE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "zoo-node"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, use_attribute_docstrings=True)


_LISTEN_RE = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]+):(?P<port>\d{1,5})$")


def parse_listen(value: str) -> tuple[str, int]:
    """Split HOST:PORT (IPv6 as [::1]:PORT); raise ValueError naming what is wrong."""
    m = _LISTEN_RE.match(value.strip())
    if not m:
        raise ValueError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:50051 or [::1]:50051)")
    port = int(m.group("port"))
    if port > 65535:
        raise ValueError(f"port {port} in {value!r} is out of range 0-65535")
    return m.group("host"), port


def _valid_listen(value: str) -> str:
    parse_listen(value)
    return value


ListenAddress = Annotated[str, AfterValidator(_valid_listen)]
"""A HOST:PORT listen address, checked by parse_listen when the config is loaded."""


class ServerConfig(_Section):
    listen: ListenAddress = "127.0.0.1:50051"
    """gRPC listen address HOST:PORT; port 0 picks a free port (the chosen one is logged and written to
    DATA_DIR/node.json)."""
    grace_period_s: float = Field(10.0, ge=0, le=600)
    """On SIGINT/SIGTERM, in-flight RPCs get this long to finish before the node exits."""
    admin_token: SecretStr | None = None
    """Bearer token for admin RPCs (jobs, key-spending and library-writing calls). When unset the node
    generates one on first start and keeps it in DATA_DIR/admin.token (mode 0600)."""
    api_key: SecretStr | None = None
    """Bearer token for the public inference endpoints: when set, gRPC InferenceService calls and every
    HTTP /v1/* request must send `authorization: Bearer <api_key>` (UNAUTHENTICATED / 401 otherwise).
    Unset: inference is open. The admin token is never needed for inference."""
    tls_cert: Path | None = None
    """PEM certificate chain; TLS is on when tls_cert and tls_key are both set."""
    tls_key: Path | None = None
    """PEM private key for tls_cert."""
    max_concurrent_rpcs: int = Field(64, ge=1, le=10_000)
    """RPCs handled at once; further calls are refused with RESOURCE_EXHAUSTED."""

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be set together (TLS needs both)")
        return self


class MetricsConfig(_Section):
    enabled: bool = True
    """Serve Prometheus metrics over HTTP."""
    listen: ListenAddress = "127.0.0.1:9464"
    """Metrics HTTP listen address HOST:PORT (port 0 picks a free port)."""


class HttpConfig(_Section):
    enabled: bool = True
    """Serve the OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/embeddings,
    /v1/models) in the daemon's process, sharing its model, admission queue and metrics."""
    listen: ListenAddress = "127.0.0.1:8080"
    """HTTP listen address HOST:PORT (port 0 picks a free port; the chosen one is written to node.json)."""
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=1024**3)
    """Largest request body accepted; a bigger one is refused with 413."""
    app: bool = True
    """Serve the governance web app at / (beside /v1): KEEPER holders, contributors and operators in a
    browser, every transaction signed by the user's own wallet. Read-only for the node: it relays chain
    reads and library bytes, and holds no key for the page."""
    app_status: bool = True
    """Show this node's status (components, serving, library, peers, credits) on the web app's operator
    page to anyone who can reach the HTTP port; false: GET /app/status.json answers 404."""


class LogConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level written to stderr."""
    format: Literal["text", "json"] = "text"
    """`text`: key=value lines for people; `json`: one JSON object per line for log shippers."""


class ChainConfig(_Section):
    mode: Literal["devnet", "external", "off"] = "devnet"
    """`devnet`: use (and start if needed) the local devnet; `external`: rpc_url + registry_address;
    `off`: no chain (the node serves its local library unverified by governance)."""
    rpc_url: str | None = None
    """JSON-RPC endpoint of an EVM chain (external mode)."""
    registry_address: str | None = None
    """ExperienceRegistry contract address (external mode)."""
    ledger_address: str | None = None
    """UsageLedger contract address (external mode; optional): credit balances and usage settlement."""
    probe_interval_s: float = Field(5.0, gt=0, le=3600)
    """How often the chain's health is probed."""
    confirmations: int = Field(0, ge=0, le=1000)
    """Follow LibraryUpdated events this many blocks behind the head."""
    poll_interval_s: float = Field(2.0, gt=0, le=3600)
    """How often the node looks for newly approved library versions (each interval jittered by up to 20 %,
    so nodes do not poll in step; a checked peer announcement triggers an extra poll at once)."""
    from_block: int = Field(0, ge=0)
    """First block to read registry events from (its deployment block; public RPCs limit log ranges)."""

    @field_validator("registry_address", "ledger_address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"0x[0-9a-fA-F]{40}", v):
            raise ValueError(f"{v!r} is not a 0x-prefixed 20-byte hex address")
        return v

    @model_validator(mode="after")
    def _external_needs_endpoints(self) -> ChainConfig:
        if self.mode == "external" and not (self.rpc_url and self.registry_address):
            raise ValueError("rpc_url and registry_address must be set when mode = 'external'")
        return self


class DevnetConfig(_Section):
    voting_period_s: int = Field(300, ge=1, le=365 * 24 * 3600)
    """Voting window of the devnet registry (`zoo-node devnet warp` moves the chain clock)."""
    execution_delay_s: int = Field(0, ge=0, le=365 * 24 * 3600)
    """Delay between the end of voting and execution on the devnet."""
    grace_period_s: int = Field(14 * 24 * 3600, ge=1, le=365 * 24 * 3600)
    """How long a passed proposal stays executable on the devnet before it expires."""
    voter_registry: Literal["none", "allowlist"] = "none"
    """`allowlist`: deploy the checkpointed AllowlistVoterRegistry (dev0 owns it, every dev account is
    registered) so only registered addresses vote; `none`: every KEEPER holder votes."""
    challenge_window_s: int = Field(300, ge=1, le=365 * 24 * 3600)
    """How long a usage report on the devnet's UsageLedger can be challenged before credits are claimable."""
    anvil_port: int = Field(0, ge=0, le=65535)
    """Port of the devnet chain's JSON-RPC (0 = any free port)."""
    ipfs_api_port: int = Field(0, ge=0, le=65535)
    """Port of the devnet IPFS RPC API (0 = any free port)."""


class IpfsConfig(_Section):
    api_url: str | None = None
    """Kubo RPC API base URL (e.g. http://127.0.0.1:5001). Unset: the devnet's IPFS in devnet mode."""
    timeout_s: float = Field(30.0, gt=0, le=3600)
    """Timeout of one IPFS call."""
    max_library_bytes: int = Field(64 * 1024 * 1024, ge=1024, le=1024**3)
    """Largest library blob the node fetches; bigger content is refused."""
    probe_interval_s: float = Field(5.0, gt=0, le=3600)
    """How often IPFS health is probed."""


def llamacpp_installed() -> bool:
    """Whether llama-cpp-python is importable (found, not imported: its library loads only to serve)."""
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


class ModelConfig(_Section):
    backend: Literal["auto", "llamacpp", "transformers", "vllm", "openai", "none"] = "auto"
    """Generation backend. `llamacpp`: a GGUF model in process through llama-cpp-python (CPU). `auto`:
    llamacpp for a GGUF model (the bundled one included) on a CPU when llama-cpp-python is installed,
    transformers otherwise. `none`: a light node (a bootstrap or relay node, or a router in front of
    others): it serves no model, loads no embedder and runs no jobs, and routes requests that name a
    model to peers that serve it."""
    path: Path | None = None
    """The model: a GGUF file (llamacpp) or a Hugging Face model directory (transformers, vllm). Unset: the
    bundled SmolLM2-135M-Instruct (its GGUF as shipped; for transformers, converted once into a cached
    directory)."""
    device: str = "cpu"
    """torch device for the transformers backend (`cpu`, `cuda`, `cuda:1`)."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """Weight dtype. `auto`: bfloat16 on a GPU (float16 where it lacks bf16), and on a CPU bfloat16 only
    where the CPU has bf16 units (AVX512-BF16/AMX), float32 otherwise, where bf16 runs ~6x slower."""
    threads: int = Field(0, ge=0, le=1024)
    """CPU threads for torch or llama.cpp (0: torch's default; llama.cpp: all usable cores)."""
    adapters_dir: Path | None = None
    """Named LoRA adapters (`<dir>/<name>/`, PEFT format) that requests may ask for; GSPO jobs install
    theirs here. Unset: `<data_dir>/adapters`."""
    max_loaded_adapters: int = Field(8, ge=1, le=256)
    """Adapters kept loaded at once (transformers backend); the least recently used idle one makes room."""
    base_url: str | None = None
    """openai backend: base URL of the OpenAI-compatible server (e.g. http://127.0.0.1:8000)."""
    name: str | None = None
    """openai backend: model name to request; vllm/transformers: the model id reported to clients."""
    api_key_env: str = "OPENAI_API_KEY"
    """openai backend: environment variable holding the API key (the key itself never sits in config)."""
    context_length: int | None = Field(None, ge=256, le=10_000_000)
    """openai backend: the served model's context window (default 8192). llamacpp: the tokens each
    concurrent request may hold (default 2048; the KV cache, allocated at start, is this x
    inference.max_batch_size x the model's bytes per token: 23 KB for the bundled model, so 16 x 2048
    takes 0.75 GB). transformers and vllm read it from the model."""

    kv_cache_type: Literal["f16", "q8_0"] = "f16"
    """llamacpp: how the KV cache stores keys and values. q8_0 halves its memory (about 0.38 GB instead of
    0.75 GB at the defaults) at the cost of a little precision and ~10% of batched throughput here."""

    @model_validator(mode="after")
    def _openai_needs_server(self) -> ModelConfig:
        if self.backend == "openai" and not (self.base_url and self.name):
            raise ValueError("base_url and name must be set when backend = 'openai'")
        if self.backend == "none" and self.path is not None:
            raise ValueError(f"backend = 'none' serves no model, yet path is set ({self.path}): unset one")
        return self

    @model_validator(mode="after")
    def _resolve_auto_backend(self) -> ModelConfig:
        """`auto` becomes the backend that serves this model best here, once, as the config loads."""
        if self.backend == "auto":
            gguf = self.path is None or self.path.suffix.lower() == ".gguf"
            self.backend = (
                "llamacpp" if gguf and self.device == "cpu" and llamacpp_installed() else "transformers"
            )
        if self.backend == "llamacpp":
            if self.device != "cpu":
                raise ValueError("the llamacpp backend runs on the CPU (device = 'cpu')")
            if self.path is not None and self.path.suffix.lower() != ".gguf":
                raise ValueError(f"the llamacpp backend serves a GGUF file; path {self.path} is not one")
        return self


class InferenceConfig(_Section):
    default_k: int = Field(DEFAULT_K, ge=0, le=100)
    """Experiences retrieved when a request does not say."""
    max_k: int = Field(20, ge=1, le=100)
    """Largest k a request may ask for."""
    experience_budget_tokens: int = Field(DEFAULT_EXPERIENCE_BUDGET, ge=0, le=100_000)
    """Prompt tokens the experience block may take; lowest-scoring experiences are dropped to fit."""
    default_max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1, le=100_000)
    """Tokens generated when a request does not say."""
    max_tokens_limit: int = Field(2048, ge=1, le=100_000)
    """Largest max_tokens a request may ask for."""
    max_n: int = Field(8, ge=1, le=128)
    """Most choices (OpenAI's `n`) one request may ask for. The n choices share one prefill and one
    admission slot, and take n rows of the batch."""
    max_batch_size: int = Field(16, ge=1, le=1024)
    """Requests generating at once. The transformers backend decodes them as one batch (continuous
    batching: requests join and leave between steps); the openai backend sends at most this many to its
    server at a time."""
    max_queued: int = Field(128, ge=0, le=100_000)
    """Requests that may wait for a free slot, in arrival order; beyond this, RESOURCE_EXHAUSTED (HTTP 429)
    at once."""
    max_wait_s: float = Field(60.0, gt=0, le=3600)
    """Longest a request waits for a slot before it is refused with RESOURCE_EXHAUSTED (a client deadline
    that is shorter ends the wait first)."""
    ann_threshold: int = Field(20_000, ge=1)
    """Libraries with at least this many experiences use the approximate index instead of exact search."""
    lesson_position: LessonPosition = DEFAULT_LESSON_POSITION
    """Where lessons sit in a prompt: "system" (the system turn) or "user" (right before the question in
    the last user turn). Worked examples are always earlier turns. Learning jobs use the same setting."""
    min_similarity: float = Field(DEFAULT_MIN_SIMILARITY, ge=-1, le=1)
    """The relevance gate: retrieved experiences less similar to the query than this (cosine, bundled
    embedder) stay out of the prompt, so a question the library has nothing for is answered as if it were
    empty. -1 turns the gate off. `zoo-node library calibrate --dataset VALIDATION.jsonl` suggests a value
    for a library from its own validation tasks."""
    factor_eta: float = Field(DEFAULT_FACTOR_ETA, ge=0, le=100)
    """Scale of decode-time expert factors: weight = eta * log(q / (1 - q)) for reliability q."""
    factor_cap: float = Field(DEFAULT_FACTOR_CAP, ge=0, le=1000)
    """Bound of one experience's factor weight, either way (the weight lies in [-cap, cap])."""

    def serving_defaults(self) -> ServingDefaults:
        """What a learning job's unset prompt and factor settings become (train/serve parity)."""
        return ServingDefaults(
            k=self.default_k,
            experience_budget_tokens=self.experience_budget_tokens,
            lesson_position=self.lesson_position,
            min_similarity=self.min_similarity,
            factor_eta=self.factor_eta,
            factor_cap=self.factor_cap,
        )

    @model_validator(mode="after")
    def _defaults_within_limits(self) -> InferenceConfig:
        if self.default_k > self.max_k:
            raise ValueError(f"default_k ({self.default_k}) must not exceed max_k ({self.max_k})")
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError("default_max_tokens must not exceed max_tokens_limit")
        return self


class JobsConfig(_Section):
    max_queued: int = Field(16, ge=1, le=10_000)
    """Jobs that may wait in the queue; a submit beyond that is refused (RESOURCE_EXHAUSTED)."""


class CreditsConfig(_Section):
    allow_anonymous: bool = True
    """Serve requests that carry no zoo-signature header, as an anonymous client. Off: every inference
    request must be signed (UNAUTHENTICATED, HTTP 401 otherwise; see zoo.node.client)."""
    max_clock_skew_s: float = Field(60.0, gt=0, le=3600)
    """How far a signed request's timestamp may be from the node's clock, either way."""
    max_remembered_nonces: int = Field(200_000, ge=100, le=10_000_000)
    """Signed requests remembered (against replay) at once; beyond, signed requests are refused as
    overloaded until older ones expire (max_clock_skew_s after they were signed)."""
    epoch_s: int = Field(86_400, ge=1, le=365 * 86_400)
    """Length of a metering epoch in seconds: usage is totalled, reported and settled per epoch. With a
    UsageLedger, the ledger's epoch length is used (a node must meter the epochs it settles)."""
    price_per_token: float = Field(1.0, gt=0, le=1e12)
    """Credits a credit holder's answer costs per token (prompt and completion), up to what it holds."""
    reserved_slots: int = Field(1, ge=0, le=1024)
    """Slots of the model's batch that only credit holders' requests use (at most max_batch_size - 1;
    only with a UsageLedger), so a holder under load does not wait for a slot to free."""
    balance_ttl_s: float = Field(5.0, gt=0, le=3600)
    """How long a credit balance read from the chain is trusted before it is read again."""
    settle: bool = True
    """With a UsageLedger: post each ended epoch's usage report and apply its spends (node/credits/
    settlement.py; the node must be registered by the DAO: `zoo-node dao propose-node`)."""
    settle_interval_s: float = Field(30.0, gt=0, le=86_400)
    """How often settlement looks for ended epochs and reports whose challenge window has passed."""


class P2PConfig(_Section):
    enabled: bool = True
    """Run a libp2p host: gossip library versions and capabilities, serve library bytes to peers, route."""
    listen: str = "/ip4/127.0.0.1/tcp/0"
    """libp2p listen multiaddr (TCP). Loopback by default; set a public address and a fixed port to be
    reachable by other machines."""
    bootstrap: list[str] = Field(default_factory=list, max_length=64)
    """Peers to dial at start and whenever disconnected: /ip4/HOST/tcp/PORT/p2p/PEER_ID multiaddrs."""
    capabilities_interval_s: float = Field(10.0, gt=0, le=3600)
    """How often this node checks what it serves (models, load, library version, addresses) and
    advertises it if it changed; unchanged, it is re-advertised every capabilities_ttl_s / 3."""
    capabilities_ttl_s: float = Field(90.0, gt=0, le=86_400)
    """A peer's capabilities expire this long after its last refresh (it stopped, or is unreachable).
    Peers refresh theirs every third of their own TTL: keep it the same on every node."""
    redial_interval_s: float = Field(5.0, gt=0, le=3600)
    """How often known and bootstrap peers that are not connected are dialled (with backoff each)."""
    discovery: bool = True
    """Walk the Kademlia DHT to learn and connect peers beyond the bootstrap list and the peer book. Off:
    the node connects only to those (a fixed set of peers; `./zoo bench network`'s baseline)."""
    target_peers: int = Field(8, ge=0, le=1000)
    """Connected peers the node keeps: below this it dials its bootstrap peers, its book and the peers the
    DHT found (its routing table), and walks the DHT every redial_interval_s instead of every
    discovery_interval_s while it knows peers it is not connected to. At or above it, one known peer it is
    not connected to is dialled after each DHT walk (the mesh keeps mixing, and a healed partition joins)."""
    max_peers: int = Field(0, ge=0, le=1000)
    """0 (the default): no connection limit; py-libp2p's connection manager dials the peers it knows (it aims
    at 200 connections), so a small network is a full mesh. Otherwise the connected peers (inbound ones and
    those DHT queries opened included) above which the node closes the excess, at random among those not in
    its gossip mesh, not exchanging library bytes with it, not bootstrap peers or relays and older than a
    minute; the library then aims at target_peers. Off by default: at N = 24 on two cores (docs/network.md)
    nodes without IPFS could no longer fetch a version from peers with a limit of 12."""
    discovery_interval_s: float = Field(120.0, gt=0, le=86_400)
    """How often the node walks the Kademlia DHT (looks up its own id and a random one) to learn peers
    beyond those it is connected to, once it has its target of peers; the walk also re-announces the
    library CID it holds as a provider record when that is ten minutes old."""
    rate_limit_per_s: float = Field(5.0, gt=0, le=10_000)
    """Gossip messages accepted per publishing peer and second, on average ..."""
    rate_limit_burst: float = Field(20.0, ge=1, le=100_000)
    """... with bursts up to this many; beyond, messages are dropped and the peer scored down."""
    drop_score: float = Field(-25.0, lt=0)
    """A peer whose score falls to this is banned: messages dropped, disconnected, never asked for content
    (a fake announcement costs 10, tampered content 20)."""
    fetch_timeout_s: float = Field(20.0, gt=0, le=3600)
    """Deadline of one library-bytes fetch from a peer."""
    relays: list[str] = Field(default_factory=list, max_length=8)
    """This node is behind NAT: relays (nodes with relay_service on, /ip4/HOST/tcp/PORT/p2p/PEER_ID) it
    keeps a reserved slot at and advertises /p2p-circuit addresses through, so peers can dial it. It then
    advertises no gRPC address (unless advertise_grpc is set): peers route to it over libp2p."""
    relay_service: bool = False
    """Relay for nodes behind NAT (circuit relay v2): they reserve a slot here and peers reach them through
    this node, within the limits below. For a node with a public address."""
    relay_max_reservations: int = Field(64, ge=1, le=100_000)
    """Nodes behind NAT that may hold a slot at once (relay_service)."""
    relay_max_circuits: int = Field(16, ge=1, le=10_000)
    """Relayed connections to one node behind NAT at once (relay_service)."""
    relay_circuit_mb: int = Field(256, ge=1, le=1 << 20)
    """Data one relayed connection may carry, both ways, before the relay resets it (relay_service)."""
    relay_circuit_s: int = Field(3600, ge=10, le=86_400 * 7)
    """Lifetime of one relayed connection before the relay resets it (relay_service); peers redial."""
    grpc_over_p2p: bool | None = None
    """Peers may reach this node's gRPC API over libp2p (`/zoo/grpc/1.0.0`, relayed when behind NAT), so a
    node with no reachable gRPC address still answers routed requests. They reach what the gRPC port
    offers: admin calls need the admin token, server.api_key applies. Unset: on for a node behind NAT
    (relays set), off otherwise. Never with TLS (plain gRPC only) or on a light node (nothing to route)."""
    routing: bool = True
    """Forward an Infer request for a model this node does not serve to a peer that advertises it."""
    advertise_grpc: str | None = None
    """HOST:PORT peers use to reach this node's gRPC API (routing). Default: the bound server.listen
    address, unless that is a wildcard (0.0.0.0, ::), which is not advertised: set this instead."""
    route_timeout_s: float = Field(120.0, gt=0, le=3600)
    """Deadline of one routed request at the peer (up to two other peers are tried after transport
    failures)."""

    @model_validator(mode="after")
    def _peer_limits(self) -> P2PConfig:
        if self.max_peers and self.max_peers < self.target_peers:
            raise ValueError(
                f"max_peers ({self.max_peers}) must be 0 (no limit) "
                f"or at least target_peers ({self.target_peers})"
            )
        return self

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        if not re.fullmatch(r"/ip[46]/[^/]+/tcp/\d{1,5}", v):
            raise ValueError(f"{v!r} is not a TCP listen multiaddr such as /ip4/127.0.0.1/tcp/4001")
        return v

    @field_validator("advertise_grpc")
    @classmethod
    def _advertise(cls, v: str | None) -> str | None:
        if v is not None and parse_listen(v)[1] == 0:
            raise ValueError(f"{v!r}: advertise the real port, not 0")
        return v

    @field_validator("bootstrap", "relays")
    @classmethod
    def _bootstrap(cls, v: list[str]) -> list[str]:
        dialable = re.compile(r"/(ip[46]|dns[46]?)/[^/]+/tcp/\d{1,5}/p2p/[1-9A-HJ-NP-Za-km-z]{40,64}")
        for addr in v:
            if not dialable.fullmatch(addr):
                raise ValueError(
                    f"{addr!r} is not a dialable peer address such as /ip4/10.0.0.2/tcp/4001/p2p/12D3KooW..."
                )
        return v


class EmbedderConfig(_Section):
    path: Path | None = None
    """sentence-transformers model directory. Unset: the bundled all-MiniLM-L6-v2."""


class NodeConfig(_Section):
    """Root of the configuration file."""

    data_dir: Path = Field(default_factory=default_data_dir)
    """Node state: library store, job database, lock, admin token, devnet state."""
    cache_dir: Path = Field(default_factory=default_cache_dir)
    """Rebuildable caches: converted models, compiled contracts."""
    server: ServerConfig = Field(default_factory=ServerConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    chain: ChainConfig = Field(default_factory=ChainConfig)
    ipfs: IpfsConfig = Field(default_factory=IpfsConfig)
    devnet: DevnetConfig = Field(default_factory=DevnetConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    embedder: EmbedderConfig = Field(default_factory=EmbedderConfig)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    jobs: JobsConfig = Field(default_factory=JobsConfig)
    p2p: P2PConfig = Field(default_factory=P2PConfig)
    credits: CreditsConfig = Field(default_factory=CreditsConfig)

    @field_validator("data_dir", "cache_dir")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return Path(os.path.expandvars(str(v))).expanduser().absolute()

    @property
    def light(self) -> bool:
        """A light node (model.backend = 'none'): gossip, content and routing, no model, embedder or jobs."""
        return self.model.backend == "none"

    @property
    def adapters_dir(self) -> Path:
        """Where named LoRA adapters live (model.adapters_dir, else <data_dir>/adapters)."""
        return self.model.adapters_dir or self.data_dir / "adapters"
