"""Changes to a tenant's policy sets: draft, edit, publish, retire (docs/policies.md).

Each change is one transaction with one event naming the person (or the portal, for
``by=None``: commands, the seed, tests). A person needs ``manage_tenant``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.db.models.functions import Now

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from portal import db as portal_db
from portal.actors import Actor
from portal.exceptions import IllegalTransition
from portal.models import Tenant, TenantPerm
from portal.roles import Person, require_tenant_perm

from . import selectors
from .exceptions import PolicyInvalid
from .models import PolicySet, PolicySetState
from .schema import (
    contract_amount_names,
    contract_field_names,
    granted_actions,
    schema_for,
)
from .validation import MAX_TEXT_CHARS, Problem, policy_problems


def _require_manager(*, tenant: Tenant, by: Person | None) -> None:
    if by is not None:
        require_tenant_perm(user=by, perm=TenantPerm.MANAGE_TENANT, tenant=tenant)


def _facts(policy_set: PolicySet) -> payloads.PolicySetFacts:
    return {
        "version": policy_set.version,
        "state": policy_set.state,
        # Which text: the trail names it by digest, the row holds it.
        "digest": hashlib.sha256(policy_set.text.encode()).hexdigest(),
    }


def _event(
    policy_set: PolicySet, code: str, *, by: Person | None, data: payloads.Payload
) -> None:
    audit_services.event_append(
        tenant_id=policy_set.tenant_id,
        code=code,
        actor=Actor.of_user(by) if by is not None else Actor.system("portal"),
        data=data,
    )


def _refuse_oversized(text: str) -> None:
    if len(text) > MAX_TEXT_CHARS:
        problem = Problem(message=f"longer than {MAX_TEXT_CHARS} characters")
        raise PolicyInvalid(str(problem), problems=[problem.as_json()])


def tenant_policy_schema(
    *, tenant: Tenant, contract_specs: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The tenant's Cedar schema: its granted actions, its contracts' fields and
    declared amounts."""
    return schema_for(
        actions=granted_actions(tenant=tenant),
        field_names=contract_field_names(contract_specs),
        amount_names=contract_amount_names(contract_specs),
    )


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def policy_set_draft(
    *, tenant: Tenant, text: str, note: str = "", by: Person | None = None
) -> PolicySet:
    """Start the next version as a draft; it is checked only when published.

    Raises:
        PolicyInvalid: the text is over the size limit.
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    _require_manager(tenant=tenant, by=by)
    _refuse_oversized(text)
    latest = PolicySet.objects.filter(tenant=tenant).aggregate(v=Max("version"))
    policy_set = PolicySet.objects.create(
        tenant=tenant,
        version=(latest["v"] or 0) + 1,
        text=text,
        note=note,
        created_by_id=by.pk if by is not None else None,
    )
    policy_set.refresh_from_db()
    _event(
        policy_set,
        EventCode.POLICY_SET_CREATED,
        by=by,
        data=payloads.PolicySetCreated({**_facts(policy_set), "note": note}),
    )
    return policy_set


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def policy_set_edit(
    *,
    tenant: Tenant,
    version: int,
    text: str,
    note: str | None = None,
    by: Person | None = None,
) -> PolicySet:
    """Replace a draft's text (and note).

    Raises:
        PolicySetNotFound: no such version.
        IllegalTransition: the version is not a draft (published ones never change).
        PolicyInvalid: the text is over the size limit.
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    _require_manager(tenant=tenant, by=by)
    _refuse_oversized(text)
    current = selectors.policy_set_get(tenant=tenant, version=version)
    moved = PolicySet.objects.filter(
        tenant=tenant, version=version, state=PolicySetState.DRAFT
    ).update(
        text=text,
        note=current.note if note is None else note,
        updated_at=Now(),
    )
    if not moved:
        raise IllegalTransition(current=current.state, requested="edit")
    policy_set = selectors.policy_set_get(tenant=tenant, version=version)
    _event(policy_set, EventCode.POLICY_SET_CHANGED, by=by, data=_facts(policy_set))
    return policy_set


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def policy_set_publish(
    *,
    tenant: Tenant,
    version: int,
    contract_specs: Sequence[Mapping[str, Any]],
    by: Person | None = None,
) -> PolicySet:
    """Check a draft against the tenant's schema and put it in force.

    The schema is generated from the tenant's grants (the actions) and from
    ``contract_specs``, the specs of its published contracts (the fields). The
    version in force, if any, is retired in the same transaction; one
    ``policy_set.published`` event names both.

    Guarantee: all or nothing. A set with any problem leaves every version as it
    was.

    Raises:
        PolicySetNotFound: no such version.
        IllegalTransition: the version is not a draft.
        PolicyInvalid: the set does not parse, does not fit the schema or has a
            malformed annotation; ``problems`` lists each with its line.
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    _require_manager(tenant=tenant, by=by)
    draft = selectors.policy_set_get(tenant=tenant, version=version)
    if draft.state != PolicySetState.DRAFT:
        raise IllegalTransition(current=draft.state, requested="published")
    schema = tenant_policy_schema(tenant=tenant, contract_specs=contract_specs)
    problems = policy_problems(text=draft.text, schema=schema)
    if problems:
        raise PolicyInvalid(
            "; ".join(str(problem) for problem in problems),
            problems=[problem.as_json() for problem in problems],
        )
    in_force = (
        PolicySet.objects.select_for_update(of=("self",))
        .filter(tenant=tenant, state=PolicySetState.PUBLISHED)
        .first()
    )
    if in_force is not None:
        PolicySet.objects.filter(tenant=tenant, pk=in_force.pk).update(
            state=PolicySetState.RETIRED, retired_at=Now()
        )
    moved = PolicySet.objects.filter(
        tenant=tenant, pk=draft.pk, state=PolicySetState.DRAFT
    ).update(
        state=PolicySetState.PUBLISHED,
        published_at=Now(),
        published_by_id=by.pk if by is not None else None,
    )
    if not moved:  # published or dropped since it was read
        raise IllegalTransition(current=draft.state, requested="published")
    policy_set = selectors.policy_set_get(tenant=tenant, version=version)
    _event(
        policy_set,
        EventCode.POLICY_SET_PUBLISHED,
        by=by,
        data=payloads.PolicySetPublished(
            {
                **_facts(policy_set),
                "retired_version": in_force.version if in_force is not None else None,
            }
        ),
    )
    return policy_set


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def policy_set_retire(
    *, tenant: Tenant, version: int, by: Person | None = None
) -> PolicySet:
    """Take the version in force out of force: grants alone decide again.

    Raises:
        PolicySetNotFound: no such version.
        IllegalTransition: the version is not published.
        PermissionDenied, TenantNotVisible: ``by`` may not manage the tenant.
    """
    _require_manager(tenant=tenant, by=by)
    moved = PolicySet.objects.filter(
        tenant=tenant, version=version, state=PolicySetState.PUBLISHED
    ).update(state=PolicySetState.RETIRED, retired_at=Now())
    policy_set = selectors.policy_set_get(tenant=tenant, version=version)
    if not moved:
        raise IllegalTransition(current=policy_set.state, requested="retired")
    _event(policy_set, EventCode.POLICY_SET_RETIRED, by=by, data=_facts(policy_set))
    return policy_set
