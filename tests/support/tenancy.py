"""What a tenant owns, read from the model registry so new models are never missed."""

from __future__ import annotations

import uuid

from django.apps import apps
from django.db import connection
from django.db.models import Model

OWNED_APPS = ("portal", "tasks", "audit", "limits", "policies", "console")


def models_with_a_tenant_field() -> list[type[Model]]:
    """Models of the portal apps with a ``tenant`` field, from the registry.

    The tests' own oracle, found by another rule than the product's
    ``tenant_deletion.services.tenant_owned_models`` (a foreign key to ``Tenant``),
    so a test of the deletion report does not check the report against itself.
    """
    return [
        model
        for model in apps.get_models()
        if model._meta.app_label in OWNED_APPS
        and any(field.name == "tenant" for field in model._meta.concrete_fields)
    ]


def tenant_fingerprint(tenant_id: uuid.UUID) -> dict[str, tuple[int, str]]:
    """(rows, md5 of every row's text) per tenant-owned table and the tenant row.

    Catches updates as well as inserts and deletes: a revoked credential or a
    tombstoned tenant changes the hash.
    """
    tables = [(m._meta.db_table, "tenant_id") for m in models_with_a_tenant_field()]
    tables.append(("portal_tenant", "id"))
    result = {}
    with connection.cursor() as cursor:
        for table, column in tables:
            cursor.execute(
                f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' "
                f"ORDER BY t::text), '')) FROM {table} t WHERE {column} = %s",
                [tenant_id],
            )
            result[table] = cursor.fetchone()
    return result
