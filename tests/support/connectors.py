"""A connector to a real ticket desk: the portal makes its key pair, the desk is
given the public key (its JWKS file), bound to the connector's tenant."""

from __future__ import annotations

from typing import Any

from portal.models import Tenant
from tasks import services as task_services
from tasks.credentials import public_jwk
from tasks.models import Connector
from ticketdesk.harness import TicketDesk


def desk_connector(
    *, tenant: Tenant, desk: TicketDesk, target: str = "ticket-desk", **values: Any
) -> Connector:
    """The tenant's connector to ``desk``, its public key installed there."""
    connector = task_services.connector_save(
        tenant=tenant, target=target, values={"base_url": desk.url, **values}
    )
    desk.trust(public_jwk(connector.public_key), tenant=str(tenant.pk))
    return connector
