"""Typed errors: one class per family of the portal's stable problem ``code``.

The portal answers every error as RFC 9457 ``application/problem+json`` carrying a
stable ``code``. The client maps that code (never the HTTP status alone, which
several codes share) to a subclass of ``PortalError``; an unknown code raises the
base class, so a newer server never breaks an older client. The action gateway's
refusals (422, the reason code as ``code``) raise a ``GatewayRefused`` subclass.
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


class GatewayGoverned(Conflict):
    """Only the gateway records outcomes on this target: execute the operation
    through ``execute_operation`` instead of reporting start and outcome."""


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


class GatewayRefused(PortalError):
    """The action gateway refused to execute; the task now waits for a person.

    A refusal is not a failed request to retry: the portal has moved the task to
    ``human_required`` (revoking your lease) and opened an escalation with the
    evidence. Stop working the task and move on; a person takes it from here.

    Attributes:
        reason: the reason code (the problem's ``code``), e.g. ``"FIELD_STALE"``.
        escalation_id: the escalation in the takeover queue (None if not given).
        operation_id: the refused operation (None if not given).
        task_state: the task's state now, ``"human_required"``.
    """

    @property
    def reason(self) -> str:
        return self.code

    @property
    def escalation_id(self) -> str | None:
        return _optional_id(self.body.get("escalation_id"))

    @property
    def operation_id(self) -> str | None:
        return _optional_id(self.body.get("operation_id"))

    @property
    def task_state(self) -> str | None:
        value = self.body.get("task_state")
        return None if value is None else str(value)


class FieldRefused(GatewayRefused):
    """A required field was missing, from the wrong source or too old."""


class FieldMissing(FieldRefused):
    """A field the contract requires was not sent (``FIELD_MISSING``)."""


class FieldSourceMismatch(FieldRefused):
    """A field came from another source than the contract names
    (``FIELD_SOURCE_MISMATCH``)."""


class FieldStale(FieldRefused):
    """A field was observed longer ago than its ``max_age_s`` (``FIELD_STALE``)."""


class GatewayContractRetired(GatewayRefused, ContractRetired):
    """The task's pinned contract version was retired before execution."""


class VersionConflict(GatewayRefused):
    """The business object changed since the task read it (``VERSION_CONFLICT``)."""


class TargetForbidden(GatewayRefused):
    """The contract does not allow writing to that target (``TARGET_FORBIDDEN``)."""


class PermissionRevoked(GatewayRefused):
    """The agent's grant for the action was withdrawn (``PERMISSION_REVOKED``)."""


class CredentialExpired(GatewayRefused):
    """The scoped credential expired before the call (``CREDENTIAL_EXPIRED``)."""


class ApprovalRequired(GatewayRefused):
    """The target cannot settle doubt, so a person must approve the input once
    (``APPROVAL_REQUIRED``)."""


class PolicyDenied(GatewayRefused):
    """The tenant's policies do not permit the action (``POLICY_DENIED``)."""


class PolicyError(GatewayRefused):
    """The tenant's policies could not be evaluated, so the action was refused
    (``POLICY_ERROR``)."""


class MultipleReceipts(GatewayRefused):
    """The remote system holds several results for one key (``MULTIPLE_RECEIPTS``)."""


class ResultUnknown(GatewayRefused):
    """Nobody can tell whether the call took effect (``RESULT_UNKNOWN``)."""


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
    "GATEWAY_GOVERNED": GatewayGoverned,
    "INTEGRITY_VIOLATION": Conflict,
    "CONTRACT_IMMUTABLE": Conflict,
    "REQUEST_IN_FLIGHT": RequestInFlight,
    "IDEMPOTENCY_KEY_REUSED": IdempotencyKeyReused,
    "IDEMPOTENCY_KEY_MISMATCH": IdempotencyKeyMismatch,
    "NOT_FOUND": NotFound,
    "VALIDATION_FAILED": ValidationFailed,
    "SENSITIVE_VALUE": ValidationFailed,
    "CONTRACT_INVALID": ValidationFailed,
    "MALFORMED_REQUEST": ValidationFailed,
    "REQUEST_TOO_LARGE": ValidationFailed,
    "UNSUPPORTED_MEDIA_TYPE": ValidationFailed,
    # Refused by the portal's HTTP layer before any endpoint ran (docs/api.md).
    "METHOD_NOT_ALLOWED": ValidationFailed,
    "NOT_ACCEPTABLE": ValidationFailed,
    "URI_TOO_LONG": ValidationFailed,
    "HEADERS_TOO_LARGE": ValidationFailed,
    "EXPECTATION_FAILED": ValidationFailed,
    "UNAUTHENTICATED": Unauthenticated,
    "FORBIDDEN": Forbidden,
    "ACTION_NOT_GRANTED": ActionNotGranted,
    "RATE_LIMITED": RateLimited,
    "CONTRACT_RETIRED": ContractRetired,
    # A new reservation the tenant's policies refuse: nothing was stored (403).
    "POLICY_DENIED": Forbidden,
    "POLICY_ERROR": Forbidden,
    "INTERNAL": ServerError,
}


# The gateway's refusals (422, the reason code as ``code``): the task went to a person.
REFUSALS_BY_CODE: Final[Mapping[str, type[GatewayRefused]]] = {
    "FIELD_MISSING": FieldMissing,
    "FIELD_SOURCE_MISMATCH": FieldSourceMismatch,
    "FIELD_STALE": FieldStale,
    "CONTRACT_RETIRED": GatewayContractRetired,
    "VERSION_CONFLICT": VersionConflict,
    "TARGET_FORBIDDEN": TargetForbidden,
    "PERMISSION_REVOKED": PermissionRevoked,
    "CREDENTIAL_EXPIRED": CredentialExpired,
    "APPROVAL_REQUIRED": ApprovalRequired,
    "MULTIPLE_RECEIPTS": MultipleReceipts,
    "RESULT_UNKNOWN": ResultUnknown,
    "POLICY_DENIED": PolicyDenied,
    "POLICY_ERROR": PolicyError,
}
_REFUSAL_STATUS: Final = 422


def _optional_id(value: Any) -> str | None:
    # The portal renders an absent id as null, and older builds as the text "None".
    text = "" if value is None else str(value)
    return text if text and text != "None" else None


def _refusal_class(
    status: int, code: str, body: Mapping[str, Any]
) -> type[GatewayRefused] | None:
    """The refusal class for a gateway refusal, or None if it is not one."""
    if status != _REFUSAL_STATUS:
        return None
    handed_over = "task_state" in body or "escalation_id" in body
    if code == "CONTRACT_RETIRED" and not handed_over:
        # Registration refuses a retired contract with the same code and status, but
        # nothing went to a person: that is the plain ``ContractRetired``.
        return None
    cls = REFUSALS_BY_CODE.get(code)
    if cls is None and body.get("task_state") == "human_required":
        return GatewayRefused  # a reason newer than this client
    return cls


def error_from_problem(status: int, body: Mapping[str, Any]) -> PortalError:
    """The typed error for a problem document; unknown codes give ``PortalError``."""
    code = str(body.get("code") or f"HTTP_{status}")
    detail = str(body.get("detail") or body.get("title") or "")
    cls = _refusal_class(status, code, body) or ERRORS_BY_CODE.get(code)
    if cls is None:
        # Infrastructure in front of the portal (a proxy's 502) sends no code.
        cls = ServerError if status >= 500 else PortalError
    return cls(status, code, detail, body)
