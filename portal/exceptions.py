"""The one error hierarchy (docs/style.md R12).

The first docstring line is the default ``detail``; keyword arguments become extension
members of the problem+json answer; ``code`` is a reason code or an API-only code.
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

from .codes import ReasonCode


class PortalError(Exception):
    """Unexpected portal error."""

    code: ClassVar[str] = "INTERNAL"
    status: ClassVar[int] = 500
    # Temporal's rule: the error says whether repeating the same call can succeed.
    retryable: ClassVar[bool] = False

    def __init__(self, detail: str | None = None, **context: Any) -> None:
        self.context = context
        self.detail = detail or (self.__doc__ or self.code).strip().splitlines()[0]
        super().__init__(self.detail)

    def __str__(self) -> str:
        if not self.context:
            return self.detail
        extras = ", ".join(f"{key}={value!r}" for key, value in self.context.items())
        return f"{self.detail} ({extras})"


class NotFound(PortalError):
    """No such object."""

    code = "NOT_FOUND"
    status = 404


class ValidationFailed(PortalError):
    """The request is not valid."""

    code = "VALIDATION_FAILED"
    status = 400


class MalformedRequest(PortalError):
    """The request is malformed."""

    code = "MALFORMED_REQUEST"
    status = 400


class IllegalTransition(PortalError):
    """That state change is not allowed from the current state."""

    code = "ILLEGAL_TRANSITION"
    status = 409


class StaleState(PortalError):
    """Another worker changed this object first; reload and retry."""

    code = ReasonCode.STALE_STATE
    status = 409
    retryable = True


class LeaseExpired(PortalError):
    """The lease is gone: expired, released or taken over; the fencing token is old."""

    code = ReasonCode.LEASE_EXPIRED
    status = 409


class IdempotencyKeyReused(PortalError):
    """This key was already used with a different input; nothing was executed."""

    code = ReasonCode.IDEMPOTENCY_KEY_REUSED
    status = 422


class TransactionRequired(PortalError):
    """A helper that writes ran outside a transaction.

    If you're hitting this, call the helper from a use-case service decorated with
    ``@transaction.atomic(durable=True)``; helpers never open transactions themselves.
    """

    code = "TRANSACTION_REQUIRED"


class TransactionForbidden(PortalError):
    """Network I/O was attempted inside a database transaction.

    If you're hitting this, a caller wrapped a network call in ``atomic()``. Reserve and
    commit first, make the call with no transaction open, then record the result in a
    new transaction (docs/style.md R5).
    """

    code = "TRANSACTION_FORBIDDEN"


class IntegrityViolation(PortalError):
    """The database refused a write that broke one of its invariants."""

    code = "INTEGRITY_VIOLATION"
    status = 409


class CallerFrozen(PortalError):
    """The caller is frozen (docs/limits.md).

    ``tenant_id`` names the tenant the refusal is recorded in (not a member of the
    answer); ``recorded`` is set once its denial event is written.
    """

    status = 403

    def __init__(
        self, detail: str | None = None, *, tenant_id: uuid.UUID, **context: Any
    ) -> None:
        self.tenant_id = tenant_id
        self.recorded = False
        super().__init__(detail, **context)


class AgentFrozen(CallerFrozen):
    """This agent is frozen: every call is refused until a person unfreezes it."""

    code = ReasonCode.AGENT_FROZEN


class TenantFrozen(CallerFrozen):
    """This tenant is frozen: every agent call is refused until it is unfrozen."""

    code = ReasonCode.TENANT_FROZEN


class RateLimited(PortalError):
    """Too many requests; retry after the time in the Retry-After header.

    ``retry_after_s`` (a context member) is when the window ends; the API sends it
    as ``Retry-After`` too.
    """

    code = ReasonCode.RATE_LIMITED
    status = 429
    retryable = True


class BudgetExceeded(PortalError):
    """This amount would overspend the agent's budget for the window; nothing ran."""

    code = ReasonCode.BUDGET_EXCEEDED
    status = 422


class DatabaseUnavailable(PortalError):
    """The database connection was lost; nothing of this request was kept. Retry."""

    # A restart, a failover or a killed session: the request's transaction rolled
    # back with the connection, and the next request opens a new one
    # (docs/api.md, "Errors").
    code = "DATABASE_UNAVAILABLE"
    status = 503
    retryable = True


class DatabaseBusy(PortalError):
    """The database gave up on this request's statement (a lock wait or the statement
    over its timeout, a deadlock); nothing of this request was kept. Retry."""

    # lock_timeout (10 s) and statement_timeout (60 s) are the portal's own
    # (config/settings.py): reaching one rolled the transaction back, as a deadlock
    # or a serialization failure does. A retry usually finds the lock free.
    code = "DATABASE_BUSY"
    status = 503
    retryable = True


class IdempotencyKeyMismatch(PortalError):
    """This Idempotency-Key was used for a different request; nothing was done."""

    code = "IDEMPOTENCY_KEY_MISMATCH"
    status = 422


# Seconds a client waits before asking again about a request still in flight.
IN_FLIGHT_RETRY_AFTER_S = 1


class IdempotentRequestInFlight(PortalError):
    """A request with this Idempotency-Key is still being processed; retry later."""

    code = "REQUEST_IN_FLIGHT"
    status = 409
    retryable = True

    def __init__(self, detail: str | None = None, **context: Any) -> None:
        # A first delivery takes well under a second; one whose holder died is
        # taken over once its lock (PORTAL_IDEMPOTENCY_LOCK_S) ends. The client
        # asks again after ``Retry-After`` (tests/http/test_idempotency_race.py).
        context.setdefault("retry_after_s", IN_FLIGHT_RETRY_AFTER_S)
        super().__init__(detail, **context)


class PermissionDenied(PortalError):
    """Your role in this tenant does not allow this."""

    code = "PERMISSION_DENIED"
    status = 403


class TenantNotVisible(PortalError):
    """No such tenant."""

    code = "NOT_FOUND"
    status = 404


class TenantNotFound(NotFound):
    """No such tenant."""


class KeyRevoked(PortalError):
    """This key is revoked; issue a new one instead of rotating it."""

    code = "API_KEY_REVOKED"
    status = 409


class AuthFailuresThrottled(RateLimited):
    """Too many failed authentications from this address or for this key; wait."""
