"""GET /api/v1/audit/public-key publishes the key that verifies audit checkpoints."""

from __future__ import annotations

import uuid

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.db import transaction
from rest_framework.test import APIClient

from audit import checkpoints
from audit import services as audit_services
from audit.models import Checkpoint, EventCode
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


def test_production_without_a_key_answers_503(settings: pytest.FixtureRequest) -> None:
    settings.PRODUCTION = True  # type: ignore[attr-defined]
    settings.PORTAL_AUDIT_SIGNING_KEY = ""  # type: ignore[attr-defined]
    settings.PORTAL_AUDIT_SIGNING_KEY_FILE = ""  # type: ignore[attr-defined]

    response = APIClient().get("/api/v1/audit/public-key")

    assert response.status_code == 503
    assert response.json()["code"] == "AUDIT_SIGNING_KEY_MISSING"
