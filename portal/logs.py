"""Structured logs: one JSON object per line, redacted like the audit trail.

``JsonFormatter`` (python-json-logger) writes each record with its time, level,
logger and message, and what is known of where it was written: the tenant (the
tenant scope, when it names one tenant), the task and operation (``bind``), and the
current OpenTelemetry trace and span ids. Every value then passes through the
redactor named in the LOGGING settings (``audit.redaction.redact``: ``portal``
cannot import ``audit``, so the settings name it by dotted path), line by line so a
traceback keeps its shape. Selected by ``PORTAL_LOG_FORMAT=json``, the default under
production settings (docs/observability.md, "Logs").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final

from django.utils.module_loading import import_string
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

from . import scope
from .tracing import Trace

# Key under which records are redacted when no single tenant is in scope: the
# keyed hashes of e-mail addresses and card numbers are then the logs' own.
NO_TENANT: Final = "logs"

_bound: ContextVar[dict[str, str] | None] = ContextVar("log_fields", default=None)


@contextmanager
def bind(**fields: object) -> Iterator[None]:
    """Add ``fields`` (e.g. ``task_id``, ``operation_id``) to every line logged
    inside the block; None values are left out."""
    merged = {
        **(_bound.get() or {}),
        **{key: str(value) for key, value in fields.items() if value is not None},
    }
    token = _bound.set(merged)
    try:
        yield
    finally:
        _bound.reset(token)


def context_fields() -> dict[str, str]:
    """What is known here: tenant, bound fields, trace and span ids."""
    fields: dict[str, str] = {}
    tenants = scope.current()
    if tenants is not None and len(tenants) == 1:
        fields["tenant_id"] = next(iter(tenants))
    fields.update(_bound.get() or {})
    trace = Trace.current()
    if trace.trace_id:
        fields["trace_id"], fields["span_id"] = trace.trace_id, trace.span_id
    return fields


Redactor = Callable[..., Any]


class JsonFormatter(_JsonFormatter):
    """python-json-logger's formatter, with context fields and redaction.

    ``redactor``: the dotted path of a function like ``audit.redaction.redact``
    (``value, *, tenant_id``); required, so a log line is never written unredacted.
    """

    def __init__(self, *args: Any, redactor: str, **kwargs: Any) -> None:
        kwargs.setdefault(
            "rename_fields", {"levelname": "level", "name": "logger", "asctime": "time"}
        )
        kwargs.setdefault("timestamp", False)
        super().__init__(*args, **kwargs)
        self.redact: Redactor = import_string(redactor)

    def add_fields(
        self,
        log_data: dict[str, Any],
        record: logging.LogRecord,
        message_dict: dict[str, Any],
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        for key, value in context_fields().items():
            log_data.setdefault(key, value)

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        tenant = log_data.get("tenant_id") or NO_TENANT
        redacted: dict[str, Any] = {}
        for key, value in log_data.items():
            if isinstance(value, str) and "\n" in value:
                # Line by line: the redactor bounds each string, a traceback keeps
                # its lines.
                redacted[key] = "\n".join(
                    str(self.redact(line, tenant_id=tenant))
                    for line in value.split("\n")
                )
            else:
                redacted[key] = self.redact({key: value}, tenant_id=tenant)[key]
        return redacted
