"""Errors of the audit trail."""

from __future__ import annotations

from portal import db as portal_db
from portal.exceptions import PortalError, ValidationFailed


class AuditTrailImmutable(PortalError):
    """Audit events are append-only: they cannot be changed or deleted."""

    code = "AUDIT_IMMUTABLE"
    status = 409


class EventPayloadTooLarge(PortalError):
    """The event payload is over the size bound."""

    code = "EVENT_PAYLOAD_TOO_LARGE"
    status = 413


portal_db.register_constraint_errors(
    {
        "audit_event_append_only_trg": AuditTrailImmutable,
        "audit_retention_append_only_trg": AuditTrailImmutable,
        "audit_event_payload_size_check": EventPayloadTooLarge,
    }
)


class SigningKeyMissing(PortalError):
    """No audit signing key is configured.

    If you're hitting this in production: set ``PORTAL_AUDIT_SIGNING_KEY_FILE`` to a
    PEM file with an Ed25519 private key (or ``PORTAL_AUDIT_SIGNING_KEY`` to its PEM
    text); docs/audit-integrity.md shows how to make one. Only development and tests
    generate a key under var/ by themselves.
    """

    code = "AUDIT_SIGNING_KEY_MISSING"
    status = 503


class SigningKeyInWeb(PortalError):
    """The web server's process asked for the audit signing key.

    If you're hitting this: a code path in the web (a view, a middleware) tried to
    sign. The web never holds the private key (docs/audit-integrity.md, "The
    signing key"); send the work to a Celery worker instead, as the evidence export
    does (``audit.evidence``, ``audit.jobs.checkpoint_tenant_job``), and read the
    public half with ``public_key()``.
    """

    code = "AUDIT_SIGNING_KEY_NOT_HERE"
    status = 500


class PublicKeyMissing(PortalError):
    """The audit public key is not available yet.

    In production set ``PORTAL_AUDIT_PUBLIC_KEY_FILE`` (``openssl pkey -in
    audit-signing-key.pem -pubout``). In development the signer writes it under var/
    when it first loads its key: start the Celery worker or run ``manage.py
    checkpoint_audit``.
    """

    code = "AUDIT_PUBLIC_KEY_MISSING"
    status = 503


class PublicKeyMismatch(PortalError):
    """The configured public key is not the signing key's public half.

    If you're hitting this: ``PORTAL_AUDIT_PUBLIC_KEY_FILE`` (what the web
    publishes) and the signing key (the worker's) are from different pairs; make
    the public file again from the signing key with ``openssl pkey -in
    audit-signing-key.pem -pubout``. Nothing is signed until they agree.
    """

    code = "AUDIT_PUBLIC_KEY_MISMATCH"
    status = 500


class OutboxRowNotDead(PortalError):
    """Only a dead outbox row can be retried or dismissed; this one is not dead."""

    code = "OUTBOX_ROW_NOT_DEAD"
    status = 409


class SensitiveValue(ValidationFailed):
    """This value looks like a secret or personal data; use an opaque identifier."""

    code = "SENSITIVE_VALUE"
    status = 422


class PublishFailed(PortalError):
    """The broker did not confirm the message; the row will be retried."""

    code = "PUBLISH_FAILED"
    status = 503
    retryable = True

    def __init__(self, detail: str, *, connection_lost: bool) -> None:
        super().__init__(detail)
        # True: the broker link is down or in doubt, so the rest of the batch waits.
        self.connection_lost = connection_lost
