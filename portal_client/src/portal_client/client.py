"""``PortalClient``: one method per endpoint of the portal's agent API (/api/v1/).

Retry guarantees (see README.md):

- Every POST carries an ``Idempotency-Key`` header: the caller's ``request_key`` or a
  fresh UUID4 per method call. Every retry of that call resends the same key and the
  same body bytes, so the portal runs it at most once and replays the first answer
  to a retry (header ``Idempotent-Replayed: true``).
- Retried, with capped exponential backoff and jitter: transport errors (connect,
  read, write, timeout), 409 ``REQUEST_IN_FLIGHT`` (the first delivery still runs),
  429 (waiting at least ``Retry-After``, capped) and 502/503/504 (a proxy or a
  restarting server; the portal frees a key whose request failed with a 5xx).
- Never retried: any other 4xx, and 500 (a portal bug does not fix itself).
- GET and PUT are safe to repeat by definition; they retry on the same conditions.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, TypeVar
from urllib.parse import parse_qs, quote, urlsplit

import httpx

from .errors import PortalError, PortalUnavailable, error_from_problem
from .models import (
    ActionResult,
    Event,
    Execution,
    FieldRead,
    FieldValue,
    ObjectVersion,
    Operation,
    Page,
    Task,
)

__all__ = ["PortalClient"]

logger = logging.getLogger("portal_client")

T = TypeVar("T")

USER_AGENT: Final = "agent-portal-client/0.1.0"
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
LEASE_TOKEN_HEADER: Final = "Lease-Token"  # noqa: S105  (a header name, not a secret)
REPLAY_HEADER: Final = "Idempotent-Replayed"
API_PREFIX: Final = "/api/v1"

# 502/503/504 come from proxies and restarts; 500 is the portal's own failure.
_RETRYABLE_STATUSES: Final = frozenset({429, 502, 503, 504})
_RETRYABLE_CODES: Final = frozenset({"REQUEST_IN_FLIGHT"})

# Sentinel for "send no body" (a JSON ``null`` body is a different request).
_NO_BODY: Final[Any] = object()


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _encode(body: Any) -> bytes:
    # Encoded once per call: the portal fingerprints the exact bytes, so every retry
    # must send these same bytes under the same key.
    return json.dumps(
        body, separators=(",", ":"), ensure_ascii=False, default=_json_default
    ).encode()


def _segment(value: Any) -> str:
    return quote(str(value), safe="")


def _cursor(link: Any) -> str | None:
    """The ``cursor`` parameter of a pagination link.

    Only the cursor is taken: the link's host is what the portal saw, which behind a
    proxy is not the address this client uses.
    """
    if not link:
        return None
    values = parse_qs(urlsplit(str(link)).query).get("cursor")
    return values[0] if values else None


def _retry_after_s(response: httpx.Response) -> float:
    raw = response.headers.get("Retry-After", "").strip()
    if not raw:
        return 0.0
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


def _problem(response: httpx.Response) -> PortalError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"detail": response.text[:500]}
    return error_from_problem(response.status_code, body)


class PortalClient:
    """A synchronous client for one agent key. Thread-safe; use as a context manager.

    Args:
        base_url: the portal's root, e.g. ``http://127.0.0.1:8000`` (``/api/v1`` is
            added unless already there).
        api_key: the agent's API key (``agp_...``); it fixes the tenant.
        timeout: seconds per attempt (connect, read, write, pool).
        max_retries: retries after the first attempt (0: no retries).
        backoff_s: the first retry's delay; it doubles per retry, with jitter.
        max_backoff_s: the cap on any one delay, ``Retry-After`` included.
        traceparent: a W3C trace context sent with every request.
        transport: an ``httpx.BaseTransport`` (tests, fault injection, proxies).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        traceparent: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        root = base_url.rstrip("/")
        if not root.endswith(API_PREFIX):
            root += API_PREFIX
        self.base_url = root
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.traceparent = traceparent
        self._http = httpx.Client(
            base_url=root + "/",
            timeout=timeout,
            transport=transport,
            headers={
                "Authorization": f"Bearer {api_key}",
                "Accept": "application/json, application/problem+json",
                "User-Agent": USER_AGENT,
            },
        )

    def __repr__(self) -> str:
        return f"PortalClient({self.base_url!r})"  # never the key

    def __enter__(self) -> PortalClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- One governed action in one call ---------------------------------------------

    def take_action(
        self,
        *,
        action: str,
        target: str,
        object_type: str,
        object_id: str,
        object_version: str,
        fields: Mapping[str, FieldRead | Mapping[str, Any]],
        arguments: Any,
        idempotency_key: str,
        contract_key: str | None = None,
        contract_version: int | None = None,
        workflow_key: str | None = None,
        workflow_version: str | None = None,
        client_task_id: str | None = None,
        respond_async: bool = False,
        request_key: str | None = None,
    ) -> ActionResult:
        """Take one governed action whole (``POST /actions``): the portal registers
        or finds the task, leases it, reserves the operation under
        ``idempotency_key``, and its gateway checks, calls and verifies.

        ``idempotency_key`` is the side effect's business identity: repeat the
        same call (same key, action, target, object and arguments; fields read
        again are fine) to get the same operation's answer; the remote system is
        called at most once. A call with the same key still under way answers 409
        ``REQUEST_IN_FLIGHT``, which this client retries after ``Retry-After``.
        ``respond_async``: the checks run now and a worker makes the call
        (``status == "accepted"``).

        Returns:
            The ``ActionResult``; a refusal or a person's turn is a result (with
            ``desk_item_id``), not an error.

        Raises:
            IdempotencyKeyReused: the key was used for another action; nothing ran.
            ActionNotGranted: you hold no grant for ``action`` on ``target``.
            NotFound: no published contract fits (or the named one does not exist).
            ValidationFailed: the request is not valid.
            RequestInFlight: still in flight after every retry.
        """
        body: dict[str, Any] = {
            "action": action,
            "target": target,
            "object_type": object_type,
            "object_id": object_id,
            "object_version": object_version,
            "fields": {
                name: read.as_json() if isinstance(read, FieldRead) else dict(read)
                for name, read in fields.items()
            },
            "arguments": arguments,
            "idempotency_key": idempotency_key,
        }
        optional = {
            "contract_key": contract_key,
            "contract_version": contract_version,
            "workflow_key": workflow_key,
            "workflow_version": workflow_version,
            "client_task_id": client_task_id,
        }
        body.update({name: value for name, value in optional.items() if value})
        response = self._send(
            "POST",
            "actions",
            body=body,
            request_key=request_key,
            extra_headers={"Prefer": "respond-async"} if respond_async else None,
        )
        return ActionResult.from_json(response.json())

    # --- Tasks -----------------------------------------------------------------------

    def register_task(
        self,
        *,
        client_task_id: str,
        workflow_key: str,
        workflow_version: str,
        object_type: str,
        object_id: str,
        object_version: str,
        contract_key: str | None = None,
        contract_version: int | None = None,
        request_key: str | None = None,
    ) -> tuple[Task, bool]:
        """Register a task; returns ``(task, created)``.

        Idempotent on ``client_task_id``: the same details again return the stored
        task with ``created=False``. A ``contract_key`` without a version pins the
        newest published version.

        Raises:
            IdempotencyKeyReused: the id was registered with different details.
            NotFound: no such published contract version.
            ContractRetired: the pinned contract version is retired.
        """
        body: dict[str, Any] = {
            "client_task_id": client_task_id,
            "workflow_key": workflow_key,
            "workflow_version": workflow_version,
            "object_type": object_type,
            "object_id": object_id,
            "object_version": object_version,
        }
        if contract_key is not None:
            body["contract_key"] = contract_key
        if contract_version is not None:
            body["contract_version"] = contract_version
        response = self._send("POST", "tasks", body=body, request_key=request_key)
        return Task.from_json(response.json()), response.status_code == 201

    def get_task(self, task_id: str) -> Task:
        """One task of the tenant. Raises NotFound (another tenant's id too)."""
        return Task.from_json(self._send("GET", f"tasks/{_segment(task_id)}").json())

    def list_tasks_page(
        self,
        *,
        state: str | None = None,
        object_type: str | None = None,
        object_id: str | None = None,
        trace_id: str | None = None,
        updated_since: dt.datetime | None = None,
        page_size: int | None = None,
        cursor: str | None = None,
    ) -> Page[Task]:
        """One page of the tenant's tasks, oldest first, filtered."""
        params = {
            "state": state,
            "object_type": object_type,
            "object_id": object_id,
            "trace_id": trace_id,
            "updated_since": updated_since.isoformat() if updated_since else None,
            "page_size": page_size,
            "cursor": cursor,
        }
        return self._page("tasks", params, Task.from_json)

    def list_tasks(
        self,
        *,
        state: str | None = None,
        object_type: str | None = None,
        object_id: str | None = None,
        trace_id: str | None = None,
        updated_since: dt.datetime | None = None,
        page_size: int | None = None,
    ) -> Iterator[Task]:
        """Every matching task, oldest first, following the cursor page by page."""
        return _iterate(
            lambda cursor: self.list_tasks_page(
                state=state,
                object_type=object_type,
                object_id=object_id,
                trace_id=trace_id,
                updated_since=updated_since,
                page_size=page_size,
                cursor=cursor,
            )
        )

    def claim_next(
        self, *, owner: str, ttl_s: int | None = None, request_key: str | None = None
    ) -> Task | None:
        """Claim the oldest pending task (now running, leased to ``owner``).

        Returns None when nothing is pending. A lost answer retried under the same
        key replays the claim, so a claimed task is never stranded.
        """
        body: dict[str, Any] = {"owner": owner}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        response = self._send(
            "POST", "tasks/claim-next", body=body, request_key=request_key
        )
        if response.status_code == 204:
            return None
        return Task.from_json(response.json())

    # --- Leases ----------------------------------------------------------------------

    def acquire_lease(
        self,
        task_id: str,
        *,
        owner: str,
        ttl_s: int | None = None,
        request_key: str | None = None,
    ) -> Task:
        """Take the lease of a pending, running or waiting task; a new fencing token.

        Raises:
            LeaseHeld: another owner holds a live lease.
            TaskNotLeasable: the task is finished or with a person.
            NotFound: no such task.
        """
        body: dict[str, Any] = {"owner": owner}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        return self._task_post(f"tasks/{_segment(task_id)}/lease", body, request_key)

    def renew_lease(
        self,
        task_id: str,
        *,
        lease_token: int,
        ttl_s: int | None = None,
        request_key: str | None = None,
    ) -> Task:
        """Extend a live lease to ``ttl_s`` from now. Raises LeaseExpired if lapsed."""
        body: dict[str, Any] = {} if ttl_s is None else {"ttl_s": ttl_s}
        return self._task_post(
            f"tasks/{_segment(task_id)}/lease/renew", body, request_key, lease_token
        )

    def release_lease(
        self, task_id: str, *, lease_token: int, request_key: str | None = None
    ) -> Task:
        """Give the lease back; a running task returns to pending."""
        return self._task_post(
            f"tasks/{_segment(task_id)}/lease/release",
            _NO_BODY,
            request_key,
            lease_token,
        )

    def transition(
        self,
        task_id: str,
        *,
        to: str,
        expected_state_version: int,
        lease_token: int,
        step: str | None = None,
        reason_code: str | None = None,
        wake_at: dt.datetime | None = None,
        payload: Mapping[str, Any] | None = None,
        request_key: str | None = None,
    ) -> Task:
        """Move the task under your lease; any state but running hands the lease back.

        Raises:
            StaleState: ``expected_state_version`` is old; reload, never overwrite.
            LeaseExpired: your token is fenced out or the lease lapsed.
            IllegalTransition: the state machine does not allow the move.
        """
        body: dict[str, Any] = {
            "to": to,
            "expected_state_version": expected_state_version,
        }
        if step is not None:
            body["step"] = step
        if reason_code is not None:
            body["reason_code"] = reason_code
        if wake_at is not None:
            body["wake_at"] = wake_at
        if payload is not None:
            body["payload"] = dict(payload)
        return self._task_post(
            f"tasks/{_segment(task_id)}/transitions", body, request_key, lease_token
        )

    # --- Operations ------------------------------------------------------------------

    def reserve_operation(
        self,
        task_id: str,
        *,
        lease_token: int,
        idempotency_key: str,
        action: str,
        target: str,
        input: Any,
        request_key: str | None = None,
    ) -> tuple[Operation, bool]:
        """Reserve a side effect before calling out; returns ``(operation, created)``.

        ``idempotency_key`` is the side effect's business identity (body field), not
        the ``Idempotency-Key`` header (``request_key``). The same key and input
        return the stored operation (``created=False``) even after the lease ended.

        Raises:
            IdempotencyKeyReused: the key was reserved with a different input.
            ActionNotGranted: the agent may not do ``action`` on ``target``.
            LeaseExpired: a new reservation needs the task's live lease.
        """
        body = {
            "idempotency_key": idempotency_key,
            "action": action,
            "target": target,
            "input": input,
        }
        response = self._send(
            "POST",
            f"tasks/{_segment(task_id)}/operations",
            body=body,
            lease_token=lease_token,
            request_key=request_key,
        )
        return Operation.from_json(response.json()), response.status_code == 201

    def get_operation(self, operation_id: str) -> Operation:
        """One operation of the tenant. Raises NotFound."""
        response = self._send("GET", f"operations/{_segment(operation_id)}")
        return Operation.from_json(response.json())

    def start_operation(
        self, operation_id: str, *, lease_token: int, request_key: str | None = None
    ) -> Operation:
        """Mark the operation executing (one more attempt) just before your call.

        Raises:
            IllegalTransition: it cannot start from its state (e.g. verified).
            LeaseExpired: the task's lease token is not current.
        """
        response = self._send(
            "POST",
            f"operations/{_segment(operation_id)}/start",
            lease_token=lease_token,
            request_key=request_key,
        )
        return Operation.from_json(response.json())

    def report_outcome(
        self,
        operation_id: str,
        *,
        lease_token: int,
        outcome: str,
        provider_reference: str | None = None,
        result: Mapping[str, Any] | None = None,
        reason_code: str | None = None,
        request_key: str | None = None,
    ) -> Operation:
        """Report what your call did: ``verified`` (with the receipt id in
        ``provider_reference``), ``failed`` or ``unknown``.

        Raises:
            ValidationFailed: not an outcome, or verified without a receipt id.
            IllegalTransition: the operation is not executing (or unknown).
            LeaseExpired: the task's lease token is not current.
        """
        body: dict[str, Any] = {"outcome": outcome}
        if provider_reference is not None:
            body["provider_reference"] = provider_reference
        if result is not None:
            body["result"] = dict(result)
        if reason_code is not None:
            body["reason_code"] = reason_code
        response = self._send(
            "POST",
            f"operations/{_segment(operation_id)}/outcome",
            body=body,
            lease_token=lease_token,
            request_key=request_key,
        )
        return Operation.from_json(response.json())

    def execute_operation(
        self,
        operation_id: str,
        *,
        lease_token: int,
        field_values: Iterable[FieldValue | Mapping[str, Any]],
        request_key: str | None = None,
    ) -> Execution:
        """Have the action gateway execute a reserved operation for you.

        The gateway checks the pinned contract, the fields you read (``name``,
        ``value``, ``source``, ``observed_at``), the target, your grant *now* and
        the object-version fence, issues a short-lived scoped credential and calls
        the remote system once under the operation's key. Executing the same
        operation again reports where it stands instead of calling again.

        Returns:
            The outcome: ``verified``, ``failed``, ``unknown`` or ``conflict``.

        Raises:
            GatewayRefused: a check failed (``FieldStale``, ``VersionConflict``,
                ...); the task is now ``human_required`` and your lease is gone.
            LeaseExpired: your token is not the task's current one.
            NotFound: no such operation in your tenant.
        """
        body = {
            "field_values": [
                value.as_json() if isinstance(value, FieldValue) else dict(value)
                for value in field_values
            ]
        }
        response = self._send(
            "POST",
            f"operations/{_segment(operation_id)}/execute",
            body=body,
            lease_token=lease_token,
            request_key=request_key,
        )
        return Execution.from_json(response.json())

    # --- Events ----------------------------------------------------------------------

    def list_events_page(
        self,
        task_id: str,
        *,
        order: str = "oldest",
        page_size: int | None = None,
        cursor: str | None = None,
    ) -> Page[Event]:
        """One page of the task's events, ``oldest`` or ``newest`` first."""
        params = {"order": order, "page_size": page_size, "cursor": cursor}
        return self._page(f"tasks/{_segment(task_id)}/events", params, Event.from_json)

    def list_events(
        self, task_id: str, *, order: str = "oldest", page_size: int | None = None
    ) -> Iterator[Event]:
        """Every event of the task, following the cursor page by page."""
        return _iterate(
            lambda cursor: self.list_events_page(
                task_id, order=order, page_size=page_size, cursor=cursor
            )
        )

    # --- Object versions -------------------------------------------------------------

    def record_object_version(
        self, object_type: str, object_id: str, *, version: str
    ) -> ObjectVersion:
        """Record a business object's current version (PUT: safe to repeat)."""
        response = self._send(
            "PUT",
            f"object-versions/{_segment(object_type)}/{_segment(object_id)}",
            body={"version": version},
        )
        return ObjectVersion.from_json(response.json())

    def get_object_version(self, object_type: str, object_id: str) -> ObjectVersion:
        """The recorded version of a business object. Raises NotFound if none."""
        response = self._send(
            "GET", f"object-versions/{_segment(object_type)}/{_segment(object_id)}"
        )
        return ObjectVersion.from_json(response.json())

    # --- Plumbing --------------------------------------------------------------------

    def _task_post(
        self,
        path: str,
        body: Any,
        request_key: str | None,
        lease_token: int | None = None,
    ) -> Task:
        response = self._send(
            "POST", path, body=body, lease_token=lease_token, request_key=request_key
        )
        return Task.from_json(response.json())

    def _page(
        self,
        path: str,
        params: Mapping[str, Any],
        parse: Callable[[Mapping[str, Any]], T],
    ) -> Page[T]:
        sent = {name: value for name, value in params.items() if value is not None}
        data = self._send("GET", path, params=sent).json()
        return Page(
            items=tuple(parse(item) for item in data["results"]),
            next_cursor=_cursor(data.get("next")),
            previous_cursor=_cursor(data.get("previous")),
        )

    def _delay_s(self, attempt: int) -> float:
        ceiling = min(self.max_backoff_s, self.backoff_s * 2**attempt)
        # Jitter spreads out clients that failed together (a restart, a hiccup).
        return random.uniform(ceiling / 2, ceiling)  # noqa: S311  (jitter, no secret)

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = _NO_BODY,
        lease_token: int | None = None,
        request_key: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Send one logical call, retrying it under one key; the 2xx answer."""
        headers: dict[str, str] = dict(extra_headers or {})
        content: bytes | None = None
        if body is not _NO_BODY:
            content = _encode(body)
            headers["Content-Type"] = "application/json"
        if method == "POST":
            headers[IDEMPOTENCY_HEADER] = request_key or str(uuid.uuid4())
        if lease_token is not None:
            headers[LEASE_TOKEN_HEADER] = str(lease_token)
        if self.traceparent:
            headers["traceparent"] = self.traceparent
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    method, path, params=params, content=content, headers=headers
                )
            except httpx.TransportError as exc:
                if attempt >= self.max_retries:
                    raise PortalUnavailable(
                        0,
                        "UNAVAILABLE",
                        f"{method} {path}: no answer after {attempt + 1} attempt(s) "
                        f"({type(exc).__name__}: {exc})",
                    ) from exc
                delay = self._delay_s(attempt)
                reason = type(exc).__name__
            else:
                if response.is_success:
                    return response
                error = _problem(response)
                retryable = (
                    error.status in _RETRYABLE_STATUSES
                    or error.code in _RETRYABLE_CODES
                )
                if not retryable or attempt >= self.max_retries:
                    raise error
                delay = max(
                    self._delay_s(attempt),
                    min(_retry_after_s(response), self.max_backoff_s),
                )
                reason = f"{error.status} {error.code}"
            logger.info(
                "retrying %s %s in %.2fs (attempt %d of %d, same %s): %s",
                method,
                path,
                delay,
                attempt + 2,
                self.max_retries + 1,
                IDEMPOTENCY_HEADER,
                reason,
            )
            attempt += 1
            time.sleep(delay)


def _iterate(fetch: Callable[[str | None], Page[T]]) -> Iterator[T]:
    cursor: str | None = None
    while True:
        page = fetch(cursor)
        yield from page.items
        if page.next_cursor is None:
            return
        cursor = page.next_cursor
