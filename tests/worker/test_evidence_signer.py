"""The web server exports evidence without the signing key: a real Celery worker,
which alone holds the key, signs the checkpoint the bundle needs.

This test process plays the web (marked as ``portal/wsgi.py`` marks gunicorn's
workers) and answers the export through the real API view; the worker is a real
``celery worker`` process on RabbitMQ with the test database and a key file the
test process is never given.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import transaction
from rest_framework.test import APIClient

from audit import checkpoints
from audit import services as audit_services
from audit.models import Checkpoint, EventCode
from portal import process
from portal import services as portal_services
from portal.actors import Actor
from portal.models import Agent
from tasks.models import Task
from tests.support.celery_worker import celery_worker_running
from tests.support.evidence import run_verifier

from .conftest import subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def key_pair(tmp_path: Path, settings: pytest.FixtureRequest) -> tuple[Path, Path]:
    """A signing key file for the worker and its public half, which this process
    (the web) publishes."""
    private = Ed25519PrivateKey.generate()
    key_file = tmp_path / "audit-signing-key.pem"
    key_file.write_bytes(
        private.private_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PrivateFormat.PKCS8,
            encryption_algorithm=serialization.NoEncryption(),
        )
    )
    public_file = tmp_path / "audit-public-key.pem"
    public_file.write_text(checkpoints.public_key_pem(private.public_key()))
    settings.PORTAL_AUDIT_PUBLIC_KEY_FILE = str(public_file)  # type: ignore[attr-defined]
    return key_file, public_file


@pytest.fixture
def as_web(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "_web", True)


def _task_with_events(make_task: Callable[..., Task], events: int) -> Task:
    task = make_task()
    for n in range(events):
        with transaction.atomic():
            audit_services.event_append(
                tenant_id=task.tenant_id,
                task_id=task.pk,
                code=EventCode.TASK_TRANSITIONED,
                actor=Actor.system("signer-test"),
                data={"n": n},
            )
    return task


def _agent_client(agent: Agent) -> APIClient:
    http = APIClient()
    secret = portal_services.agent_key_issue(agent=agent).secret
    http.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return http


def test_the_web_asks_the_worker_to_sign_and_the_bundle_verifies(
    make_task: Callable[..., Task],
    agent: Agent,
    key_pair: tuple[Path, Path],
    as_web: None,
    amqp_url: str,
    events_exchange: str,
    celery_test_queue: str,
    tmp_path: Path,
) -> None:
    # given a task whose events no checkpoint covers, and a worker with the key
    key_file, public_file = key_pair
    task = _task_with_events(make_task, 3)
    assert not Checkpoint.objects.filter(tenant_id=task.tenant_id).exists()
    env = subprocess_env(
        amqp_url=amqp_url,
        exchange=events_exchange,
        CELERY_BROKER_URL=amqp_url,
        PORTAL_CELERY_QUEUE=celery_test_queue,
        PORTAL_AUDIT_SIGNING_KEY_FILE=str(key_file),
        PORTAL_AUDIT_PUBLIC_KEY_FILE=str(public_file),
    )
    http = _agent_client(agent)
    with celery_worker_running(queue=celery_test_queue, env=env) as worker:
        # when the task's agent exports its evidence through this process (the web)
        started = time.monotonic()
        response = http.get(f"/api/v1/tasks/{task.pk}/evidence")
        waited = time.monotonic() - started

    # then the worker signed a checkpoint that covers the chain, and the bundle
    # verifies offline with the published key
    assert response.status_code == 200, response.content
    bundle = response.json()
    assert bundle["coverage"]["complete"], bundle["coverage"]
    assert "checkpoint_tenant_job" in worker.output(), worker.output()[-3000:]
    (tmp_path / "bundle.json").write_text(json.dumps(bundle))
    verified = run_verifier(tmp_path / "bundle.json", public_file)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith("intact"), verified.stdout
    # and this process could not have signed it
    with pytest.raises(checkpoints.SigningKeyInWeb):
        checkpoints.signing_key()
    print(f"\nexport waited {waited:.2f} s for the worker's checkpoint")


def test_without_a_worker_the_web_exports_the_chain_as_not_yet_signed(
    make_task: Callable[..., Task],
    agent: Agent,
    key_pair: tuple[Path, Path],
    as_web: None,
    celery_test_queue: str,
    settings: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    # given a task whose events no checkpoint covers, and no worker listening
    settings.PORTAL_EVIDENCE_SIGN_WAIT_S = 1.0  # type: ignore[attr-defined]
    task = _task_with_events(make_task, 2)

    # when its agent exports the evidence through the web
    started = time.monotonic()
    response = _agent_client(agent).get(f"/api/v1/tasks/{task.pk}/evidence")
    waited = time.monotonic() - started

    # then the export waited its bound, and says honestly that nothing signs the
    # chain yet; the verifier agrees
    assert response.status_code == 200, response.content
    coverage = response.json()["coverage"]
    assert not coverage["complete"]
    assert coverage["unsigned_events"] == 2
    assert "export it again in a minute" in coverage["note"]
    assert 1.0 <= waited < 10, waited
    (tmp_path / "bundle.json").write_bytes(response.content)
    verified = run_verifier(tmp_path / "bundle.json", key_pair[1])
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert "not covered" in verified.stdout, verified.stdout
