"""A reviewer downloads a task's evidence bundle from its page in Chromium, and the
offline verifier, in its own process, accepts the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from audit import checkpoints
from audit import services as audit_services
from audit.models import EventCode
from portal import services as portal_services
from portal.actors import Actor
from portal.models import Role
from tests.browser.conftest import log_in
from tests.support.evidence import run_verifier

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "pw-evidence-browser-1"


def test_a_reviewer_downloads_a_bundle_that_verifies(
    page, live_server, tenant, make_task, tmp_path: Path
):
    task = make_task()
    with transaction.atomic():
        for n in range(3):
            audit_services.event_append(
                tenant_id=tenant.pk,
                task_id=task.pk,
                code=EventCode.TASK_TRANSITIONED,
                actor=Actor.system("browser-test"),
                data={"n": n, "note": "ünïcode ✓"},
            )
    reviewer = User.objects.create_user("rita", password=PASSWORD, is_staff=True)
    portal_services.membership_grant(tenant=tenant, user=reviewer, role=Role.REVIEWER)
    log_in(page, live_server, "rita", PASSWORD)
    page.goto(f"{live_server.url}/admin/tasks/task/{task.pk}/change/")
    with page.expect_download() as download_info:
        page.click("#export-evidence")
    download = download_info.value
    assert download.suggested_filename == f"evidence-task-{task.pk}.json"
    bundle = tmp_path / download.suggested_filename
    download.save_as(bundle)
    key = tmp_path / "key.pem"
    key.write_text(checkpoints.public_key_pem(checkpoints.signing_key().public))
    done = run_verifier(bundle, key)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"intact: task {task.pk}")
    assert "3 events" in done.stdout
