"""The ticket desk's memory: tickets, the side-effect ledger and armed faults.

One lock guards everything, so an idempotency check and the creation it allows are
one step even when the threaded server runs two requests with the same key.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final, Literal

Channel = Literal["create", "lookup"]

# Fault modes by the requests they act on.
CREATE_FAULTS: Final = frozenset(
    {
        "slow",
        "execute_then_drop",
        "duplicate",
        "error_5xx",
        "after_5xx",
        "rate_limited",
        "reject",
        # Hostile answers: the ticket is made, then the answer is one a client
        # must not trust (docs: ticketdesk/README.md, "Fault modes").
        "redirect",
        "oversize",
        "malformed",
        "foreign_key",
        "foreign_tenant",
        "drip",
    }
)
LOOKUP_FAULTS: Final = frozenset({"lookup_5xx", "lookup_slow"})
FAULT_MODES: Final = CREATE_FAULTS | LOOKUP_FAULTS
DEFAULT_DELAY_S: Final = 1.0
DEFAULT_RETRY_AFTER_S: Final = 1


class IdempotencyKeyReused(Exception):
    """This idempotency key was first used with another request body."""


class JtiSpent(Exception):
    """This credential id was used before, or revoked."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why  # "used" or "revoked"


@dataclass(kw_only=True)
class Fault:
    """A fault switch, armed for the next ``times`` requests of its channel."""

    mode: str
    times: int  # 0: until cleared
    delay_s: float = DEFAULT_DELAY_S
    retry_after_s: int = DEFAULT_RETRY_AFTER_S
    used: int = 0

    @property
    def channel(self) -> Channel:
        return "lookup" if self.mode in LOOKUP_FAULTS else "create"

    def as_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "times": self.times,
            "used": self.used,
            "delay_s": self.delay_s,
            "retry_after_s": self.retry_after_s,
        }


@dataclass(frozen=True, kw_only=True)
class Ticket:
    ticket_id: str
    receipt_id: str
    tenant: str
    queue: str
    summary: str
    customer: str | None
    object_ref: dict[str, str] | None
    fields: dict[str, Any]
    idempotency_key: str
    credential_jti: str
    created_at: str

    def as_json(self) -> dict[str, Any]:
        return {
            "ticket_id": self.ticket_id,
            "tenant": self.tenant,
            "queue": self.queue,
            "summary": self.summary,
            "customer": self.customer,
            "object": self.object_ref,
            "fields": self.fields,
            "idempotency_key": self.idempotency_key,
            "created_at": self.created_at,
            "receipt": {
                "receipt_id": self.receipt_id,
                "ticket_id": self.ticket_id,
                "idempotency_key": self.idempotency_key,
                "credential_jti": self.credential_jti,
                "issued_at": self.created_at,
            },
        }


@dataclass(frozen=True, kw_only=True)
class CreateResult:
    ticket: Ticket
    created: bool  # False: a replay of an earlier request with this key


