"""Writes of a tenant's configuration: contracts, connectors, object versions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from django.db import connection, transaction
from django.db.models import Max
from django.db.models.functions import Now

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from portal import db as portal_db
from portal.actors import Actor
from portal.exceptions import (
    IllegalTransition,
    ValidationFailed,
)
from portal.ids import new_id
from portal.models import Tenant, TenantPerm
from portal.roles import Person, require_tenant_perm

from .. import sealed, selectors
from ..contracts import (
    contract_spec_validate,
)
from ..credentials import key_id, key_pair_new
from ..models import (
    Connector,
    Contract,
    ContractStatus,
    ObjectVersion,
)
from ..outbound import connector_url_problems

# --- Contracts and object versions ---------------------------------------------------


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def contract_create(
    *,
    tenant: Tenant,
    key: str,
    spec: Mapping[str, Any],
    publish: bool = False,
    by: Person | None = None,
) -> Contract:
    """Create the next version of a contract, as a draft or published at once.

    ``by`` is the person making the change (checked for ``manage_tenant`` and
    recorded as the actor); ``None`` is the portal itself (commands, the seed).
    Guarantee: the version and its ``contract.created`` event commit together.

    Raises:
        ContractInvalid: the spec fails the contract schema.
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    _require_manager(tenant=tenant, by=by)
    contract_spec_validate(spec)
    latest = Contract.objects.filter(tenant=tenant, key=key).aggregate(v=Max("version"))
    contract = Contract.objects.create(
        tenant=tenant,
        key=key,
        version=(latest["v"] or 0) + 1,
        spec=dict(spec),
        status=ContractStatus.PUBLISHED if publish else ContractStatus.DRAFT,
        published_at=Now() if publish else None,
    )
    contract.refresh_from_db()  # published_at was a database expression
    _contract_event(contract, EventCode.CONTRACT_CREATED, by=by)
    return contract


def _require_manager(*, tenant: Tenant, by: Person | None) -> None:
    if by is not None:
        require_tenant_perm(user=by, perm=TenantPerm.MANAGE_TENANT, tenant=tenant)


def _person_or_portal(by: Person | None) -> Actor:
    return Actor.of_user(by) if by is not None else Actor.system("portal")


def _contract_event(contract: Contract, code: str, *, by: Person | None) -> None:
    audit_services.event_append(
        tenant_id=contract.tenant_id,
        code=code,
        actor=_person_or_portal(by),
        contract=(contract.key, contract.version),
        data=payloads.ContractMoved(
            {"key": contract.key, "version": contract.version, "to": contract.status}
        ),
    )


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def contract_publish(
    *, tenant: Tenant, key: str, version: int, by: Person | None = None
) -> Contract:
    """Publish a draft version; from now on it never changes.

    Raises:
        ContractNotFound: no such version.
        IllegalTransition: the version is not a draft.
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    _require_manager(tenant=tenant, by=by)
    moved = Contract.objects.filter(
        tenant=tenant, key=key, version=version, status=ContractStatus.DRAFT
    ).update(status=ContractStatus.PUBLISHED, published_at=Now())
    contract = selectors.contract_get(tenant=tenant, key=key, version=version)
    if not moved:
        raise IllegalTransition(current=contract.status, requested="published")
    _contract_event(contract, EventCode.CONTRACT_PUBLISHED, by=by)
    return contract


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def contract_retire(
    *, tenant: Tenant, key: str, version: int, by: Person | None = None
) -> Contract:
    """Retire a published version: no new tasks may pin it.

    Raises:
        ContractNotFound: no such version.
        IllegalTransition: the version is not published.
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    _require_manager(tenant=tenant, by=by)
    moved = Contract.objects.filter(
        tenant=tenant, key=key, version=version, status=ContractStatus.PUBLISHED
    ).update(status=ContractStatus.RETIRED, retired_at=Now())
    contract = selectors.contract_get(tenant=tenant, key=key, version=version)
    if not moved:
        raise IllegalTransition(current=contract.status, requested="retired")
    _contract_event(contract, EventCode.CONTRACT_RETIRED, by=by)
    return contract


