"""Primary keys: time-ordered UUIDv7, so new rows land at the right edge of indexes."""

from __future__ import annotations

import uuid

from uuid_utils import compat


def new_id() -> uuid.UUID:
    """A new UUIDv7 (RFC 9562), monotonic within this process."""
    return compat.uuid7()