def body_fingerprint(body: dict[str, Any]) -> str:
    """The body in one canonical spelling, so key order and spacing do not matter."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _now_iso() -> str:
    moment = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
    return moment.replace("+00:00", "Z")


@dataclass(kw_only=True)
class _State:
    tickets: dict[str, Ticket] = field(default_factory=dict)
    # (tenant, key) -> the fingerprint of the first body and every ticket made for it
    fingerprints: dict[tuple[str, str], str] = field(default_factory=dict)
    by_key: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    sequence: int = 0
    created_by_key: Counter[str] = field(default_factory=Counter)
    requests: Counter[str] = field(default_factory=Counter)
    faults: list[Fault] = field(default_factory=list)
    # The replay cache: jti -> (its exp, "used" or "revoked"). An entry is kept until
    # its token expires; after that the token's own exp refuses it.
    spent: dict[str, tuple[int, str]] = field(default_factory=dict)


class Desk:
    """The remote business system's state, safe to share between request threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = _State()

    def reset(self) -> None:
        """Forget every ticket, count and fault; ticket ids start again at 1."""
        with self._lock:
            self._state = _State()

    def count_request(self, channel: Channel) -> None:
        with self._lock:
            self._state.requests[channel] += 1

    def arm_fault(self, fault: Fault) -> list[Fault]:
        """Queue ``fault`` behind those already armed on its channel."""
        with self._lock:
            self._state.faults.append(fault)
            return list(self._state.faults)

    def clear_faults(self) -> None:
        with self._lock:
            self._state.faults.clear()

    def faults(self) -> list[dict[str, Any]]:
        with self._lock:
            return [fault.as_json() for fault in self._state.faults]

    def take_fault(self, channel: Channel) -> Fault | None:
        """The fault for this request: the oldest armed on its channel, used once."""
        with self._lock:
            for fault in self._state.faults:
                if fault.channel == channel:
                    fault.used += 1
                    if fault.times and fault.used >= fault.times:
                        self._state.faults.remove(fault)
                    return fault
            return None

    def _spend(self, *, jti: str, exp: int) -> None:
        """Mark ``jti`` used, under the lock; refuse one used or revoked before."""
        state = self._state
        now = time.time()
        for old in [j for j, (old_exp, _) in state.spent.items() if old_exp <= now]:
            del state.spent[old]
        seen = state.spent.get(jti)
        if seen is not None:
            raise JtiSpent(seen[1])
        state.spent[jti] = (exp, "used")

    def spend(self, *, jti: str, exp: int) -> None:
        """Use up a credential for one request (a lookup).

        Raises:
            JtiSpent: the credential was used before, or revoked.
        """
        with self._lock:
            self._spend(jti=jti, exp=exp)

    def revoke(self, *, credentials: list[dict[str, Any]]) -> int:
        """Refuse these credentials (``jti``, ``exp``) from now on; returns how many
        were not known as spent yet."""
        with self._lock:
            fresh = 0
            for item in credentials:
                if item["jti"] not in self._state.spent:
                    fresh += 1
                self._state.spent[item["jti"]] = (item["exp"], "revoked")
            return fresh

    def create(
        self,
        *,
        tenant: str,
        idempotency_key: str,
        body: dict[str, Any],
        credential_jti: str,
        credential_exp: int,
        copies: int = 1,
    ) -> CreateResult:
        """Create ``copies`` tickets for a new key, or return the first for a known one.

        The credential is used up in the same step, so two requests with one token
        make at most one answer; a replay under the same key with a fresh credential
        returns the first ticket.

        Raises:
            JtiSpent: the credential was used before, or revoked.
            IdempotencyKeyReused: the key was first used with another body.
        """
        scope = (tenant, idempotency_key)
        fingerprint = body_fingerprint(body)
        with self._lock:
            state = self._state
            known = state.fingerprints.get(scope)
            if known is not None and known != fingerprint:
                raise IdempotencyKeyReused()
            self._spend(jti=credential_jti, exp=credential_exp)
            if known is not None:
                first = state.tickets[state.by_key[scope][0]]
                return CreateResult(ticket=first, created=False)
            state.fingerprints[scope] = fingerprint
            made = []
            for _ in range(copies):
                state.sequence += 1
                ticket = Ticket(
                    ticket_id=f"TCK-{state.sequence:06d}",
                    receipt_id=f"RCP-{state.sequence:06d}",
                    tenant=tenant,
                    queue=body["queue"],
                    summary=body["summary"],
                    customer=body.get("customer"),
                    object_ref=body.get("object"),
                    fields=body.get("fields") or {},
                    idempotency_key=idempotency_key,
                    credential_jti=credential_jti,
                    created_at=_now_iso(),
                )
                state.tickets[ticket.ticket_id] = ticket
                state.by_key.setdefault(scope, []).append(ticket.ticket_id)
                state.created_by_key[idempotency_key] += 1
                made.append(ticket)
            return CreateResult(ticket=made[0], created=True)

    def find(
        self,
        *,
        tenant: str,
        idempotency_key: str | None = None,
        object_type: str | None = None,
        object_id: str | None = None,
    ) -> list[Ticket]:
        """The tenant's tickets matching every criterion given, oldest first."""
        with self._lock:
            tickets = list(self._state.tickets.values())
        return [
            ticket
            for ticket in tickets
            if ticket.tenant == tenant
            and (idempotency_key is None or ticket.idempotency_key == idempotency_key)
            and (
                object_type is None
                or (
                    ticket.object_ref is not None
                    and ticket.object_ref["type"] == object_type
                    and ticket.object_ref["id"] == object_id
                )
            )
        ]

    def get(self, *, tenant: str, ticket_id: str) -> Ticket | None:
        """One ticket of the tenant; another tenant's ticket is not found."""
        with self._lock:
            ticket = self._state.tickets.get(ticket_id)
        return ticket if ticket is not None and ticket.tenant == tenant else None

    def all_tickets(self) -> list[Ticket]:
        with self._lock:
            return list(self._state.tickets.values())

    def effects(self) -> dict[str, Any]:
        """The side-effect ledger: tickets created (in total and per key), requests."""
        with self._lock:
            state = self._state
            return {
                "tickets_created": len(state.tickets),
                "by_idempotency_key": dict(state.created_by_key),
                "requests": sum(state.requests.values()),
                "create_requests": state.requests["create"],
                "lookup_requests": state.requests["lookup"],
            }
