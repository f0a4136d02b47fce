"""Typed client for the agent governance portal's REST API (/api/v1/)."""

from __future__ import annotations

from .client import IDEMPOTENCY_HEADER, LEASE_TOKEN_HEADER, REPLAY_HEADER, PortalClient
from .errors import (
    ActionNotGranted,
    Conflict,
    ContractRetired,
    Forbidden,
    IdempotencyKeyMismatch,
    IdempotencyKeyReused,
    IllegalTransition,
    LeaseExpired,
    LeaseHeld,
    LeaseLost,
    NotFound,
    PortalError,
    PortalUnavailable,
    RateLimited,
    RequestInFlight,
    ServerError,
    StaleState,
    TaskNotLeasable,
    Unauthenticated,
    ValidationFailed,
)
from .lease import LeaseKeeper
from .models import Event, Lease, ObjectVersion, Operation, Page, Task

__version__ = "0.1.0"

__all__ = [
    "IDEMPOTENCY_HEADER",
    "LEASE_TOKEN_HEADER",
    "REPLAY_HEADER",
    "ActionNotGranted",
    "Conflict",
    "ContractRetired",
    "Event",
    "Forbidden",
    "IdempotencyKeyMismatch",
    "IdempotencyKeyReused",
    "IllegalTransition",
    "Lease",
    "LeaseExpired",
    "LeaseHeld",
    "LeaseKeeper",
    "LeaseLost",
    "NotFound",
    "ObjectVersion",
    "Operation",
    "Page",
    "PortalClient",
    "PortalError",
    "PortalUnavailable",
    "RateLimited",
    "RequestInFlight",
    "ServerError",
    "StaleState",
    "Task",
    "TaskNotLeasable",
    "Unauthenticated",
    "ValidationFailed",
]
