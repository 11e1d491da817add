"""Config loading: defaults, TOML, env overrides, and errors that name the key and the source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zoo.node.config_loading import ConfigError, effective_config, load_config


def test_defaults_need_no_file() -> None:
    cfg = load_config(None, environ={})
    assert cfg.server.listen == "127.0.0.1:50051"
    assert cfg.chain.mode == "devnet"
    assert cfg.data_dir.is_absolute()


def test_file_then_env_then_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[server]\nlisten = "127.0.0.1:7000"\ngrace_period_s = 3\n[log]\nlevel = "debug"\n')
    cfg = load_config(
        f, environ={"ZOO_NODE_SERVER__GRACE_PERIOD_S": "7.5", "ZOO_NODE_METRICS__ENABLED": "false"}
    )
    assert cfg.server.listen == "127.0.0.1:7000"
    assert cfg.server.grace_period_s == 7.5
    assert cfg.metrics.enabled is False
    assert cfg.log.level == "debug"
    cfg = load_config(f, environ={}, overrides={"server": {"listen": "[::1]:9"}})
    assert cfg.server.listen == "[::1]:9"


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ('[server]\nlisen = "x"\n', "server.lisen: unknown key"),
        ('[server]\ngrace_period_s = "soon"\n', "server.grace_period_s"),
        ('[server]\nlisten = "nohost"\n', "server.listen"),
        ('[server]\nlisten = "127.0.0.1:70000"\n', "out of range"),
        ('[chain]\nmode = "external"\n', "rpc_url and registry_address must be set"),
        ('[chain]\nregistry_address = "0x12"\n', "chain.registry_address"),
        ('[server]\ntls_cert = "/x.pem"\n', "tls_cert and tls_key must be set together"),
        ("bogus = 1\n", "bogus: unknown key"),
        ('[inference]\nlesson_position = "footer"\n', "inference.lesson_position"),
        ('[p2p]\nlisten = "127.0.0.1:4001"\n', "p2p.listen"),
        ('[p2p]\nbootstrap = ["/ip4/10.0.0.2/tcp/4001"]\n', "not a dialable peer address"),
        ("[p2p]\ndrop_score = 5\n", "p2p.drop_score"),
        ('[p2p]\nadvertise_grpc = "node.example"\n', "p2p.advertise_grpc"),
    ],
)
def test_bad_config_names_key_and_file(tmp_path: Path, toml: str, needle: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(toml)
    with pytest.raises(ConfigError) as e:
        load_config(f, environ={})
    assert needle in str(e.value)
    assert str(f) in str(e.value)


def test_p2p_bootstrap_from_the_environment() -> None:
    peer = "/ip4/10.0.0.2/tcp/4001/p2p/12D3KooWS1RpvHzD32dg6E9h53tg6Cg1b2XU2PAFL6PqNT2C5D5U"
    env = {"ZOO_NODE_P2P__BOOTSTRAP": f'["{peer}"]', "ZOO_NODE_P2P__ENABLED": "false"}
    cfg = load_config(None, environ=env)
    assert cfg.p2p.bootstrap == [peer] and cfg.p2p.enabled is False
    assert load_config(None, environ={}).p2p.listen == "/ip4/127.0.0.1/tcp/0"  # loopback by default


def test_secrets_under_the_prefix_are_not_overrides() -> None:
    """The documented ways to hand over a keystore password, a key or the critic's API key load the config
    like any other environment (they were read as unknown config keys, and every command refused)."""
    secrets = {
        "ZOO_NODE_KEYSTORE_PASSWORD": "correct horse",
        "ZOO_NODE_PRIVATE_KEY": "0x" + "11" * 32,
        "ZOO_NODE_CRITIC_API_KEY": "sk-x",
        "ZOO_NODE_BANNER": "0",
    }
    cfg = load_config(None, environ={**secrets, "ZOO_NODE_MODEL__THREADS": "1"})
    assert cfg.model.threads == 1
    with pytest.raises(ConfigError, match="ZOO_NODE_KEYSTORE_PASSWORDS"):  # a near miss is still refused
        load_config(None, environ={"ZOO_NODE_KEYSTORE_PASSWORDS": "x"})


def test_env_errors_name_the_variable() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, environ={"ZOO_NODE_SERVER__MAX_CONCURRENT_RPCS": "0"})
    assert "ZOO_NODE_SERVER__MAX_CONCURRENT_RPCS" in str(e.value)
    assert "server.max_concurrent_rpcs" in str(e.value)


def test_a_connection_limit_below_the_target_is_refused_and_zero_means_none() -> None:
    with pytest.raises(
        ConfigError, match=re.escape("max_peers (4) must be 0 (no limit) or at least target_peers (8)")
    ):
        load_config(None, environ={}, overrides={"p2p": {"max_peers": 4}})
    assert load_config(None, environ={}).p2p.max_peers == 0
    assert load_config(None, environ={}, overrides={"p2p": {"max_peers": 8}}).p2p.max_peers == 8


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    f = tmp_path / "broken.toml"
    f.write_text("[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(f, environ={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", environ={})


def test_secrets_are_masked() -> None:
    cfg = load_config(None, environ={"ZOO_NODE_SERVER__ADMIN_TOKEN": "s3cret-token"})
    assert cfg.server.admin_token is not None
    assert cfg.server.admin_token.get_secret_value() == "s3cret-token"
    shown = effective_config(cfg)
    assert shown["server"]["admin_token"] == "********"
    assert "s3cret-token" not in repr(cfg)


def test_a_light_node_is_backend_none_and_names_no_model_path(tmp_path: Path) -> None:
    cfg = load_config(environ={"ZOO_NODE_MODEL__BACKEND": "none"})
    assert cfg.light and cfg.model.backend == "none"
    assert not load_config(environ={}).light
    weights = tmp_path / "m.gguf"
    with pytest.raises(ConfigError) as e:
        load_config(environ={"ZOO_NODE_MODEL__BACKEND": "none", "ZOO_NODE_MODEL__PATH": str(weights)})
    assert "model.path" in str(e.value) or "path is set" in str(e.value)
