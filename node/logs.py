"""Structured logging to stderr: `key=value` lines for people or JSON lines for log shippers.

Call sites pass fields as keyword arguments through `extra`-free helpers:
    log = get_logger(__name__); log.info("library activated", version=3, root="0x…")
Hand-written (~50 lines) rather than structlog because the stdlib logger is what grpc, web3 and
transformers already log through, and one formatter over it keeps their lines in the same shape.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class _KVFormatter(logging.Formatter):
    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields.update({k: v for k, v in record.__dict__.items() if k not in _RESERVED})
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self.as_json:
            return json.dumps(fields, default=str)
        return " ".join(f"{k}={_quote(v)}" for k, v in fields.items())


def _quote(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\n\t'):
        return json.dumps(text)
    return text


class FieldLogger(logging.LoggerAdapter):
    """A logger whose calls take structured fields as keyword arguments."""

    def _log_fields(self, level: int, msg: str, exc_info: Any, fields: dict[str, Any]) -> None:
        if self.logger.isEnabledFor(level):
            self.logger.log(level, msg, exc_info=exc_info, extra=fields, stacklevel=3)

    def debug(self, msg: str, *args: Any, exc_info: Any = None, **fields: Any) -> None:  # type: ignore[override]
        self._log_fields(logging.DEBUG, msg, exc_info, fields)

    def info(self, msg: str, *args: Any, exc_info: Any = None, **fields: Any) -> None:  # type: ignore[override]
        self._log_fields(logging.INFO, msg, exc_info, fields)

    def warning(self, msg: str, *args: Any, exc_info: Any = None, **fields: Any) -> None:  # type: ignore[override]
        self._log_fields(logging.WARNING, msg, exc_info, fields)

    def error(self, msg: str, *args: Any, exc_info: Any = None, **fields: Any) -> None:  # type: ignore[override]
        self._log_fields(logging.ERROR, msg, exc_info, fields)

    def exception(self, msg: str, *args: Any, exc_info: Any = True, **fields: Any) -> None:  # type: ignore[override]
        self._log_fields(logging.ERROR, msg, exc_info, fields)


def get_logger(name: str) -> FieldLogger:
    return FieldLogger(logging.getLogger(name), {})


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    """Send every logger's records to stderr in one structured format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_KVFormatter(as_json=fmt == "json"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Third-party chatter below warning is noise in an operator's log.
    for noisy in (
        "httpx",
        "httpcore",
        "urllib3",
        "web3",
        "filelock",
        "transformers",
        "sentence_transformers",
    ):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
