"""Events, outbox and relay, redaction, retention and tenant purge."""

from __future__ import annotations
