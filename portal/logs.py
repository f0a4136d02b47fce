"""Structured logs: one JSON object per line, redacted like the audit trail.

``JsonFormatter`` (python-json-logger) writes each record with its time, level,
logger and message, and what is known of where it was written: the tenant (the
tenant scope, when it names one tenant), the task and operation (``bind``), and the
current OpenTelemetry trace and span ids. Every value then passes through the
redactor named in the LOGGING settings (``audit.redaction.redact``: ``portal``
cannot import ``audit``, so the settings name it by dotted path), line by line so a
traceback keeps its shape; URL-encoded text is decoded first so the detectors see
it. The portal's own ids (``IDENTIFIER_FIELDS``) are kept when they look like one.
Selected by ``PORTAL_LOG_FORMAT=json``, the default under
production settings (docs/observability.md, "Logs").
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final
from urllib.parse import unquote

from django.utils.log import AdminEmailHandler
from django.utils.module_loading import import_string
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

from . import scope
from .tracing import Trace

# The key records are redacted under when no single tenant is in scope (the nil
# UUID): the keyed hashes of e-mail addresses and card numbers are then the logs' own.
NO_TENANT: Final = "00000000-0000-0000-0000-000000000000"

# Fields that hold the portal's own identifiers (hex ids, UUIDs): kept as they are
# when they look like one, so lines can be correlated; anything else is redacted.
IDENTIFIER_FIELDS: Final = frozenset(
    {"tenant_id", "task_id", "operation_id", "trace_id", "span_id", "correlation_id"}
)
_IDENTIFIER: Final = re.compile(r"[0-9a-f][0-9a-f-]{0,35}")

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
        try:
            return self._redacted(log_data)
        except Exception:  # noqa: BLE001
            # Never write what could not be redacted; say that a line was withheld.
            return {
                key: log_data.get(key)
                for key in ("time", "level", "logger", "tenant_id", "trace_id")
                if key in log_data
            } | {"message": "[log record withheld: redaction failed]"}

    def _redacted(self, log_data: dict[str, Any]) -> dict[str, Any]:
        try:
            tenant = str(uuid.UUID(str(log_data.get("tenant_id"))))
        except ValueError:
            tenant = NO_TENANT
        redacted: dict[str, Any] = {}
        for key, value in log_data.items():
            if key in IDENTIFIER_FIELDS and _IDENTIFIER.fullmatch(str(value)):
                redacted[key] = value  # the portal's own ids, kept to correlate
                continue
            if not isinstance(value, str | int | float | bool | type(None)):
                value = str(value)  # e.g. django.request's ``request`` object
            if isinstance(value, str) and "%" in value:
                # A URL-encoded path or query: the detectors read it decoded.
                value = unquote(value)
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


class RedactingAdminEmailHandler(AdminEmailHandler):
    """Django's ``mail_admins`` handler, its report redacted like a JSON line.

    Django's error report (an unhandled error, or any ERROR of ``django.request``
    while ``ADMINS`` is set and ``DEBUG`` off) holds the request's query string,
    headers and the settings; its filter hides only values under names such as
    ``AUTH``, ``TOKEN`` or ``KEY``, so a secret in the query string, the user agent
    or a custom header would be mailed (found by the redaction canary,
    tests/gateway/test_log_canary.py). Subject and body pass the redactor line by
    line, URL-decoded first; the HTML version, which would repeat them, is not sent.
    """

    def __init__(self, *args: Any, redactor: str, **kwargs: Any) -> None:
        kwargs["include_html"] = False
        super().__init__(*args, **kwargs)
        self.redact: Redactor = import_string(redactor)

    def send_mail(self, subject: Any, message: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("html_message", None)
        super().send_mail(
            self._redacted(str(subject)), self._redacted(str(message)), *args, **kwargs
        )

    def _redacted(self, text: str) -> str:
        return "\n".join(
            str(
                self.redact(unquote(line) if "%" in line else line, tenant_id=NO_TENANT)
            )
            for line in text.split("\n")
        )


class WithoutTraceback(logging.Filter):
    """Drops the traceback of an expected refusal (a ``Host`` not in
    ``ALLOWED_HOSTS``, which Django logs with its stack): the line stays, and a
    traceback in the log keeps meaning a request nobody handled."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info = None
        record.exc_text = None
        return True
