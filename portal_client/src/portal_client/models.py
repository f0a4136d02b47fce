"""What the API returns, as frozen dataclasses built from its JSON.

Each model keeps the JSON it came from in ``raw`` (left out of equality and repr),
so fields a newer server adds are reachable before this package learns them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def _time(value: Any) -> dt.datetime | None:
    return None if value is None else dt.datetime.fromisoformat(str(value))


def _required_time(value: Any) -> dt.datetime:
    return dt.datetime.fromisoformat(str(value))


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A task's lease. ``token`` is the fencing token: send it with every write."""

    owner: str | None
    token: int
    acquired_at: dt.datetime | None
    expires_at: dt.datetime | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Lease:
        return cls(
            owner=_optional_str(data.get("owner")),
            token=int(data["token"]),
            acquired_at=_time(data.get("acquired_at")),
            expires_at=_time(data.get("expires_at")),
        )

    @property
    def held(self) -> bool:
        """Somebody holds the lease (as of the answer; it may have lapsed since)."""
        return self.owner is not None


@dataclass(frozen=True, kw_only=True)
class Task:
    id: str
    client_task_id: str
    workflow_key: str
    workflow_version: str
    contract_key: str | None
    contract_version: int | None
    object_type: str
    object_id: str
    object_version: str
    state: str
    state_version: int
    current_step: str
    wake_at: dt.datetime | None
    reason_code: str | None
    lease: Lease
    trace_id: str
    span_id: str
    created_at: dt.datetime
    updated_at: dt.datetime
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Task:
        workflow = data.get("workflow") or {}
        contract = data.get("contract") or {}
        obj = data.get("object") or {}
        return cls(
            id=str(data["id"]),
            client_task_id=str(data["client_task_id"]),
            workflow_key=str(workflow.get("key", "")),
            workflow_version=str(workflow.get("version", "")),
            contract_key=_optional_str(contract.get("key")),
            contract_version=(
                None if contract.get("version") is None else int(contract["version"])
            ),
            object_type=str(obj.get("type", "")),
            object_id=str(obj.get("id", "")),
            object_version=str(obj.get("version", "")),
            state=str(data["state"]),
            state_version=int(data["state_version"]),
            current_step=str(data.get("current_step") or ""),
            wake_at=_time(data.get("wake_at")),
            reason_code=_optional_str(data.get("reason_code")),
            lease=Lease.from_json(data["lease"]),
            trace_id=str(data.get("trace_id") or ""),
            span_id=str(data.get("span_id") or ""),
            created_at=_required_time(data["created_at"]),
            updated_at=_required_time(data["updated_at"]),
            raw=dict(data),
        )


@dataclass(frozen=True, kw_only=True)
class Operation:
    """A reserved side effect; ``idempotency_key`` is its business identity."""

    id: str
    task_id: str
    idempotency_key: str
    action: str
    target: str
    input_hash: str
    state: str
    state_version: int
    reason_code: str | None
    attempts: int
    provider_reference: str | None
    result: Any
    trace_id: str
    span_id: str
    created_at: dt.datetime
    updated_at: dt.datetime
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Operation:
        return cls(
            id=str(data["id"]),
            task_id=str(data["task_id"]),
            idempotency_key=str(data["idempotency_key"]),
            action=str(data["action"]),
            target=str(data["target"]),
            input_hash=str(data["input_hash"]),
            state=str(data["state"]),
            state_version=int(data["state_version"]),
            reason_code=_optional_str(data.get("reason_code")),
            attempts=int(data["attempts"]),
            provider_reference=_optional_str(data.get("provider_reference")),
            result=data.get("result"),
            trace_id=str(data.get("trace_id") or ""),
            span_id=str(data.get("span_id") or ""),
            created_at=_required_time(data["created_at"]),
            updated_at=_required_time(data["updated_at"]),
            raw=dict(data),
        )


@dataclass(frozen=True, kw_only=True)
class FieldValue:
    """A field the agent read, with its provenance, for the gateway's field check.

    The gateway refuses the action when a required field is missing, comes from
    another ``source`` than the contract names, or was observed longer ago than the
    contract's ``max_age_s``: send when you *read* the value, not when you send it.
    """

    name: str
    value: Any
    source: str
    observed_at: dt.datetime

    def __post_init__(self) -> None:
        # A naive time would be read in the portal's zone: freshness would be off
        # by the UTC offset, which is exactly what the stale check must not be.
        if self.observed_at.utcoffset() is None:
            raise ValueError("observed_at must be timezone-aware")

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "source": self.source,
            "observed_at": self.observed_at.isoformat(),
        }


@dataclass(frozen=True, kw_only=True)
class FieldRead:
    """A field you read for ``take_action``: its value, where from, and when."""

    value: Any
    source: str
    read_at: dt.datetime

    def as_json(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "source": self.source,
            "read_at": self.read_at.isoformat(),
        }


