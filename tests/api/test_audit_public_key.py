"""GET /api/v1/audit/public-key publishes the key that verifies audit checkpoints."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from django.db import transaction
from rest_framework.test import APIClient

from audit import checkpoints
from audit import services as audit_services
from audit.exceptions import PublicKeyMismatch, SigningKeyInWeb
from audit.models import Checkpoint, EventCode
from portal import process
from portal.actors import Actor
from portal.models import Tenant


def test_anyone_gets_the_public_key_and_it_verifies_checkpoints(
    tenant: Tenant,
) -> None:
    # given a checkpoint signed by the configured key
    with transaction.atomic():
        audit_services.event_append(
            tenant_id=tenant.pk,
            task_id=uuid.uuid4(),
            code=EventCode.TASK_TRANSITIONED,
            actor=Actor.system("test"),
            data={"n": 1},
        )
    checkpoints.tenant_checkpoint(tenant_id=tenant.pk, key=checkpoints.signing_key())
    checkpoint = Checkpoint.objects.get(tenant=tenant)

    # when someone without credentials asks for the public key
    response = APIClient().get("/api/v1/audit/public-key")

    # then they get the PEM and key id, and the PEM verifies the checkpoint
    assert response.status_code == 200
    body = response.json()
    assert body["algorithm"] == "Ed25519"
    assert body["key_id"] == checkpoint.key_id
    public = serialization.load_pem_public_key(body["public_key_pem"].encode())
    assert isinstance(public, Ed25519PublicKey)
    assert checkpoints.signature_valid(checkpoint, public_keys={body["key_id"]: public})
    # and nothing private is in the answer
    assert "PRIVATE" not in response.content.decode()


def test_production_without_a_public_key_file_answers_503(
    settings: pytest.FixtureRequest,
) -> None:
    settings.PRODUCTION = True  # type: ignore[attr-defined]
    settings.PORTAL_AUDIT_PUBLIC_KEY_FILE = ""  # type: ignore[attr-defined]

    response = APIClient().get("/api/v1/audit/public-key")

    assert response.status_code == 503
    assert response.json()["code"] == "AUDIT_PUBLIC_KEY_MISSING"


def test_the_web_process_serves_the_public_key_from_its_file_alone(
    settings: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a key pair whose private half this process is not given, and the
    # process marked as the web server (config/wsgi.py does so)
    private = Ed25519PrivateKey.generate()
    public_file = tmp_path / "audit-public-key.pem"
    public_file.write_text(checkpoints.public_key_pem(private.public_key()))
    settings.PRODUCTION = True  # type: ignore[attr-defined]
    settings.PORTAL_AUDIT_PUBLIC_KEY_FILE = str(public_file)  # type: ignore[attr-defined]
    monkeypatch.setattr(process, "_web", True)

    # when someone asks for the public key
    response = APIClient().get("/api/v1/audit/public-key")

    # then it is the file's, and the web could not have loaded a signing key
    assert response.status_code == 200, response.content
    assert response.json()["key_id"] == checkpoints.key_id_of(private.public_key())
    with pytest.raises(SigningKeyInWeb):
        checkpoints.signing_key()


def test_the_signer_refuses_a_public_key_file_of_another_pair(
    settings: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # given a signing key and a published public key of another pair
    signing_file = tmp_path / "audit-signing-key.pem"
    signing_file.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PrivateFormat.PKCS8,
            encryption_algorithm=serialization.NoEncryption(),
        )
    )
    public_file = tmp_path / "audit-public-key.pem"
    other = Ed25519PrivateKey.generate().public_key()
    public_file.write_text(checkpoints.public_key_pem(other))
    settings.PORTAL_AUDIT_SIGNING_KEY_FILE = str(signing_file)  # type: ignore[attr-defined]
    settings.PORTAL_AUDIT_PUBLIC_KEY_FILE = str(public_file)  # type: ignore[attr-defined]

    # when the signer loads its key, then it refuses to sign with it
    with pytest.raises(PublicKeyMismatch):
        checkpoints.signing_key()
