"""W3C Trace Context: the ids a request carries into tasks, operations and events."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

# version "00" - 32 hex trace id - 16 hex parent id - 2 hex flags
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


@dataclass(frozen=True, kw_only=True)
class Trace:
    trace_id: str = ""
    span_id: str = ""

    @classmethod
    def from_traceparent(cls, header: str | None) -> Trace:
        """Parse a ``traceparent`` header; a missing or invalid one starts a new trace.

        All-zero ids are invalid by the spec and are replaced too.
        """
        match = _TRACEPARENT.match((header or "").strip().lower())
        if match and set(match[1]) != {"0"} and set(match[2]) != {"0"}:
            return cls(trace_id=match[1], span_id=match[2])
        return cls.new()

    @classmethod
    def new(cls) -> Trace:
        return cls(trace_id=secrets.token_hex(16), span_id=secrets.token_hex(8))


NO_TRACE = Trace()
