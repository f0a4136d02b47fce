"""The real values of an unfinished operation, sealed until its call is over.

The stored ``input`` and ``call_fields`` of an operation are redacted
(``audit.redaction.redact``), yet the remote system must receive the real values,
on the first call and on every retry under the same key (recovery, a queued run, a
person's approval). Those real values live in one column, ``sealed``: AES-256-GCM
under a per-tenant key derived from the server secret (``tenant_key(purpose=
"seal")``, never in the database), bound to the tenant and the operation by the
associated data, so a sealed value copied onto another row does not open.

The column is emptied when the operation is settled (``verified``, ``failed``,
``conflict``: no call can follow) in the same statement that settles it, and a
CHECK constraint (``tasks_operation_sealed_open_only_check``) refuses a settled
operation that still holds one. Whoever reads the database without the server
secret sees ciphertext; nobody sees the values after the operation is settled.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from typing import Any, Final

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from audit.redaction import tenant_key

_VERSION: Final = "v1"
_NONCE_BYTES: Final = 12
SETTLED_STATES: Final = ("verified", "failed", "conflict")


def _aad(tenant_id: uuid.UUID | str, operation_id: uuid.UUID | str) -> bytes:
    return f"tasks.operation:{tenant_id}:{operation_id}".encode()


def seal(
    *, tenant_id: uuid.UUID | str, operation_id: uuid.UUID | str, values: Any
) -> str:
    """``values`` (JSON) encrypted for this tenant and operation, as text."""
    nonce = os.urandom(_NONCE_BYTES)
    box = AESGCM(tenant_key(tenant_id, purpose="seal"))
    plaintext = json.dumps(values, separators=(",", ":")).encode()
    ciphertext = box.encrypt(nonce, plaintext, _aad(tenant_id, operation_id))
    return f"{_VERSION}:" + base64.b64encode(nonce + ciphertext).decode()


def unseal(
    *, tenant_id: uuid.UUID | str, operation_id: uuid.UUID | str, sealed: str
) -> Any:
    """The values ``seal`` sealed for this tenant and operation.

    Raises:
        cryptography.exceptions.InvalidTag: another tenant's or operation's value,
            a changed one, or another server secret.
    """
    version, _, encoded = sealed.partition(":")
    if version != _VERSION:
        raise ValueError(f"unknown sealed format {version!r}")
    raw = base64.b64decode(encoded)
    box = AESGCM(tenant_key(tenant_id, purpose="seal"))
    plaintext = box.decrypt(
        raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _aad(tenant_id, operation_id)
    )
    return json.loads(plaintext)


def operation_values(operation: Any) -> tuple[Any, dict[str, Any] | None]:
    """The real (input, call fields) of an operation, for its call.

    From the sealed column; a row written before sealing existed has its real
    values in ``input`` and ``call_fields`` still.
    """
    if not operation.sealed:
        return operation.input, operation.call_fields
    values = unseal(
        tenant_id=operation.tenant_id,
        operation_id=operation.pk,
        sealed=operation.sealed,
    )
    return values.get("input"), values.get("call_fields")
