"""Revocation: the portal tells a target which of its credentials are void.

A credential is single-use at the target (its replay cache refuses a ``jti`` seen
before) and revoked in the portal once its call is recorded (``revoked_at``). A
revoked credential that the target never saw (a call that failed before reaching
it, or one revoked by hand) would still be good there until it expires, so the
portal sends a revocation notice: ``POST {base_url}/credentials/revocations`` with a
single-use token (``use: revoke``) whose ``revokes`` claim lists ``{jti, exp}``.
Sending is best effort and after the commit: if the notice is lost, the credential
still dies at its short ``exp`` and can only repeat the exact request it was
issued for, which the operation's idempotency key makes harmless.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Sequence
from typing import Final

from django.db import connection, transaction

from portal import db as portal_db
from portal.db import db_now
from portal.models import Tenant

from ..connectors import RemoteSystem, connector_for
from ..credentials import USE_REVOKE, credential_mint
from ..models import Connector, Credential

# A notice is good for a minute: long enough to reach the target, no more.
NOTICE_TTL_S: Final = 60


def credentials_notify(
    *,
    tenant: Tenant,
    connector: Connector,
    credential_ids: Sequence[uuid.UUID],
    remote: RemoteSystem | None = None,
) -> bool:
    """Tell the target that these credentials (revoked, unexpired) are void.

    Returns whether the target took the notice; a target without a revocation
    endpoint, or one that cannot be reached, returns False and nothing else
    happens (the credentials expire soon anyway).
    """
    portal_db.forbid_transaction("the revocation notice goes over the network")
    now = db_now()
    revoked = list(
        Credential.objects.filter(
            tenant=tenant,
            pk__in=list(credential_ids),
            target=connector.target,
            revoked_at__isnull=False,
            expires_at__gt=now,
        ).values_list("pk", "expires_at")
    )
    if not revoked:
        return False
    notice = credential_mint(
        claims={
            "aud": connector.target,
            "iat": int(now.timestamp()),
            "exp": int((now + dt.timedelta(seconds=NOTICE_TTL_S)).timestamp()),
            "jti": str(uuid.uuid4()),
            "tenant": str(tenant.pk),
            "use": USE_REVOKE,
            "revokes": [
                # expires_at is the token's exp (whole seconds, issue_credential).
                {"jti": str(pk), "exp": math.ceil(expires_at.timestamp())}
                for pk, expires_at in revoked
            ],
        },
        connector=connector,
    )
    return (remote or connector_for(connector)).revoke(credential=notice)


@transaction.atomic(durable=True)
def _revoke_rows(*, tenant: Tenant, credential_ids: Sequence[uuid.UUID]) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_credential SET revoked_at = COALESCE(revoked_at, app_now()) "
            "WHERE tenant_id = %s AND id = ANY(%s) RETURNING target",
            [tenant.pk, list(credential_ids)],
        )
        return sorted({row[0] for row in cursor.fetchall()})


def credential_revoke(
    *, tenant: Tenant, credential_ids: Sequence[uuid.UUID]
) -> dict[str, bool]:
    """Revoke credentials in the portal and tell each target; safe to repeat.

    Guarantee: ``revoked_at`` commits first (the gateway then refuses to call with
    them); the notices follow with no transaction open. Returns, per target,
    whether it took the notice.
    """
    portal_db.forbid_transaction("the revocation notice goes over the network")
    targets = _revoke_rows(tenant=tenant, credential_ids=credential_ids)
    taken = {}
    for connector in Connector.objects.filter(tenant=tenant, target__in=targets):
        taken[connector.target] = credentials_notify(
            tenant=tenant, connector=connector, credential_ids=credential_ids
        )
    return taken
