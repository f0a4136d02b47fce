"""``manage.py seed_demo``: the example agent's world, and safe to run again."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from portal.management.commands.seed_demo import seed as seed_function
from portal.models import AgentGrant, AgentKey, Tenant
from portal.selectors import agent_key_authenticate
from tasks import services as task_services
from tasks.models import Connector, Contract

pytestmark = pytest.mark.django_db

K1 = "first-desk-signing-key-of-32-bytes-or-more"
K2 = "second-desk-signing-key-of-32-bytes-or-more"


def seed(*args: str) -> str:
    out = io.StringIO()
    call_command("seed_demo", *args, stdout=out)
    return out.getvalue()


def test_seed_demo_makes_the_customer_issue_world_once_and_repoints_the_desk() -> None:
    # When: it runs twice, the desk having moved in between.
    first = seed("--ticketdesk-url", "http://127.0.0.1:8101", "--ticketdesk-key", K1)
    second = seed("--ticketdesk-url", "http://127.0.0.1:8102", "--ticketdesk-key", K2)

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
    # ... one connector, pointing at the latest desk ...
    [connector] = Connector.objects.filter(tenant=tenant, target="ticket-desk")
    assert (connector.base_url, connector.signing_key) == (
        "http://127.0.0.1:8102",
        K2,
    )
    assert "updated connector 'ticket-desk' -> http://127.0.0.1:8102" in second
    # ... one grant for the demo agent, and a new key per run, the old one revoked.
    grants = AgentGrant.objects.filter(tenant=tenant, agent__name="demo-agent")
    assert list(grants.values_list("action", "target")) == [
        ("create_ticket", "ticket-desk")
    ]
    keys = AgentKey.objects.filter(tenant=tenant, agent__name="demo-agent")
    assert keys.count() == 2
    assert keys.filter(revoked_at__isnull=True).count() == 1
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
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PORTAL_TICKETDESK_PORT", "8123")

    seed()

    connector = Connector.objects.get(tenant__slug="demo", target="ticket-desk")
    assert connector.base_url == "http://127.0.0.1:8123"
    assert connector.signing_key == "ticketdesk-demo-signing-key-development-only"
