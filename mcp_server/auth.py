"""Who calls: the agent's API key, checked as the REST API checks it.

Over streamable HTTP the key is the request's Bearer token: the SDK's bearer
middleware asks ``AgentKeyVerifier`` on every request and answers 401 (with the
RFC 9728 metadata pointer) when it refuses. Each handler then runs ``caller`` in its
worker thread, for the agent and the tenant scope, so a key revoked between two
requests of one session is refused at the next one, on either transport.
"""

from __future__ import annotations

from typing import Final

from mcp.server.auth.provider import AccessToken

from portal import scope, selectors, services
from portal.api import ApiKeyExpired, ApiKeyRevoked
from portal.models import Agent

from .threads import in_worker_thread

# The REST API's refusal codes and words (portal.api), so an agent reads the same
# whichever door it used.
_REFUSALS: Final = {
    None: ("UNAUTHENTICATED", "Invalid or revoked API key."),
    "revoked": ("API_KEY_REVOKED", str(ApiKeyRevoked.default_detail)),
    "expired": ("API_KEY_EXPIRED", str(ApiKeyExpired.default_detail)),
}


class KeyRefused(Exception):
    """The presented key does not authenticate (unknown, revoked or expired)."""

    def __init__(self, status: str | None) -> None:
        self.code, detail = _REFUSALS.get(status, _REFUSALS[None])
        super().__init__(detail)


def caller(*, secret: str) -> Agent:
    """The live key's agent, with its tenant loaded; enters the agent's tenant scope.

    The same key lookup as ``portal.api.AgentKeyAuthentication`` (the one
    ``selectors.agent_key_authenticate``), the same scope (``scope.enter``) and the
    same last-used mark. Run it inside ``scope.unit_of_work()``, which clears the
    scope again.

    Raises:
        KeyRefused: no such key, or it is revoked or expired, or its agent is
            inactive or its tenant deleted.
    """
    check = selectors.agent_key_authenticate(secret=secret.strip())
    if check is None or check.status != "live":
        raise KeyRefused(None if check is None else check.status)
    scope.enter([check.key.agent.tenant_id])
    services.agent_key_mark_used(key=check.key)
    return check.key.agent


def _access_token(secret: str) -> AccessToken | None:
    with scope.unit_of_work():
        try:
            agent = caller(secret=secret)
        except KeyRefused:
            return None
        return AccessToken(
            token=secret,
            # The key's prefix: the SDK binds a session to the principal that opened
            # it, so another key (even the same agent's) cannot ride on it.
            client_id=secret.partition(".")[0],
            scopes=[],
            subject=str(agent.pk),
            claims={"tenant": str(agent.tenant_id)},
        )


class AgentKeyVerifier:
    """The SDK's ``TokenVerifier``: an agent API key is the Bearer token."""

    async def verify_token(self, token: str) -> AccessToken | None:
        return await in_worker_thread(_access_token, token)