@dataclass(frozen=True, kw_only=True)
class ActionResult:
    """What became of ``take_action``: an answer to act on without guessing.

    ``status``: ``verified`` (``provider_reference`` is the receipt), ``refused`` (a
    check refused before any call: ``reason_code``, ``failed_check``,
    ``failed_fields``; a person has ``desk_item_id``), ``human_required`` (a person
    decides: ``desk_item_id``), ``unknown`` (in doubt; the portal looks the receipt
    up), ``accepted`` (queued for a worker) or ``failed`` (the remote system
    rejected it; the key is spent). ``next_step`` says what to do; for every status
    but ``failed``, never retry with a new key: repeat the same call or poll
    ``status_url`` (``get_operation(operation_id)``).
    """

    status: str
    next_step: str
    status_url: str
    operation_id: str
    task_id: str
    operation_state: str
    task_state: str
    created: bool
    reason_code: str | None
    failed_check: str | None
    failed_fields: tuple[str, ...]
    provider_reference: str | None
    result: Any
    desk_item_id: str | None
    attempts: int
    details: Mapping[str, Any]
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def settled(self) -> bool:
        """Whether the answer is final for now (not ``unknown`` or ``accepted``)."""
        return self.status not in ("unknown", "accepted")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ActionResult:
        return cls(
            status=str(data["status"]),
            next_step=str(data.get("next_step", "")),
            status_url=str(data.get("status_url", "")),
            operation_id=str(data["operation_id"]),
            task_id=str(data["task_id"]),
            operation_state=str(data["operation_state"]),
            task_state=str(data["task_state"]),
            created=bool(data.get("created", False)),
            reason_code=_optional_str(data.get("reason_code")),
            failed_check=_optional_str(data.get("failed_check")),
            failed_fields=tuple(str(name) for name in data.get("failed_fields") or ()),
            provider_reference=_optional_str(data.get("provider_reference")),
            result=data.get("result"),
            desk_item_id=_optional_str(data.get("desk_item_id")),
            attempts=int(data.get("attempts", 0)),
            details=dict(data.get("details") or {}),
            raw=dict(data),
        )


@dataclass(frozen=True, kw_only=True)
class Execution:
    """What the gateway did with an execution request (200 answers only).

    ``outcome`` is ``verified`` (``operation.provider_reference`` holds the receipt
    id), ``failed`` (the remote system refused), ``unknown`` (in doubt: the portal's
    recovery looks the receipt up by key; poll ``get_operation``) or ``conflict``
    (several receipts; a person has the escalation ``escalation_id``). A refusal is
    not an ``Execution`` but a ``GatewayRefused`` error.
    """

    outcome: str
    reason_code: str | None
    escalation_id: str | None
    operation: Operation
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Execution:
        return cls(
            outcome=str(data["outcome"]),
            reason_code=_optional_str(data.get("reason_code")),
            escalation_id=_optional_str(data.get("escalation_id")),
            operation=Operation.from_json(data["operation"]),
            raw=dict(data),
        )


@dataclass(frozen=True, kw_only=True)
class Event:
    """One entry of a task's audit trail (payload already redacted by the portal)."""

    id: str
    code: str
    task_id: str | None
    operation_id: str | None
    actor_type: str
    actor_id: str
    reason_code: str | None
    contract_key: str | None
    contract_version: int | None
    payload: Any
    trace_id: str
    span_id: str
    created_at: dt.datetime
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Event:
        version = data.get("contract_version")
        return cls(
            id=str(data["id"]),
            code=str(data["code"]),
            task_id=_optional_str(data.get("task_id")),
            operation_id=_optional_str(data.get("operation_id")),
            actor_type=str(data.get("actor_type") or ""),
            actor_id=str(data.get("actor_id") or ""),
            reason_code=_optional_str(data.get("reason_code")),
            contract_key=_optional_str(data.get("contract_key")),
            contract_version=None if version is None else int(version),
            payload=data.get("payload"),
            trace_id=str(data.get("trace_id") or ""),
            span_id=str(data.get("span_id") or ""),
            created_at=_required_time(data["created_at"]),
            raw=dict(data),
        )


@dataclass(frozen=True, kw_only=True)
class ObjectVersion:
    """The recorded current version of a business object (the version fence)."""

    object_type: str
    object_id: str
    version: str
    updated_at: dt.datetime

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ObjectVersion:
        return cls(
            object_type=str(data["object_type"]),
            object_id=str(data["object_id"]),
            version=str(data["version"]),
            updated_at=_required_time(data["updated_at"]),
        )


@dataclass(frozen=True, kw_only=True)
class Page(Generic[T]):
    """One page of a cursor-paginated list.

    ``next_cursor`` goes back as ``cursor=`` for the following page; None on the last.
    """

    items: tuple[T, ...]
    next_cursor: str | None
    previous_cursor: str | None
