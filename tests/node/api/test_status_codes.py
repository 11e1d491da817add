"""One error tree (issue 45): every exception class of the zoo packages is a ZooError, or says in its
docstring why it must not be one (`Not a ZooError: <why>`); every ZooError subclass has a row of its own
(or of a base below ZooError) in node/api/status_codes.py's table, so one gRPC code and, through it, one HTTP
status; a row says INTERNAL only for the class it names; and nothing adds rows at import time.

Imports every module of the packages (no node, devnet or model is started)."""

from __future__ import annotations

import importlib
import pkgutil
import types
from collections.abc import Iterator

import grpc

from zoo.node.api import status_codes
from zoo.registry.errors import ZooError

PACKAGES = ("contracts", "registry", "inference", "devnet", "trainer", "node")
EXEMPT = "Not a ZooError:"


def path_of(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def import_packages() -> list[str]:
    """Import every module of the packages; the modules skipped for a missing optional dependency."""
    skipped = []
    for package in PACKAGES:
        root = importlib.import_module(f"zoo.{package}")
        for info in pkgutil.walk_packages(root.__path__, f"{root.__name__}."):
            if info.name.rpartition(".")[2] == "__main__":
                continue
            try:
                importlib.import_module(info.name)
            except ModuleNotFoundError as e:
                if (e.name or "zoo").partition(".")[0] == "zoo":
                    raise
                skipped.append(f"{info.name} (needs {e.name})")
    return skipped


def subclasses(cls: type[BaseException]) -> Iterator[type[BaseException]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from subclasses(sub)


def project_exceptions() -> tuple[list[type[BaseException]], list[str]]:
    """Every exception class defined in the zoo packages (nested and private ones included), and the
    modules that could not be imported for a missing optional dependency."""
    skipped = import_packages()
    ours = tuple(f"zoo.{p}." for p in PACKAGES)
    found = {path_of(c): c for c in subclasses(BaseException) if c.__module__.startswith(ours)}
    return [found[k] for k in sorted(found)], skipped


def skip_note(skipped: list[str]) -> str:
    return "\nmodules not imported (missing optional dependency): " + ", ".join(skipped) if skipped else ""


def test_every_exception_is_a_zoo_error_or_says_why_not() -> None:
    classes, skipped = project_exceptions()
    assert len(classes) > 40, f"found only {len(classes)} exception classes{skip_note(skipped)}"
    wrong = []
    for cls in classes:
        if issubclass(cls, ZooError):
            continue
        why = (cls.__doc__ or "").partition(EXEMPT)[2].strip()
        if not why:
            bases = ", ".join(b.__name__ for b in cls.__bases__)
            wrong.append(f"{path_of(cls)}({bases})")
    assert not wrong, (
        f"{len(wrong)} exception classes are not ZooErrors and do not say why ('{EXEMPT} <why>' in the "
        "docstring):\n" + "\n".join(wrong) + skip_note(skipped)
    )


def test_every_zoo_error_maps_to_one_grpc_code_and_one_http_status() -> None:
    classes, skipped = project_exceptions()
    wrong = []
    for cls in [c for c in classes if issubclass(c, ZooError) and c is not ZooError]:
        row = status_codes.row_of(cls)
        if row is None or row[0] == path_of(ZooError):
            wrong.append(f"{path_of(cls)}: no row of its own or of a base below ZooError")
            continue
        key, code = row
        if code == grpc.StatusCode.UNKNOWN:
            wrong.append(f"{path_of(cls)}: UNKNOWN")
        elif code == grpc.StatusCode.INTERNAL and key != path_of(cls):
            wrong.append(f"{path_of(cls)}: INTERNAL by its base's row {key}; an internal class has its own")
        if code not in status_codes.HTTP:
            wrong.append(f"{path_of(cls)}: {code.name} has no HTTP status")
    assert not wrong, "ZooErrors the table does not map:\n" + "\n".join(wrong) + skip_note(skipped)


def test_every_row_names_an_exception_class_that_exists() -> None:
    wrong = []
    for key in status_codes.CODES:
        module_name, _, name = key.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as e:
            wrong.append(f"{key}: {e}")
            continue
        if not (isinstance(cls, type) and issubclass(cls, BaseException)) or path_of(cls) != key:
            wrong.append(f"{key}: not the path of an exception class (its class is at {path_of(cls)})")
    assert not wrong, "rows that name no exception class:\n" + "\n".join(wrong)


def test_every_grpc_code_of_the_table_has_one_http_status() -> None:
    assert set(status_codes.CODES.values()) <= set(status_codes.HTTP), "codes without an HTTP status"


def test_nothing_adds_rows_at_import_time() -> None:
    assert not hasattr(status_codes, "register")
    assert isinstance(status_codes.CODES, types.MappingProxyType)
    assert isinstance(status_codes.HTTP, types.MappingProxyType)


def test_status_for_reads_the_table() -> None:
    from zoo.node.api.http.error_bodies import api_error_for
    from zoo.node.jobs.store import JobStateError
    from zoo.registry.chain import ChainError, ContractRevert
    from zoo.registry.errors import IpfsTimeout, NotFound, ValidationError

    cases = [
        (ValidationError("x", "is wrong"), grpc.StatusCode.INVALID_ARGUMENT, 400),
        (NotFound("no such job"), grpc.StatusCode.NOT_FOUND, 404),
        (IpfsTimeout("cat timed out"), grpc.StatusCode.DEADLINE_EXCEEDED, 504),
        (JobStateError("job j already succeeded"), grpc.StatusCode.FAILED_PRECONDITION, 400),
        (ChainError("the chain's RPC is unreachable"), grpc.StatusCode.UNAVAILABLE, 503),
        (ContractRevert("VersionExists(3)"), grpc.StatusCode.FAILED_PRECONDITION, 400),
        (ConnectionResetError("reset"), grpc.StatusCode.UNAVAILABLE, 503),
    ]
    for exc, code, http in cases:
        assert status_codes.status_for(exc) == (code, str(exc)), exc
        assert api_error_for(exc).status == http, exc
    # An INTERNAL row, like an exception in no row: the caller logs it and withholds its text.
    assert status_codes.status_for(ZooError("the job store is closed")) is None
    assert status_codes.status_for(KeyError("x")) is None
    assert api_error_for(KeyError("x")).status == 500
