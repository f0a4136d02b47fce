"""Primary keys: time-ordered UUIDv7, so new rows land at the right edge of indexes."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from typing import Final

from uuid_utils import compat

_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def new_id() -> uuid.UUID:
    """A new UUIDv7 (RFC 9562), monotonic within this process."""
    return compat.uuid7()


def id_floor(at: dt.datetime) -> uuid.UUID:
    """The smallest UUIDv7 of the millisecond of ``at``: an id bound for a time.

    ``audit_uuid7_floor`` in SQL (audit migration 0011) computes the same.
    """
    millis = min(max(_millis(at), 0), (1 << 48) - 1)  # times beyond the format
    return uuid.UUID(int=millis << 80)


def id_at(at: dt.datetime) -> uuid.UUID:
    """A new UUIDv7 of the time ``at`` (hand-made rows: tests, loaders)."""
    rand = int.from_bytes(os.urandom(10)) & ((1 << 74) - 1)
    rand_a, rand_b = rand >> 62, rand & ((1 << 62) - 1)
    return uuid.UUID(int=_millis(at) << 80 | 7 << 76 | rand_a << 64 | 2 << 62 | rand_b)


def id_time(value: uuid.UUID) -> dt.datetime:
    """The time a UUIDv7 carries (its first 48 bits, in milliseconds), UTC."""
    return dt.datetime.fromtimestamp((value.int >> 80) / 1000, tz=dt.UTC)


def _millis(at: dt.datetime) -> int:
    return (at - _EPOCH) // dt.timedelta(milliseconds=1)
