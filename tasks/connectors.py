"""Connectors: how the gateway calls a remote business system and asks for receipts.

A connector answers two questions, and only these: *do it* (with a stable
idempotency key and a short-lived credential) and *did it happen?* (lookup by key).
Every answer is classified so the recovery protocol can act on it:

- ``succeeded``: the remote says it did it and gave a receipt id;
- ``rejected``: the remote refused (4xx); nothing happened;
- ``not_executed``: throttled (429), or the target's certificate failed
  verification in the TLS handshake, so no request left the portal; nothing
  happened, try later with the same key;
- ``unknown``: timeout, dropped connection, 5xx, unreadable answer: it may or may not
  have happened. Only a lookup can tell;
- ``refused``: the outbound URL policy (``tasks/outbound.py``) forbids the address;
  nothing was sent.
"""

from __future__ import annotations

import json
import ssl
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx

from audit import payloads
from portal import db as portal_db
from portal.codes import ReasonCode

from . import outbound
from .exceptions import OutboundRefused
from .models import Connector

CallKind = Literal["succeeded", "rejected", "not_executed", "unknown", "refused"]
LookupKind = Literal["found", "none", "unknown"]

# Bounds what a remote answer can make us hold or store: read up to this, no more.
MAX_RESPONSE_BYTES = 64 * 1024
# Why an answer is not evidence (``CallResult.error``, the connector.called event):
# fixed words, so the record can be searched by them.
ANSWER_TOO_LARGE = "answer over the size limit"
REDIRECT_NOT_FOLLOWED = "redirect not followed"
NO_RECEIPT = "success without a receipt id"
RECEIPT_OTHER_KEY = "receipt for another idempotency key"
RECEIPT_OTHER_TENANT = "receipt for another tenant"
# Where a target takes revocation notices (docs/gateway.md, "What a governed target
# must verify"); a target without it answers 404 and relies on single use and expiry.
REVOCATION_PATH = "/credentials/revocations"


@dataclass(frozen=True, kw_only=True)
class CallResult:
    kind: CallKind
    status: int | None = None
    provider_reference: str | None = None
    body: dict[str, Any] | None = None
    error: str = ""
    retry_after_s: float | None = None
    duration_ms: int = 0

    def as_event_data(self) -> payloads.ConnectorResult:
        """Facts for the ``connector.called`` event (the body stays out: redaction)."""
        return {
            "outcome": self.kind,
            "status": self.status,
            "error": self.error[:200],
            "provider_reference": self.provider_reference,
            "retry_after_s": self.retry_after_s,
            "duration_ms": self.duration_ms,
        }


@dataclass(frozen=True, kw_only=True)
class LookupResult:
    kind: LookupKind
    references: list[str] = field(default_factory=list)
    status: int | None = None
    error: str = ""


class RemoteSystem(Protocol):
    """What the gateway needs of a connector."""

    supports_idempotency_keys: bool
    supports_lookup: bool

    def execute(
        self, *, idempotency_key: str, credential: str, body: bytes
    ) -> CallResult: ...

    def lookup(self, *, idempotency_key: str, credential: str) -> LookupResult: ...

    def revoke(self, *, credential: str) -> bool: ...


