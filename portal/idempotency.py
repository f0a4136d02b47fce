"""The ``Idempotency-Key`` request header (IETF httpapi draft), stored per agent.

Three answers for a POST that carries the header:

- first time (or the stored record expired): run it, store the answer;
- same key, same fingerprint, finished: replay the stored status and body;
- same key, another fingerprint: refuse (422); same key still running: refuse (409).

A 400 answer (the request is malformed or invalid: nothing ran) and a 5xx are not
stored: the key is freed, so the corrected request, sent again under the same key,
runs as a first delivery. The IETF draft asks clients to correct a failed request
before retrying it and the server to answer a retry "with the result of the
previously completed operation"; a refused request completed no operation, so
there is nothing to replay (docs/api.md, "Two kinds of idempotency").

Each function is one autocommit statement, deliberately outside the business
transaction: the in-flight marker must be visible to a concurrent duplicate at once,
and the stored answer must survive whatever the handler's transaction did.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Final

from django.conf import settings
from django.db import connection

from . import scope
from .exceptions import (
    IdempotencyKeyMismatch,
    IdempotentRequestInFlight,
    ValidationFailed,
)
from .ids import new_id
from .models import Agent

MAX_KEY_LENGTH: Final = 255


@dataclass(frozen=True, kw_only=True)
class StoredResponse:
    status: int
    body: bytes
    content_type: str


class IdempotentReplay(Exception):
    """Raised to answer a request with the stored response of its first delivery."""

    def __init__(self, response: StoredResponse) -> None:
        self.response = response
        super().__init__("replay")


def request_fingerprint(
    *, method: str, path: str, body: bytes, lease_token: str = ""
) -> str:
    """What makes two requests "the same": method, path with query, exact body, and
    the Lease-Token header (a write under another token is another request)."""
    digest = hashlib.sha256()
    for part in (method.upper().encode(), path.encode(), body, lease_token.encode()):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def validate_key(key: str) -> str:
    """Raises ValidationFailed unless the key is 1..255 visible ASCII characters."""
    if not 0 < len(key) <= MAX_KEY_LENGTH or not all(
        "!" <= char <= "~" for char in key
    ):
        raise ValidationFailed(
            f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} visible ASCII characters.",
            field="Idempotency-Key",
        )
    return key


def stored_key(key: str) -> str:
    """What the ``key`` column holds for a header value: its SHA-256, hex."""
    return hashlib.sha256(key.encode()).hexdigest()


_BEGIN = """
INSERT INTO portal_idempotentrequest AS r (
    id, tenant_id, agent_id, key, fingerprint, state, response_body,
    response_content_type, locked_until, expires_at
) VALUES (
    %(id)s, %(tenant_id)s, %(agent_id)s, %(key)s, %(fingerprint)s, 'in_flight', '', '',
    app_now() + make_interval(secs => %(lock)s),
    app_now() + make_interval(secs => %(window)s)
)
ON CONFLICT (tenant_id, agent_id, key) DO UPDATE SET
    id = EXCLUDED.id, fingerprint = EXCLUDED.fingerprint, state = 'in_flight',
    response_status = NULL, response_body = '', response_content_type = '',
    created_at = statement_timestamp(), locked_until = EXCLUDED.locked_until,
    expires_at = EXCLUDED.expires_at
WHERE r.expires_at <= app_now()
   OR (r.state = 'in_flight' AND r.locked_until <= app_now()
       AND r.fingerprint = EXCLUDED.fingerprint)
RETURNING r.id
"""

_LOOKUP = """
SELECT fingerprint, state, response_status, response_body, response_content_type
FROM portal_idempotentrequest
WHERE tenant_id = %s AND agent_id = %s AND key = %s
"""


def idempotent_request_begin(*, agent: Agent, key: str, fingerprint: str) -> uuid.UUID:
    """Claim the key for this request, or say why not.

    A record whose holder died (still in flight after ``locked_until``) is taken over
    by a request with the same fingerprint. The key is stored as its SHA-256 (the
    header is the agent's text: it must not become a column anyone reads), and the
    errors do not echo it.

    Raises:
        IdempotentReplay: the same request finished before; carries its answer.
        IdempotencyKeyMismatch: the key belongs to a different request.
        IdempotentRequestInFlight: the first delivery is still running.
    """
    key = stored_key(key)
    with connection.cursor() as cursor:
        cursor.execute(
            _BEGIN,
            {
                "id": new_id(),
                "tenant_id": agent.tenant_id,
                "agent_id": agent.pk,
                "key": key,
                "fingerprint": fingerprint,
                "lock": settings.PORTAL_IDEMPOTENCY_LOCK_S,
                "window": settings.PORTAL_IDEMPOTENCY_WINDOW_S,
            },
        )
        claimed = cursor.fetchone()
        if claimed is not None:
            return uuid.UUID(str(claimed[0]))
        cursor.execute(_LOOKUP, [agent.tenant_id, agent.pk, key])
        row = cursor.fetchone()
    if row is None:  # expired and purged between the two statements: rare; retry
        raise IdempotentRequestInFlight()
    stored_fingerprint, state, status, body, content_type = row
    if stored_fingerprint != fingerprint:
        raise IdempotencyKeyMismatch()
    if state != "completed":
        raise IdempotentRequestInFlight()
    raise IdempotentReplay(
        StoredResponse(status=status, body=body.encode(), content_type=content_type)
    )


def idempotent_request_finish(
    *, record_id: uuid.UUID, status: int, body: bytes, content_type: str
) -> None:
    """Store the answer; a 400 or a server error frees the key instead, so a retry
    (corrected, for a 400) runs afresh."""
    if status >= 500 or status == 400:
        idempotent_request_release(record_id=record_id)
        return
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE portal_idempotentrequest
            SET state = 'completed', response_status = %s, response_body = %s,
                response_content_type = %s
            WHERE id = %s
            """,
            [status, body.decode(), content_type, record_id],
        )


def idempotent_request_release(*, record_id: uuid.UUID) -> None:
    """Free the key without storing an answer: a retry of the request runs again.

    For answers that must not be replayed: a server error, or a refusal that says
    "the same thing is under way, retry" (the retry must get the real answer).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM portal_idempotentrequest WHERE id = %s", [record_id]
        )


@scope.in_tenants_with("portal_tenants_with_expired_idempotency")
def idempotent_requests_purge_expired() -> int:
    """Delete records past their window; returns how many went."""
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM portal_idempotentrequest WHERE expires_at <= app_now()"
        )
        return cursor.rowcount
