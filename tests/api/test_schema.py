"""The OpenAPI document: valid, complete, and honoured by the live server both ways.

Schemathesis (its CLI, as a subprocess) generates requests from the live schema and
sends them to a real HTTP server on 127.0.0.1 (pytest-django's live server, on the
test database): every check (``--checks all``), every phase (examples, coverage,
fuzzing, stateful), valid and invalid data (``--mode all``). A request the schema
calls valid must not be refused with 400/422, one it calls invalid must not be
accepted, and no answer may be a 5xx or stray from its documented status, type,
headers or body. NUL characters are generated too, in strings and object keys: the
schema (OpenAPI 3.1) states their refusal with ``pattern`` and ``propertyNames``.
Deterministic generation, so a run repeats exactly.
``PORTAL_SCHEMATHESIS_EXAMPLES`` sets the fuzzing examples per operation (15 in CI),
``PORTAL_SCHEMATHESIS_TIMEOUT_S`` the time allowed.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from portal import services as portal_services
from portal.models import Role

EXAMPLES = int(os.environ.get("PORTAL_SCHEMATHESIS_EXAMPLES", "15"))
# 15 minutes at CI size (about 3.5 on an idle 2-core machine, 9 at load 30, over
# 15 at load 45); a bigger run gets time in proportion, or what
# PORTAL_SCHEMATHESIS_TIMEOUT_S says.
TIMEOUT_S = int(
    os.environ.get("PORTAL_SCHEMATHESIS_TIMEOUT_S", 900 * max(1, EXAMPLES // 15))
)
REPO = Path(__file__).resolve().parents[2]
# Tool settings the command line has no flag for. Error feedback is a generation
# heuristic that reads 4xx bodies to learn hidden rules; this schema states its
# rules, and the heuristic reads the problem body's `errors` member as a request
# member, making "valid" requests with an `errors` field the schema forbids.
SCHEMATHESIS_CONFIG = """
[phases.fuzzing.error-feedback]
enabled = false

# Credentials by security scheme, so the auth checks know what to leave out.
[auth.openapi.agentKey]
bearer = "${PORTAL_SCHEMATHESIS_AGENT_KEY}"

[auth.openapi.cookieAuth]
api_key = "${PORTAL_SCHEMATHESIS_SESSION}"
"""


def test_the_schema_validates_without_warnings(tmp_path: Path):
    target = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    document = yaml.safe_load(target.read_text())
    operations = [
        (path, method, spec)
        for path, item in document["paths"].items()
        for method, spec in item.items()
    ]
    assert len(operations) >= 15
    for path, method, spec in operations:
        # Every operation documents the problem answers an agent must handle.
        assert {"400", "401", "429"} <= set(spec["responses"]), (method, path)
        problem = spec["responses"]["401"]["content"]
        assert list(problem) == ["application/problem+json"], (method, path)
        # Agents use their key; the takeover and approvals endpoints are for people
        # (session); a task's evidence bundle is for both.
        for_people = any(
            part in path for part in ("/takeover/", "/tenants/", "/approvals")
        )
        scheme = "cookieAuth" if for_people else "agentKey"
        if path.endswith("/evidence"):
            assert spec["security"] == [{"agentKey": []}, {"cookieAuth": []}]
        else:
            assert spec["security"] == [{scheme: []}], (method, path)
        if "{" in path and method != "put":  # PUT object-versions is an upsert
            assert "404" in spec["responses"], (method, path)


@pytest.mark.django_db
def test_docs_pages_are_served(client):
    assert client.get("/api/schema/").status_code == 200
    assert client.get("/api/docs/").status_code == 200
    assert client.get("/api/redoc/").status_code == 200


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.django_db(transaction=True)
def test_the_live_server_honours_its_schema(
    live_server, make_agent, tenant, tmp_path: Path, settings
):
    # Its auth checks send bad keys from 127.0.0.1 by design: no address block.
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {
            **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"],
            "auth_failure": "1000000/min",
        },
    }
    # Given an agent's key, and a tenant administrator's session for the staff
    # endpoints (takeover, contracts) with its CSRF token
    agent = make_agent(tenant=tenant)
    secret = portal_services.agent_key_issue(agent=agent).secret
    staff = User.objects.create_user("schema-staff", password=secrets.token_hex(16))
    portal_services.membership_grant(tenant=tenant, user=staff, role=Role.ADMIN)
    browser = Client()
    browser.force_login(staff)
    session = browser.cookies[settings.SESSION_COOKIE_NAME].value
    csrf = secrets.token_hex(16)  # 32 characters: an unmasked CSRF secret
    config = tmp_path / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG)
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(config),
        "run", f"{live_server.url}/api/schema/?format=json",
        "--checks", "all", "--mode", "all",
        "--phases", "examples,coverage,fuzzing,stateful",
        "--max-examples", str(EXAMPLES), "--generation-deterministic",
        "--workers", "1", "--no-color",
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks",
        "PORTAL_SCHEMATHESIS_AGENT_KEY": secret,
        "PORTAL_SCHEMATHESIS_SESSION": session,
        "PORTAL_SCHEMATHESIS_CSRF": csrf,
    }

    # When schemathesis runs every check in every phase against it
    started = time.monotonic()
    run = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=TIMEOUT_S,
    )
    elapsed = time.monotonic() - started

    # Then nothing fails, every operation was tested, and every phase ran
    output = run.stdout + run.stderr
    (tmp_path / "schemathesis.txt").write_text(output)  # whole report, for a person
    assert run.returncode == 0, output[-30000:]
    tested = re.search(r"Tested: (\d+)", output)
    assert tested and int(tested.group(1)) >= 26, output[-5000:]
    for phase in ("Examples", "Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in output, output[-5000:]
    print(f"schemathesis: {elapsed:.0f} s\n" + output[output.find("SUMMARY") :])
