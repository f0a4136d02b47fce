"""Events, outbox and relay, redaction and the inbox: the record; it knows no task."""

from __future__ import annotations
