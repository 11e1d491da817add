"""Signing keys: devnet names, environment variables, keystores; the key never shows in a printout."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from eth_account import Account

from zoo.registry.keys import (
    KeyLoadError,
    Signer,
    dev_account,
    dev_address,
    from_env,
    from_keystore,
    load_signer,
    save_keystore,
)

# The standard anvil / hardhat accounts of "test test ... junk".
ANVIL_ADDRESSES = {
    0: "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266",
    1: "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
    2: "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
    9: "0xa0Ee7A142d267C1f36714E4a8F75612F20a79720",
}
# A throwaway key for the env/keystore tests (not a devnet key, so a mix-up would show).
TEST_KEY = "0x" + "4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318"


@pytest.mark.parametrize(("index", "address"), sorted(ANVIL_ADDRESSES.items()))
def test_dev_names_resolve_to_anvil_accounts(index: int, address: str) -> None:
    assert dev_account(f"dev{index}").address == address
    assert dev_address(index) == address
    assert load_signer(f"dev{index}").address == address
    assert dev_account(index).is_dev


@pytest.mark.parametrize("name", ["dev10", "dev-1", "devx", "alice", ""])
def test_bad_dev_names(name: str) -> None:
    with pytest.raises(KeyLoadError):
        dev_account(name)


def _assert_masked(signer: Signer, key_hex: str) -> None:
    bare = key_hex.removeprefix("0x").lower()
    for text in (repr(signer), str(signer), f"{signer}", f"{signer!r}"):
        assert bare not in text.lower()
        assert signer.address in text and "hidden" in text
    with pytest.raises(TypeError):
        pickle.dumps(signer)


def test_repr_masks_the_key() -> None:
    signer = dev_account("dev0")
    _assert_masked(signer, signer.account.key.hex())


def test_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = Account.from_key(TEST_KEY).address
    monkeypatch.setenv("ZOO_TEST_KEY", TEST_KEY)
    signer = from_env("ZOO_TEST_KEY")
    assert signer.address == expected and not signer.is_dev
    _assert_masked(signer, TEST_KEY)
    monkeypatch.setenv("ZOO_TEST_KEY", TEST_KEY.removeprefix("0x") + "\n")
    assert load_signer("env:ZOO_TEST_KEY").address == expected


def test_bad_environment_key_is_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZOO_TEST_KEY", raising=False)
    with pytest.raises(KeyLoadError, match="not set"):
        from_env("ZOO_TEST_KEY")
    almost = TEST_KEY[:-1] + "z"
    monkeypatch.setenv("ZOO_TEST_KEY", almost)
    with pytest.raises(KeyLoadError) as info:
        from_env("ZOO_TEST_KEY")
    assert almost[2:20] not in str(info.value)
    monkeypatch.setenv("ZOO_TEST_KEY", "0x" + "00" * 32)  # hex, but not a valid secp256k1 scalar
    with pytest.raises(KeyLoadError, match="invalid") as info:
        from_env("ZOO_TEST_KEY")
    assert info.value.__cause__ is None


def test_keystore_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = Signer(Account.from_key(TEST_KEY), "test")
    path = save_keystore(original, tmp_path / "keys" / "node.json", "correct horse", scrypt_n=2**10)
    assert path.stat().st_mode & 0o777 == 0o600
    assert TEST_KEY[2:] not in path.read_text()
    loaded = from_keystore(path, "correct horse")
    assert loaded.address == original.address
    _assert_masked(loaded, TEST_KEY)
    with pytest.raises(KeyLoadError, match="wrong password"):
        from_keystore(path, "wrong")
    with pytest.raises(KeyLoadError, match="needs a password"):
        monkeypatch.delenv("ZOO_NODE_KEYSTORE_PASSWORD", raising=False)
        load_signer(str(path))
    monkeypatch.setenv("ZOO_NODE_KEYSTORE_PASSWORD", "correct horse")
    assert load_signer(f"keystore:{path}").address == original.address
    (tmp_path / "garbage.json").write_text("{}")
    with pytest.raises(KeyLoadError, match="not an Ethereum keystore"):
        from_keystore(tmp_path / "garbage.json", "x")
    with pytest.raises(KeyLoadError, match="cannot read"):
        from_keystore(tmp_path / "missing.json", "x")
