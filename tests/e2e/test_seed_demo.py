"""``manage.py seed_demo``: the example agent's world, and safe to run again."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from config.management.commands.seed_demo import seed as seed_function
from launcher.up import use_ticketdesk_port
from portal.models import AgentGrant, AgentKey, Tenant
from portal.selectors import agent_key_authenticate
from tasks import outbound
from tasks import services as task_services
from tasks.credentials import public_jwk
from tasks.models import Connector, Contract

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def var_dir(settings: Any, tmp_path: Path) -> Path:
    """The desk's default JWKS file lands in the test's own folder."""
    settings.VAR_DIR = tmp_path
    return tmp_path


def trusted(path: Path) -> list[dict[str, Any]]:
    keys: list[dict[str, Any]] = json.loads(path.read_text())["keys"]
    return keys


def seed(*args: str) -> str:
    out = io.StringIO()
    call_command("seed_demo", *args, stdout=out)
    return out.getvalue()


def test_seed_demo_makes_the_customer_issue_world_once_and_repoints_the_desk(
    tmp_path: Path, settings: Any
) -> None:
    # Given: both desk addresses named, as the outbound URL policy asks of http.
    settings.PORTAL_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1:8101", "127.0.0.1:8102"]
    # When: it runs twice, the desk having moved in between.
    keys = tmp_path / "desk" / "keys.json"
    first = seed(
        "--ticketdesk-url", "http://127.0.0.1:8101", "--ticketdesk-keys", str(keys)
    )
    second = seed(
        "--ticketdesk-url", "http://127.0.0.1:8102", "--ticketdesk-keys", str(keys)
    )

    # Then: one published contract v1, as the example agent and gateway expect ...
    tenant = Tenant.objects.get(slug="demo")
    [contract] = Contract.objects.filter(tenant=tenant, key="customer-issue")
    assert (contract.version, contract.status) == (1, "published")
    spec = contract.spec
    assert spec["required_fields"] == [
        {"name": "email", "source": "crm", "max_age_s": 300},
        {"name": "plan", "source": "billing", "max_age_s": 3600},
    ]
    assert spec["policy"] == {
        "read_fields": ["email"],
        "write_targets": ["ticket-desk"],
        "credential_ttl_s": 60,
    }
    assert spec["receipt"] == {"required": True, "type": "ticket_id"}
    assert "published contract 'customer-issue' v1" in first
    assert "contract 'customer-issue' exists (v1, published)" in second
    # ... one connector, pointing at the latest desk, its one key pair kept and
    # its public key (only) in the desk's JWKS file, bound to the demo tenant ...
    [connector] = Connector.objects.filter(tenant=tenant, target="ticket-desk")
    assert connector.base_url == "http://127.0.0.1:8102"
    assert "updated connector 'ticket-desk' -> http://127.0.0.1:8102" in second
    assert trusted(keys) == [
        {**public_jwk(connector.public_key), "tenant": str(tenant.pk)}
    ]
    # ... one grant for the demo agent, and a new key per run, the old one revoked.
    grants = AgentGrant.objects.filter(tenant=tenant, agent__name="demo-agent")
    assert list(grants.values_list("action", "target")) == [
        ("create_ticket", "ticket-desk")
    ]
    agent_keys = AgentKey.objects.filter(tenant=tenant, agent__name="demo-agent")
    assert agent_keys.count() == 2
    assert agent_keys.filter(revoked_at__isnull=True).count() == 1
    assert "revoked the previous demo key(s) of 'demo-agent'" in second


def test_up_run_twice_leaves_one_valid_demo_key() -> None:
    """``up`` seeds through ``seed_demo.seed`` on every start (launcher/up.py)."""
    lines: list[str] = []
    first = seed_function(report=lines.append)
    second = seed_function(report=lines.append)

    first_check = agent_key_authenticate(secret=first)
    second_check = agent_key_authenticate(secret=second)
    assert first_check is not None and first_check.status == "revoked"
    assert second_check is not None and second_check.status == "live"
    live = AgentKey.objects.filter(
        tenant__slug="demo", agent__name="demo-agent", revoked_at__isnull=True
    )
    assert list(live) == [second_check.key]
    # The API agrees: the first start's key is refused, the second's works.
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Bearer {first}")
    refused = http.get("/api/v1/tasks")
    assert (refused.status_code, refused.json()["code"]) == (401, "API_KEY_REVOKED")
    http.credentials(HTTP_AUTHORIZATION=f"Bearer {second}")
    assert http.get("/api/v1/tasks").status_code == 200


def test_seed_demo_leaves_an_existing_contract_version_alone() -> None:
    seed()
    tenant = Tenant.objects.get(slug="demo")
    task_services.contract_retire(tenant=tenant, key="customer-issue", version=1)

    output = seed()

    assert Contract.objects.filter(tenant=tenant, key="customer-issue").count() == 1
    assert "contract 'customer-issue' exists (v1, retired)" in output


def test_seed_demo_defaults_to_the_desk_up_runs(
    monkeypatch: pytest.MonkeyPatch, var_dir: Path, settings: Any
) -> None:
    # A process started with the desk on 8123: in development its settings' default
    # allow-list names that desk (read at import, so given here as they read it).
    monkeypatch.setenv("PORTAL_TICKETDESK_PORT", "8123")
    settings.PORTAL_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1:8123"]

    seed()

    connector = Connector.objects.get(tenant__slug="demo", target="ticket-desk")
    assert connector.base_url == "http://127.0.0.1:8123"
    # The public key goes where `up` points the desk: $PORTAL_VAR_DIR.
    [key] = trusted(var_dir / "ticketdesk-keys.json")
    assert key["kid"] == connector.key_id and "d" not in key


def test_up_with_another_desk_port_seeds_a_desk_the_gateway_may_call(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """``up --ticketdesk-port 8124`` in a process whose settings were read with the
    default port: the desk's port becomes this process's and its children's."""
    monkeypatch.setenv("PORTAL_TICKETDESK_PORT", "8100")  # restored afterwards
    monkeypatch.delenv("PORTAL_OUTBOUND_ALLOWED_HOSTS", raising=False)
    settings.DEV_MODE = True
    settings.PORTAL_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1:8100"]

    use_ticketdesk_port(8124)
    seed_function(report=lambda line: None, ticketdesk_url="http://127.0.0.1:8124")

    connector = Connector.objects.get(tenant__slug="demo", target="ticket-desk")
    assert connector.base_url == "http://127.0.0.1:8124"
    assert outbound.allowed_hosts() == {"127.0.0.1:8124"}
    assert os.environ["PORTAL_TICKETDESK_PORT"] == "8124"  # the web/worker children


def test_up_keeps_an_allow_list_the_operator_set(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    monkeypatch.setenv("PORTAL_TICKETDESK_PORT", "8100")
    monkeypatch.setenv("PORTAL_OUTBOUND_ALLOWED_HOSTS", "desk.internal:8443")
    settings.DEV_MODE = True
    settings.PORTAL_OUTBOUND_ALLOWED_HOSTS = ["desk.internal:8443"]

    use_ticketdesk_port(8124)

    assert outbound.allowed_hosts() == {"desk.internal:8443"}
