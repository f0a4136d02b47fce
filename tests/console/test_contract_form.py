"""The contract form as a tenant admin meets it (issue 24 §1): help with the schema's
parts and an example, a broken JSON said with its line and column, a schema
problem said with its path; nothing saved on either. Another tenant's admin adds
nothing to this tenant."""

from __future__ import annotations

import json

import pytest

from console.admin.domain import SPEC_EXAMPLE
from tasks.contracts import contract_spec_validate
from tasks.models import Contract

pytestmark = pytest.mark.django_db

ADD = "/admin/tasks/contract/add/"


def post(client, tenant, spec: str):
    return client.post(ADD, {"tenant": str(tenant.pk), "key": "refund", "spec": spec})


def test_the_form_explains_the_spec_with_an_example_that_is_valid(
    tenant, make_person, login
):
    client = login(make_person("ada", tenant=tenant, role="admin"))
    page = client.get(ADD).content.decode()
    assert 'id="spec-example"' in page
    for part in ("required_fields", "max_age_s", "write_targets", "receipt"):
        assert part in page
    contract_spec_validate(SPEC_EXAMPLE)  # the example itself passes
    created = post(client, tenant, json.dumps(SPEC_EXAMPLE))
    assert created.status_code == 302, created.content.decode()[:2000]
    assert Contract.objects.filter(tenant=tenant, key="refund").count() == 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ('{"object_type": "x",\n "policy": }', "not JSON: Expecting value at line 2"),
        (
            json.dumps(
                {
                    **SPEC_EXAMPLE,
                    "policy": {**SPEC_EXAMPLE["policy"], "credential_ttl_s": 0},
                }
            ),
            "/policy/credential_ttl_s: ",
        ),
        (
            json.dumps({k: v for k, v in SPEC_EXAMPLE.items() if k != "receipt"}),
            "/: &#x27;receipt&#x27; is a required property",
        ),
    ],
)
def test_a_bad_spec_is_said_where_and_nothing_is_saved(
    tenant, make_person, login, spec, message
):
    client = login(make_person("ada", tenant=tenant, role="admin"))
    response = post(client, tenant, spec)
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Contract.objects.filter(tenant=tenant).exists()


def test_another_tenants_admin_cannot_add_to_this_tenant(
    tenant, other_tenant, make_person, login
):
    client = login(make_person("bob", tenant=other_tenant, role="admin"))
    response = post(client, tenant, json.dumps(SPEC_EXAMPLE))
    assert response.status_code == 200  # the form refuses the tenant choice
    assert "Select a valid choice" in response.content.decode()
    assert not Contract.objects.filter(tenant=tenant).exists()
