"""Typed errors: one class per family of the portal's stable problem ``code``.

The portal answers every error as RFC 9457 ``application/problem+json`` carrying a
stable ``code``. The client maps that code (never the HTTP status alone, which
several codes share) to a subclass of ``PortalError``; an unknown code raises the
base class, so a newer server never breaks an older client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final


class PortalError(Exception):
    """An error answer from the portal (or no answer at all, see PortalUnavailable).

    Attributes:
        status: the HTTP status (0 when no answer arrived).
        code: the stable machine-readable code, e.g. ``"STALE_STATE"``.
        detail: the human-readable explanation.
        body: the whole problem document (extension members included).
    """

    def __init__(
        self, status: int, code: str, detail: str, body: Mapping[str, Any] | None = None
    ) -> None:
        self.status = status
        self.code = code
        self.detail = detail
        self.body: dict[str, Any] = dict(body or {})
        super().__init__(f"{status} {code}: {detail}")

    @property
    def trace_id(self) -> str:
        """The trace the portal recorded the failed request under ("" if none)."""
        return str(self.body.get("trace_id") or "")


class PortalUnavailable(PortalError):
    """No answer: connection refused, reset or timed out on every attempt.

    A POST that ends here may or may not have taken effect; repeat it with the same
    ``request_key`` to find out without doing it twice.
    """


class ServerError(PortalError):
    """The portal failed (5xx); quote ``body["correlation_id"]`` when reporting it."""


class Conflict(PortalError):
    """The request conflicts with the current state (409 family)."""


class StaleState(Conflict):
    """Another writer changed the object first: reload and decide again."""


class LeaseExpired(Conflict):
    """Your lease is gone (expired, released or taken over); stop working the task."""


class LeaseHeld(Conflict):
    """Another owner holds a live lease on the task; try again after it expires."""


class TaskNotLeasable(Conflict):
    """Only pending, running or waiting tasks can be leased."""


class IllegalTransition(Conflict):
    """The state machine does not allow that move from the current state."""


class RequestInFlight(Conflict):
    """A request with this Idempotency-Key is still running; the client retries it."""


class IdempotencyKeyReused(PortalError):
    """A business key (task id, operation key) was used before with other details."""


class IdempotencyKeyMismatch(PortalError):
    """This ``Idempotency-Key`` header was used before for a different request."""


class NotFound(PortalError):
    """No such object in your tenant (another tenant's ids answer this too)."""


class ValidationFailed(PortalError):
    """The request is not valid; ``body["errors"]`` maps fields to messages."""


class Unauthenticated(PortalError):
    """The API key is missing, malformed or revoked."""


class Forbidden(PortalError):
    """Authenticated, but not allowed."""


class ActionNotGranted(Forbidden):
    """The agent holds no grant for that action on that target."""


class RateLimited(PortalError):
    """Too many requests; ``retry_after_s`` says how long to wait."""

    @property
    def retry_after_s(self) -> float | None:
        value = self.body.get("retry_after_s")
        return float(value) if isinstance(value, int | float) else None


class ContractRetired(PortalError):
    """The pinned contract version is retired; no new work may start under it."""


class LeaseLost(Exception):
    """Raised by ``LeaseKeeper.check()``: the lease is gone, so stop the work now.

    Not a ``PortalError``: no request failed; the keeper decided from a refused
    renewal or from its own clock that writes under ``token`` will be refused.
    """

    def __init__(self, task_id: str, token: int, reason: str) -> None:
        self.task_id = task_id
        self.token = token
        self.reason = reason
        super().__init__(f"lease on task {task_id} (token {token}) lost: {reason}")


# Codes of the portal (portal/codes.py and the API-only codes beside its errors).
ERRORS_BY_CODE: Final[Mapping[str, type[PortalError]]] = {
    "STALE_STATE": StaleState,
    "LEASE_EXPIRED": LeaseExpired,
    "LEASE_HELD": LeaseHeld,
    "TASK_NOT_LEASABLE": TaskNotLeasable,
    "ILLEGAL_TRANSITION": IllegalTransition,
    "INTEGRITY_VIOLATION": Conflict,
    "CONTRACT_IMMUTABLE": Conflict,
    "REQUEST_IN_FLIGHT": RequestInFlight,
    "IDEMPOTENCY_KEY_REUSED": IdempotencyKeyReused,
    "IDEMPOTENCY_KEY_MISMATCH": IdempotencyKeyMismatch,
    "NOT_FOUND": NotFound,
    "VALIDATION_FAILED": ValidationFailed,
    "CONTRACT_INVALID": ValidationFailed,
    "MALFORMED_REQUEST": ValidationFailed,
    "REQUEST_TOO_LARGE": ValidationFailed,
    "UNSUPPORTED_MEDIA_TYPE": ValidationFailed,
    "UNAUTHENTICATED": Unauthenticated,
    "FORBIDDEN": Forbidden,
    "ACTION_NOT_GRANTED": ActionNotGranted,
    "RATE_LIMITED": RateLimited,
    "CONTRACT_RETIRED": ContractRetired,
    "INTERNAL": ServerError,
}


def error_from_problem(status: int, body: Mapping[str, Any]) -> PortalError:
    """The typed error for a problem document; unknown codes give ``PortalError``."""
    code = str(body.get("code") or f"HTTP_{status}")
    detail = str(body.get("detail") or body.get("title") or "")
    cls = ERRORS_BY_CODE.get(code)
    if cls is None:
        # Infrastructure in front of the portal (a proxy's 502) sends no code.
        cls = ServerError if status >= 500 else PortalError
    return cls(status, code, detail, body)
