"""Load the account that signs the node's chain transactions, keeping the private key out of every printout.

Three sources: an Ethereum keystore (JSON V3) file with its password, an environment variable holding a hex
private key, and the ten well-known devnet accounts "dev0".."dev9" (anvil's default mnemonic). A Signer's
repr/str show the address and where the key came from, never the key; it also refuses to be pickled, so a
key cannot leak through a cache or a multiprocessing queue by accident.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, NoReturn

from eth_account import Account
from eth_account.datastructures import SignedTransaction
from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress

from zoo.registry.errors import ZooError
from zoo.registry.fsutil import write_atomic

__all__ = [
    "DEFAULT_KEY_ENV",
    "DEV_ACCOUNT_COUNT",
    "DEV_MNEMONIC",
    "KeyLoadError",
    "Signer",
    "dev_account",
    "dev_address",
    "from_env",
    "from_keystore",
    "load_signer",
    "save_keystore",
]

DEV_MNEMONIC = "test test test test test test test test test test test junk"
DEV_ACCOUNT_COUNT = 10
DEFAULT_KEY_ENV = "ZOO_NODE_PRIVATE_KEY"

_DEV_NAME_RE = re.compile(r"dev(\d+)")
_HEX_KEY_RE = re.compile(r"(0x)?[0-9a-fA-F]{64}")


class KeyLoadError(ZooError, ValueError):
    """A signing key could not be loaded. The message never contains key material."""


class Signer:
    """A local signing account whose private key is never shown.

    `account` is the eth-account LocalAccount for APIs that need one; `sign_transaction` and `address` make
    the Signer itself usable wherever those two are all that is needed.
    """

    __slots__ = ("_account", "is_dev", "source")

    def __init__(self, account: LocalAccount, source: str, *, is_dev: bool = False) -> None:
        self._account = account
        self.source = source
        self.is_dev = is_dev

    @property
    def address(self) -> ChecksumAddress:
        """The account's checksummed address."""
        return self._account.address

    @property
    def account(self) -> LocalAccount:
        """The underlying eth-account LocalAccount (holds the key: do not print or log it)."""
        return self._account

    def sign_transaction(self, transaction: dict[str, Any]) -> SignedTransaction:
        """Sign a transaction dict (nonce, gas, fees and chainId filled in)."""
        return self._account.sign_transaction(transaction)

    def __repr__(self) -> str:
        return f"Signer(address={self.address}, source={self.source!r}, key=<hidden>)"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Signer holds a private key and cannot be pickled")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Signer) and other.address == self.address

    def __hash__(self) -> int:
        return hash(self.address)


def _parse_dev_index(name: str | int) -> int:
    if isinstance(name, int):
        index = name
    else:
        match = _DEV_NAME_RE.fullmatch(name.strip())
        if not match:
            raise KeyLoadError(f"{name!r} is not a devnet account name (dev0..dev{DEV_ACCOUNT_COUNT - 1})")
        index = int(match.group(1))
    if not 0 <= index < DEV_ACCOUNT_COUNT:
        raise KeyLoadError(f"devnet accounts are dev0..dev{DEV_ACCOUNT_COUNT - 1}, not dev{index}")
    return index


@lru_cache(maxsize=DEV_ACCOUNT_COUNT)
def _dev_local_account(index: int) -> LocalAccount:
    # The mnemonic is public, so caching its derived keys exposes nothing; derivation costs ~10 ms each.
    Account.enable_unaudited_hdwallet_features()
    account: LocalAccount = Account.from_mnemonic(DEV_MNEMONIC, account_path=f"m/44'/60'/0'/0/{index}")
    return account


def dev_account(name: str | int) -> Signer:
    """Devnet account "devN" (or index N): the N-th account of anvil's default mnemonic.

    These keys are public knowledge; anything they hold on a real network is taken at once.
    """
    index = _parse_dev_index(name)
    return Signer(_dev_local_account(index), f"dev{index}", is_dev=True)


def dev_address(name: str | int) -> ChecksumAddress:
    """Address of devnet account "devN"."""
    return dev_account(name).address


def _from_hex(key: str, source: str) -> Signer:
    key = key.strip()
    if not _HEX_KEY_RE.fullmatch(key):
        raise KeyLoadError(f"{source} does not hold a 32-byte hex private key")
    try:
        account: LocalAccount = Account.from_key(key)
    except (ValueError, TypeError):
        # eth-keys rejects zero or out-of-range scalars; `from None` keeps its message (about the value) out.
        raise KeyLoadError(f"{source} holds an invalid secp256k1 private key") from None
    return Signer(account, source)


def from_env(var: str = DEFAULT_KEY_ENV) -> Signer:
    """Account whose hex private key (with or without 0x) is in environment variable `var`."""
    value = os.environ.get(var)
    if not value:
        raise KeyLoadError(f"environment variable {var} is not set")
    return _from_hex(value, f"env:{var}")


def from_keystore(path: str | Path, password: str) -> Signer:
    """Account decrypted from an Ethereum keystore (JSON V3) file."""
    path = Path(path).expanduser()
    try:
        keyfile = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise KeyLoadError(f"cannot read keystore {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise KeyLoadError(f"keystore {path} is not JSON") from None
    try:
        key = Account.decrypt(keyfile, password)
    except ValueError:
        # eth-account says "MAC mismatch" both for a wrong password and for a damaged file.
        raise KeyLoadError(f"wrong password for keystore {path} (or the file is damaged)") from None
    except (KeyError, TypeError):
        raise KeyLoadError(f"{path} is not an Ethereum keystore (JSON V3) file") from None
    return Signer(Account.from_key(key), f"keystore:{path}")


def save_keystore(signer: Signer, path: str | Path, password: str, *, scrypt_n: int | None = None) -> Path:
    """Encrypt `signer`'s key into a keystore file readable only by its owner (0600); returns the path.

    `scrypt_n` overrides the scrypt work factor (default eth-account's 2**18; lower only for tests).
    """
    path = Path(path).expanduser()
    keyfile = Account.encrypt(signer.account.key, password, kdf="scrypt", iterations=scrypt_n)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(keyfile).encode("utf-8"), mode=0o600)
    return path


def load_signer(spec: str, *, password: str | None = None) -> Signer:
    """Account described by `spec`: "devN", "env:VAR", "keystore:PATH", or a path to a keystore file.

    A keystore needs `password`; when it is None the password is read from ZOO_NODE_KEYSTORE_PASSWORD.
    """
    spec = spec.strip()
    if _DEV_NAME_RE.fullmatch(spec):
        return dev_account(spec)
    if spec.startswith("env:"):
        return from_env(spec.removeprefix("env:"))
    path = spec.removeprefix("keystore:")
    if password is None:
        password = os.environ.get("ZOO_NODE_KEYSTORE_PASSWORD")
        if password is None:
            raise KeyLoadError(f"keystore {path} needs a password (or ZOO_NODE_KEYSTORE_PASSWORD)")
    return from_keystore(path, password)
