"""Reading the node's configuration: one TOML file, overridden by ZOO_NODE_* environment variables, then
by explicit overrides (CLI flags), validated once against the model in `config`.

Validation happens at start-up: unknown keys, wrong types and bad values stop the node with a message
naming the key and the file. Environment overrides use `__` for nesting:
ZOO_NODE_SERVER__LISTEN=0.0.0.0:50051.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from zoo.node.config import NodeConfig
from zoo.registry.errors import ZooError

ENV_PREFIX = "ZOO_NODE_"
# Variables under the prefix that are not config overrides: where caches and node_modules live, and
# secrets that never sit in a config file (a keystore's password, a signing key, the critic's API key).
NOT_OVERRIDES = frozenset({
    "ZOO_NODE_CACHE_DIR",
    "ZOO_NODE_MODULES",
    "ZOO_NODE_KEYSTORE_PASSWORD",
    "ZOO_NODE_PRIVATE_KEY",
    "ZOO_NODE_CRITIC_API_KEY",
    "ZOO_NODE_BANNER",
})  # fmt: skip


class ConfigError(ZooError):
    """The configuration is invalid; the message names the key, the source and the fix."""


def _parse_env_value(raw: str) -> Any:
    """Interpret an env value as a TOML value when it is one (numbers, booleans, arrays), else a string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key in NOT_OVERRIDES:
            continue
        path = key[len(ENV_PREFIX) :].lower().split("__")
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"environment variable {key} conflicts with another override")
        node[path[-1]] = _parse_env_value(raw)
    return tree


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in override.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _describe(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(root)"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"  {key}: {msg} (got {e.get('input')!r})")
    return "\n".join(lines)


def load_config(
    path: Path | None = None,
    environ: dict[str, str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> NodeConfig:
    """Read FILE (if given), apply ZOO_NODE_* env vars, then explicit overrides (CLI flags), validate."""
    environ = dict(os.environ) if environ is None else environ
    data: dict[str, Any] = {}
    sources = []
    if path is not None:
        path = Path(path).expanduser()
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
        except OSError as e:
            raise ConfigError(f"config file {path} cannot be read: {e}") from None
        sources.append(f"file {path}")
    env = _env_overrides(environ)
    if env:
        sources.append("environment " + ", ".join(sorted(k for k in environ if k.startswith(ENV_PREFIX))))
    data = _merge(_merge(data, env), overrides or {})
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_describe(e, "; ".join(sources) or "defaults")) from None


def effective_config(cfg: NodeConfig) -> dict[str, Any]:
    """The configuration as a plain dict for display, secrets masked."""
    out = cfg.model_dump(mode="json")
    token = cfg.server.admin_token
    out["server"]["admin_token"] = "********" if token is not None else None
    out["server"]["api_key"] = "********" if cfg.server.api_key is not None else None
    return out