# What a person may set on a connector (its signing key is the portal's to make).
CONNECTOR_SETTINGS: Final = (
    "base_url",
    "execute_path",
    "lookup_path",
    "reference_field",
    "supports_idempotency_keys",
    "supports_lookup",
    "connect_timeout_s",
    "read_timeout_s",
    "max_attempts",
)
# The settings that say where the gateway calls: the outbound URL policy's.
URL_SETTINGS: Final = ("base_url", "execute_path", "lookup_path")


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def connector_save(
    *,
    tenant: Tenant,
    target: str,
    values: Mapping[str, Any],
    rotate_key: bool = False,
    by: Person | None = None,
) -> Connector:
    """Create the tenant's connector for ``target``, or change it.

    ``values`` are ``CONNECTOR_SETTINGS``. A new connector gets a fresh Ed25519
    signing key pair, and ``rotate_key`` replaces an existing connector's pair; the
    private key is sealed at once (``connector_key_seal``) and never returned, the
    public key and its ``key_id`` are for the target. The event names the settings
    that changed with their old and new values and says whether the key was
    replaced; no key material goes into the trail (nor the key id, which the
    trail's redaction would blank as high-entropy text: the admin page shows it).

    Raises:
        ValidationFailed: unknown setting, or a base URL or path the outbound URL
            policy refuses (``tasks/outbound.py``; checked again at every call).
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    _require_manager(tenant=tenant, by=by)
    unknown = sorted(set(values) - set(CONNECTOR_SETTINGS))
    if unknown:
        raise ValidationFailed(field=unknown[0])
    connector = (
        Connector.objects.select_for_update(of=("self",))
        .filter(tenant=tenant, target=target)
        .first()
    )
    created = connector is None
    if connector is None:
        connector = Connector(tenant=tenant, target=target)
    # The outbound URL policy's early word; every call checks again (outbound.py).
    for name, problem in connector_url_problems(
        {name: values.get(name, getattr(connector, name)) for name in URL_SETTINGS}
    ):
        raise ValidationFailed(f"{name}: {problem}", field=name)
    changed = {
        name: [None if created else getattr(connector, name), value]
        for name, value in values.items()
        if created or getattr(connector, name) != value
    }
    for name, value in values.items():
        setattr(connector, name, value)
    key_replaced = rotate_key and not created
    if created or rotate_key:
        private_key, connector.public_key = key_pair_new()
        connector.key_id = key_id(connector.public_key)
        connector.sealed_private_key = sealed.connector_key_seal(
            tenant_id=tenant.pk, connector_id=connector.pk, private_key=private_key
        )
        del private_key
    connector.save()
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.CONNECTOR_CREATED if created else EventCode.CONNECTOR_CHANGED,
        actor=_person_or_portal(by),
        data=payloads.ConnectorSaved(
            {
                "target": target,
                "changed": changed,
                "signing_key_replaced": key_replaced,
            }
        ),
    )
    return connector


_OBJECT_VERSION_ATTNAMES, _OBJECT_VERSION_COLUMNS = portal_db.returning_columns(
    ObjectVersion, "v"
)
# One statement (not update_or_create's savepoints, read, write and read back): a
# new object's row, or the known one's version and time, concurrent writers
# serialised on the unique key.
_OBJECT_VERSION_RECORD: Final = f"""
INSERT INTO tasks_objectversion AS v (
    id, tenant_id, object_type, object_id, version, updated_at
) VALUES (
    %(id)s, %(tenant_id)s, %(object_type)s, %(object_id)s, %(version)s,
    statement_timestamp()
)
ON CONFLICT (tenant_id, object_type, object_id) DO UPDATE
SET version = EXCLUDED.version, updated_at = EXCLUDED.updated_at
RETURNING {_OBJECT_VERSION_COLUMNS}
"""


@transaction.atomic(durable=True)
def object_version_record(
    *, tenant: Tenant, object_type: str, object_id: str, version: str
) -> ObjectVersion:
    """Record the current version of a business object (the version fence's input)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _OBJECT_VERSION_RECORD,
            {
                "id": new_id(),
                "tenant_id": tenant.pk,
                "object_type": object_type,
                "object_id": object_id,
                "version": version,
            },
        )
        row = cursor.fetchone()
    assert row is not None  # an upsert returns its row
    return portal_db.model_from_row(ObjectVersion, _OBJECT_VERSION_ATTNAMES, row)
