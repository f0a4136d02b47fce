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

A connector's private signing key is sealed the same way (``connector_key_seal``),
bound to the tenant and the connector; its associated data names another kind of
value, so neither kind opens as the other.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import uuid
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from audit.redaction import tenant_key

from .exceptions import ConnectorKeyUnsealable, SealedValuesUnsealable

logger = logging.getLogger(__name__)

_VERSION: Final = "v1"
_NONCE_BYTES: Final = 12
SETTLED_STATES: Final = ("verified", "failed", "conflict")


def _seal_bytes(*, tenant_id: uuid.UUID | str, aad: bytes, plaintext: bytes) -> str:
    nonce = os.urandom(_NONCE_BYTES)
    box = AESGCM(tenant_key(tenant_id, purpose="seal"))
    return (
        f"{_VERSION}:"
        + base64.b64encode(nonce + box.encrypt(nonce, plaintext, aad)).decode()
    )


def _unseal_bytes(*, tenant_id: uuid.UUID | str, aad: bytes, sealed: str) -> bytes:
    version, _, encoded = sealed.partition(":")
    if version != _VERSION:
        raise ValueError(f"unknown sealed format {version!r}")
    raw = base64.b64decode(encoded)
    box = AESGCM(tenant_key(tenant_id, purpose="seal"))
    return box.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], aad)


def _operation_aad(tenant_id: uuid.UUID | str, operation_id: uuid.UUID | str) -> bytes:
    return f"tasks.operation:{tenant_id}:{operation_id}".encode()


def _connector_aad(tenant_id: uuid.UUID | str, connector_id: uuid.UUID | str) -> bytes:
    return f"tasks.connector.signing_key:{tenant_id}:{connector_id}".encode()


def seal(
    *, tenant_id: uuid.UUID | str, operation_id: uuid.UUID | str, values: Any
) -> str:
    """``values`` (JSON) encrypted for this tenant and operation, as text."""
    return _seal_bytes(
        tenant_id=tenant_id,
        aad=_operation_aad(tenant_id, operation_id),
        plaintext=json.dumps(values, separators=(",", ":")).encode(),
    )


def unseal(
    *, tenant_id: uuid.UUID | str, operation_id: uuid.UUID | str, sealed: str
) -> Any:
    """The values ``seal`` sealed for this tenant and operation.

    Raises:
        SealedValuesUnsealable: another tenant's or operation's value, a changed
            one, or another server secret.
    """
    try:
        opened = _unseal_bytes(
            tenant_id=tenant_id,
            aad=_operation_aad(tenant_id, operation_id),
            sealed=sealed,
        )
    except (InvalidTag, ValueError, binascii.Error):
        raise SealedValuesUnsealable(
            tenant_id=str(tenant_id), operation_id=str(operation_id)
        ) from None
    return json.loads(opened)


def connector_key_seal(
    *, tenant_id: uuid.UUID | str, connector_id: uuid.UUID | str, private_key: bytes
) -> str:
    """A connector's raw private signing key, sealed for this tenant and connector.

    The result is ``v1:`` and 80 base64 characters (nonce, 32 encrypted bytes, tag):
    the shape ``tasks_connector_sealed_private_key_check`` demands.
    """
    return _seal_bytes(
        tenant_id=tenant_id,
        aad=_connector_aad(tenant_id, connector_id),
        plaintext=private_key,
    )


def connector_key_unseal(
    *, tenant_id: uuid.UUID | str, connector_id: uuid.UUID | str, sealed: str
) -> bytes:
    """The raw private key ``connector_key_seal`` sealed for this connector.

    Raises:
        ConnectorKeyUnsealable: another connector's or tenant's value (a sealed key
            copied onto another row), a changed one, or another server secret.
    """
    try:
        return _unseal_bytes(
            tenant_id=tenant_id,
            aad=_connector_aad(tenant_id, connector_id),
            sealed=sealed,
        )
    except (InvalidTag, ValueError, binascii.Error):
        raise ConnectorKeyUnsealable(
            tenant_id=str(tenant_id), connector_id=str(connector_id)
        ) from None


# What this process could not unseal and has said so: logged once per connector
# (or operation) per process, as the settle job meets it every 10 s.
_unsealable_reported: set[tuple[str, str]] = set()


def unsealable_log(error: ConnectorKeyUnsealable | SealedValuesUnsealable) -> None:
    """Log ``error`` once per connector (a key) or operation (its values) in this
    process, without a traceback: the cause is configuration, and the message
    says what to do."""
    if isinstance(error, ConnectorKeyUnsealable):
        what, subject = "connector", str(error.context.get("connector_id"))
        then = "operations in doubt go to a person after the recovery budget."
    else:
        what, subject = "operation", str(error.context.get("operation_id"))
        then = "the operation is not run while the secret differs."
    if (what, subject) in _unsealable_reported:
        return
    _unsealable_reported.add((what, subject))
    logger.error(
        "%s: %s %s of tenant %s: %s Nothing is sent with it; %s",
        error.code,
        what,
        subject,
        error.context.get("tenant_id"),
        error.detail,
        then,
    )


def operation_given_fields(operation: Any) -> list[dict[str, Any]]:
    """The fields (value, source, read time) given at the operation's last refused
    execute, sealed beside its input by ``keep_given_fields``; [] when none were
    kept (a refusal before this existed, or none yet). The desk keeps the ones that
    still pass and asks a person only for the others."""
    if not operation.sealed:
        return []
    values = unseal(
        tenant_id=operation.tenant_id,
        operation_id=operation.pk,
        sealed=operation.sealed,
    )
    given = values.get("given_fields")
    return list(given) if isinstance(given, list) else []


def keep_given_fields(operation: Any, fields: Any) -> None:
    """Seal ``fields`` (``FieldValue``-like) beside the operation's real values and
    write the column; the caller holds the operation's row lock. Emptied with the
    rest when the operation settles."""
    real_input, call_fields = operation_values(operation)
    operation.sealed = seal(
        tenant_id=operation.tenant_id,
        operation_id=operation.pk,
        values={
            "input": real_input,
            "call_fields": call_fields,
            "given_fields": [
                {
                    "name": field.name,
                    "value": field.value,
                    "source": field.source,
                    "observed_at": field.observed_at.isoformat(),
                }
                for field in fields
            ],
        },
    )
    type(operation).objects.filter(
        tenant_id=operation.tenant_id, pk=operation.pk
    ).update(sealed=operation.sealed)


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