class HttpJsonConnector:
    """A remote system speaking JSON over HTTP, configured by a ``Connector`` row.

    ``execute``: ``POST {base_url}{execute_path}`` with ``Idempotency-Key`` and
    ``Authorization: Bearer <credential>``, the body exactly the bytes the
    credential's ``body_sha256`` names. ``lookup``: ``GET {base_url}{lookup_path}
    ?idempotency_key=K`` answering ``{"tickets": [{<reference_field>: ...}, ...]}``.
    Explicit connect and read timeouts, and a deadline for the whole exchange of
    ``connect_timeout_s + read_timeout_s`` that a slow-drip answer cannot stretch;
    at most ``MAX_RESPONSE_BYTES`` of an answer are read. Redirects are never
    followed (a redirect could send the credential elsewhere). A 2xx answer whose
    receipt names another idempotency key or tenant is no evidence (``unknown``).
    Every request goes through the outbound URL policy: the path under the base
    URL, the address checked and pinned (``tasks/outbound.py``); a refused one
    sends nothing.
    """

    def __init__(
        self, config: Connector, *, transport: httpx.BaseTransport | None = None
    ):
        self.config = config
        self.supports_idempotency_keys = config.supports_idempotency_keys
        self.supports_lookup = config.supports_lookup
        self._timeout = httpx.Timeout(
            connect=config.connect_timeout_s,
            read=config.read_timeout_s,
            write=config.read_timeout_s,
            pool=config.connect_timeout_s,
        )
        self._deadline_s = config.connect_timeout_s + config.read_timeout_s
        self._transport = transport

    def _client(self) -> httpx.Client:
        return httpx.Client(
            timeout=self._timeout,
            follow_redirects=False,
            transport=self._transport
            or outbound.transport(deadline_s=self._deadline_s),
            trust_env=False,  # no proxy: it would resolve the name after the check
        )

    def _url(self, path: str) -> str:
        return outbound.url_for(self.config.base_url, path)

    def execute(
        self, *, idempotency_key: str, credential: str, body: bytes
    ) -> CallResult:
        portal_db.forbid_transaction("the gateway calls the remote system")
        started = time.monotonic()
        headers = {
            "Authorization": f"Bearer {credential}",
            "Content-Type": "application/json",
        }
        if self.supports_idempotency_keys:
            headers["Idempotency-Key"] = idempotency_key
        try:
            with self._client() as client:
                response, content = _exchange(
                    client,
                    "POST",
                    self._url(self.config.execute_path),
                    content=body,
                    headers=headers,
                )
        except OutboundRefused as refusal:
            return CallResult(
                kind="refused", error=refusal.detail, duration_ms=_ms(started)
            )
        except httpx.HTTPError as error:
            return CallResult(
                kind="not_executed" if _certificate_refused(error) else "unknown",
                error=f"{type(error).__name__}: {error}",
                duration_ms=_ms(started),
            )
        elapsed = _ms(started)
        status = response.status_code
        if content is None:  # over the limit: what it says cannot be read
            return CallResult(
                kind="unknown",
                status=status,
                duration_ms=elapsed,
                error=ANSWER_TOO_LARGE,
            )
        answer = _json_object(content)
        if status == 429:
            return CallResult(
                kind="not_executed",
                status=status,
                duration_ms=elapsed,
                retry_after_s=_retry_after(response.headers.get("Retry-After")),
            )
        if 200 <= status < 300:
            reference = answer.get(self.config.reference_field) if answer else None
            if not isinstance(reference, str | int) or answer is None:
                # It says yes but shows no receipt: not evidence of anything.
                return CallResult(
                    kind="unknown", status=status, duration_ms=elapsed, error=NO_RECEIPT
                )
            foreign = self._foreign_receipt(answer, idempotency_key=idempotency_key)
            if foreign:
                # Someone else's receipt proves nothing about this key.
                return CallResult(
                    kind="unknown", status=status, duration_ms=elapsed, error=foreign
                )
            return CallResult(
                kind="succeeded",
                status=status,
                provider_reference=str(reference),
                body=answer,
                duration_ms=elapsed,
            )
        if 400 <= status < 500 and status != 408:
            return CallResult(
                kind="rejected",
                status=status,
                body=answer,
                duration_ms=elapsed,
                error=str((answer or {}).get("error", ""))[:200],
            )
        # 3xx (not followed), 408, 5xx: the remote may have acted before failing.
        return CallResult(
            kind="unknown",
            status=status,
            duration_ms=elapsed,
            error=REDIRECT_NOT_FOLLOWED if 300 <= status < 400 else "",
        )

    def _foreign_receipt(self, answer: dict[str, Any], *, idempotency_key: str) -> str:
        """Why a success answer belongs to another request, or ''. Checked where the
        answer says: the key it echoes, the tenant it names (the credential's)."""
        echoed = answer.get("idempotency_key")
        if echoed is not None and echoed != idempotency_key:
            return RECEIPT_OTHER_KEY
        tenant = answer.get("tenant")
        if tenant is not None and str(tenant) != str(self.config.tenant_id):
            return RECEIPT_OTHER_TENANT
        return ""

    def lookup(self, *, idempotency_key: str, credential: str) -> LookupResult:
        portal_db.forbid_transaction("the gateway queries the remote system")
        try:
            with self._client() as client:
                response, content = _exchange(
                    client,
                    "GET",
                    self._url(self.config.lookup_path),
                    params={"idempotency_key": idempotency_key},
                    headers={"Authorization": f"Bearer {credential}"},
                )
        except OutboundRefused as refusal:
            # Nothing was asked, so nothing is known: recovery looks again later
            # and, the address still refused, hands the operation to a person.
            return LookupResult(
                kind="unknown", error=f"{ReasonCode.TARGET_FORBIDDEN}: {refusal.detail}"
            )
        except httpx.HTTPError as error:
            return LookupResult(
                kind="unknown", error=f"{type(error).__name__}: {error}"
            )
        if content is None:
            return LookupResult(
                kind="unknown", status=response.status_code, error=ANSWER_TOO_LARGE
            )
        body = _json_object(content)
        records = body.get("tickets") if body else None
        if response.status_code != 200 or not isinstance(records, list):
            return LookupResult(kind="unknown", status=response.status_code)
        references = [
            str(record[self.config.reference_field])
            for record in records
            if isinstance(record, dict) and self.config.reference_field in record
        ]
        if len(references) != len(records):
            return LookupResult(kind="unknown", status=200, error="unreadable receipt")
        return LookupResult(
            kind="found" if references else "none", references=references, status=200
        )

    def revoke(self, *, credential: str) -> bool:
        """Send a revocation notice; True when the target took it (2xx)."""
        portal_db.forbid_transaction("the gateway notifies the remote system")
        try:
            with self._client() as client:
                response, _ = _exchange(
                    client,
                    "POST",
                    self._url(REVOCATION_PATH),
                    headers={"Authorization": f"Bearer {credential}"},
                )
        except (OutboundRefused, httpx.HTTPError):
            return False
        return 200 <= response.status_code < 300


def _exchange(
    client: httpx.Client, method: str, url: str, **request: Any
) -> tuple[httpx.Response, bytes | None]:
    """Send, and read the answer's body up to ``MAX_RESPONSE_BYTES``: ``None`` when
    it is longer (the rest is never read, nor held)."""
    with client.stream(method, url, **request) as response:
        content = bytearray()
        for chunk in response.iter_bytes():
            content += chunk
            if len(content) > MAX_RESPONSE_BYTES:
                return response, None
    return response, bytes(content)


def _certificate_refused(error: httpx.HTTPError) -> bool:
    """Whether the connection failed because the target's certificate did not
    verify: the handshake ended before any byte of the request was sent."""
    if not isinstance(error, httpx.ConnectError):
        return False
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _json_object(content: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(content)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _retry_after(header: str | None) -> float | None:
    try:
        return min(max(float(header or ""), 0.0), 3600.0)
    except ValueError:
        return None


def connector_for(config: Connector) -> RemoteSystem:
    """The connector implementation for a configured target."""
    return HttpJsonConnector(config)
