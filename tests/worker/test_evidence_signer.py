"""The web server exports evidence without the signing key: a real Celery worker,
which alone holds the key, signs the checkpoint the bundle needs.

This test process plays the web (marked as ``config/wsgi.py`` marks gunicorn's
workers) and answers the export through the real API view; the worker is a real
``celery worker`` process on RabbitMQ with the test database and a key file the
test process is never given.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import transaction
from rest_framework.test import APIClient

from audit import checkpoints
from audit import services as audit_services
from audit.exceptions import SigningKeyInWeb
from audit.models import Checkpoint, EventCode
from portal import process
from portal import services as portal_services
from portal.actors import Actor
from portal.models import Agent
from tasks.models import Task
from tests.support.celery_worker import celery_worker_running
from tests.support.evidence import TOOL, run_verifier
from tests.support.tsa import Tsa, running_tsa
from tests.support.witness import RunningWitness, running_witness

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
    with pytest.raises(SigningKeyInWeb):
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


@pytest.fixture
def witness_and_tsa(
    tmp_path: Path, key_pair: tuple[Path, Path], settings: pytest.FixtureRequest
) -> Iterator[tuple[RunningWitness, Tsa]]:
    """A real witness process trusting the worker's key, and a real TSA; both
    configured for this process (the web) as for the worker (``worker_env``)."""
    with (
        running_tsa() as tsa,
        running_witness(tmp_path / "w1", log_key=key_pair[1]) as w1,
    ):
        settings.PORTAL_AUDIT_WITNESSES = [w1.entry]  # type: ignore[attr-defined]
        settings.PORTAL_AUDIT_TSA_URL = tsa.url  # type: ignore[attr-defined]
        yield w1, tsa


def _stamping_worker_env(
    amqp_url: str,
    events_exchange: str,
    queue: str,
    key_pair: tuple[Path, Path],
    w1: RunningWitness,
    tsa: Tsa,
) -> dict[str, str]:
    return subprocess_env(
        amqp_url=amqp_url,
        exchange=events_exchange,
        CELERY_BROKER_URL=amqp_url,
        PORTAL_CELERY_QUEUE=queue,
        PORTAL_AUDIT_SIGNING_KEY_FILE=str(key_pair[0]),
        PORTAL_AUDIT_PUBLIC_KEY_FILE=str(key_pair[1]),
        PORTAL_AUDIT_WITNESSES=w1.entry,
        PORTAL_AUDIT_TSA_URL=tsa.url,
    )


def _verify_stamped(
    bundle_file: Path, public_file: Path, w1: RunningWitness, tsa: Tsa
) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-I", str(TOOL), str(bundle_file)]
    args += ["--public-key", str(public_file), "--witness-key", w1.vkey]
    args += ["--tsa-root", str(tsa.root_file)]
    return subprocess.run(
        args, cwd="/", capture_output=True, text=True, timeout=60, check=False
    )


def test_a_fresh_web_export_waits_for_the_heads_cosignature_and_token(
    make_task: Callable[..., Task],
    agent: Agent,
    key_pair: tuple[Path, Path],
    witness_and_tsa: tuple[RunningWitness, Tsa],
    as_web: None,
    amqp_url: str,
    events_exchange: str,
    celery_test_queue: str,
    tmp_path: Path,
) -> None:
    """Issue 19: the web read the head the worker had just committed, before the
    worker stored its stamps, and the bundle was 'not witnessed'."""
    # given a witness and a TSA that answers in 1.5 s (a remote one's latency),
    # configured for the web and for the worker, and a task no head covers
    w1, tsa = witness_and_tsa
    tsa.delay_s = 1.5
    task = _task_with_events(make_task, 3)
    env = _stamping_worker_env(
        amqp_url, events_exchange, celery_test_queue, key_pair, w1, tsa
    )
    http = _agent_client(agent)
    with celery_worker_running(queue=celery_test_queue, env=env):
        # when its agent exports the evidence through the web, right away
        started = time.monotonic()
        response = http.get(f"/api/v1/tasks/{task.pk}/evidence")
        waited = time.monotonic() - started

    # then the export waited for the head's cosignature and token, the bundle
    # says so, and the offline tool finds both
    assert response.status_code == 200, response.content
    (tmp_path / "bundle.json").write_bytes(response.content)
    verified = _verify_stamped(tmp_path / "bundle.json", key_pair[1], w1, tsa)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"witnessed: the tree head is cosigned by {w1.name}" in verified.stdout
    assert "timestamped: an RFC 3161 token over the tree head verifies" in (
        verified.stdout
    )
    # (log.stamps describes; the tool checks the stamps themselves and says so)
    assert "log.stamps" in verified.stdout.splitlines()[-1], verified.stdout
    log = response.json()["log"]
    assert len(log["rfc3161"]) == 1
    assert log["stamps"]["complete"], log["stamps"]
    assert log["stamps"]["missing"] == []
    assert 1.5 <= waited < 10, waited
    print(f"\nexport waited {waited:.2f} s for the head and its stamps")


def test_a_web_export_whose_stamps_do_not_come_says_so_within_its_bound(
    make_task: Callable[..., Task],
    agent: Agent,
    key_pair: tuple[Path, Path],
    witness_and_tsa: tuple[RunningWitness, Tsa],
    as_web: None,
    amqp_url: str,
    events_exchange: str,
    celery_test_queue: str,
    settings: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    # given a configured witness that is down (its process stopped) and a TSA
    # that answers, a wait of 3 s, and a task no head covers
    w1, tsa = witness_and_tsa
    w1.stop()
    settings.PORTAL_EVIDENCE_SIGN_WAIT_S = 3.0  # type: ignore[attr-defined]
    task = _task_with_events(make_task, 2)
    env = _stamping_worker_env(
        amqp_url, events_exchange, celery_test_queue, key_pair, w1, tsa
    )
    with celery_worker_running(queue=celery_test_queue, env=env):
        # when its agent exports the evidence through the web
        started = time.monotonic()
        response = _agent_client(agent).get(f"/api/v1/tasks/{task.pk}/evidence")
        waited = time.monotonic() - started

    # then the export waited its bound, not more, and the bundle names the
    # missing cosignature and what the tool will say; the token is there
    assert response.status_code == 200, response.content
    bundle = response.json()
    assert bundle["coverage"]["complete"]
    stamps = bundle["log"]["stamps"]
    assert not stamps["complete"], stamps
    assert stamps["missing"] == [f"cosignature of witness {w1.name}"]
    assert "'not witnessed'" in stamps["note"]
    assert "Export it again" in stamps["note"]
    assert len(bundle["log"]["rfc3161"]) == 1
    assert 3.0 <= waited < 8, waited
    (tmp_path / "bundle.json").write_bytes(response.content)
    verified = _verify_stamped(tmp_path / "bundle.json", key_pair[1], w1, tsa)
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert verified.stdout.startswith("FAILED not witnessed"), verified.stdout
