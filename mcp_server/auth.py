"""Who calls: the agent's API key, checked as the REST API checks it.

Over streamable HTTP the key is the request's Bearer token: the SDK's bearer
middleware asks ``AgentKeyVerifier`` on every request and answers 401 (with the
RFC 9728 metadata pointer) when it refuses. The verifier's answer carries the key it
found (``AgentAccessToken``), so the request's handler runs ``caller`` on that key
(the freeze check, the scope) without looking it up a second time (the lookup
wrote the last-used mark); over stdio ``caller`` looks the key up at every
request. Either way a key revoked between two requests of one session is refused
at the next one.

A frozen agent or tenant (docs/limits.md) is refused by ``caller`` too, with the
REST API's check (``portal.api.caller_refuse_frozen``) and codes, and each refusal
is a denial event (``limits.services.denial_record``). The verifier lets its key
through: the key is valid (REST answers 403, not 401), so the handler answers,
naming ``AGENT_FROZEN`` or ``TENANT_FROZEN``.

A revoked or expired key's exact secret is written in its tenant as
``agent_key.refused`` (``limits.services.key_refusal_record``), as the REST API
writes it: over HTTP with the request's source address, method and path (set per
request by ``RequestFacts``), over stdio with the address ``stdio`` and the
JSON-RPC method.

Failed authentications over HTTP are throttled per source address and per key
prefix by the REST API's throttle (``portal.api``'s ``auth_failure_*``: the same
counters in PostgreSQL, the same limit ``PORTAL_AUTH_FAILURE_LIMIT``), in
``FailedAuthThrottle``: past the limit a failure is ``429`` problem+json
``RATE_LIMITED`` with ``Retry-After``, and the address is refused until its window
ends, a right key included (docs/limits.md).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final

from mcp.server.auth.provider import AccessToken
from pydantic import PrivateAttr
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from limits import services as limits_services
from portal import problems, scope, selectors
from portal.api import (
    ApiKeyExpired,
    ApiKeyRevoked,
    auth_failure_buckets,
    auth_failure_record,
    auth_failure_refuse_blocked,
    caller_refuse_frozen,
)
from portal.exceptions import AuthFailuresThrottled, CallerFrozen
from portal.models import Agent, AgentKey

from .threads import in_worker_thread

# The REST API's refusal codes and words (portal.api), so an agent reads the same
# whichever door it used.
_REFUSALS: Final = {
    None: ("UNAUTHENTICATED", "Invalid or revoked API key."),
    "revoked": ("API_KEY_REVOKED", str(ApiKeyRevoked.default_detail)),
    "expired": ("API_KEY_EXPIRED", str(ApiKeyExpired.default_detail)),
}


# A frozen caller's next step: nothing it sends is accepted, retrying does not help.
FROZEN_NEXT_STEP: Final = (
    "A person stopped this agent (the kill switch); stop working and do not retry: "
    "every call is refused until a person unfreezes it."
)


class KeyRefused(Exception):
    """The caller is refused: its key does not authenticate (unknown, revoked or
    expired), or its agent or tenant is frozen (``code`` says which)."""

    def __init__(
        self, status: str | None, *, frozen: CallerFrozen | None = None
    ) -> None:
        if frozen is not None:
            self.code, detail = str(frozen.code), f"{frozen} {FROZEN_NEXT_STEP}"
        else:
            self.code, detail = _REFUSALS.get(status, _REFUSALS[None])
        super().__init__(detail)


@dataclass(frozen=True)
class _Request:
    """Where a request came from, for the ``agent_key.refused`` event."""

    address: str
    method: str
    path: str


_STDIO: Final = _Request(address="stdio", method="", path="stdio")
_request: ContextVar[_Request] = ContextVar("mcp_request", default=_STDIO)


class RequestFacts:
    """ASGI middleware: the HTTP request's source address, method and path, for a
    refused key's event (the SDK's token verifier is given the token only)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        facts = _Request(
            address=client[0] if client else "",
            method=scope["method"],
            path=scope["path"],
        )
        reset = _request.set(facts)
        try:
            await self.app(scope, receive, send)
        finally:
            _request.reset(reset)


def _bearer(scope: Scope) -> str | None:
    """The Authorization header's credentials (after the scheme); None without one."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return value.decode("latin-1").partition(" ")[2].strip()
    return None


async def _throttled(send: Send, refused: AuthFailuresThrottled) -> None:
    """The REST API's answer to a throttled failure: 429 problem+json, Retry-After."""
    retry_after = int(refused.context["retry_after_s"])
    body = problems.encode(
        problems.problem_body(
            status=refused.status,
            code=str(refused.code),
            detail=refused.detail,
            retry_after_s=retry_after,
        )
    )
    await send({
        "type": "http.response.start",
        "status": refused.status,
        "headers": [
            (b"content-type", problems.PROBLEM_CONTENT_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(retry_after).encode()),
        ],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


class FailedAuthThrottle:
    """ASGI middleware: failed authentications throttled as on the REST API.

    A request that sends an Authorization header is put in the REST API's buckets
    (``auth_failure_buckets``: its source address and the key prefix it names). A
    bucket this process knows is blocked is refused at once, before any query
    (``auth_failure_refuse_blocked``). When the SDK's bearer check answers 401, the
    failure is counted in PostgreSQL and logged (``auth_failure_record``, in a
    worker thread); the failure that goes over the limit is answered 429 instead of
    the 401. A request without the header is the SDK's to refuse, uncounted, as the
    REST API leaves it uncounted.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        secret = _bearer(scope) if scope["type"] == "http" else None
        if secret is None:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        buckets = auth_failure_buckets(
            address=client[0] if client else "", secret=secret
        )
        try:
            auth_failure_refuse_blocked(buckets)
        except AuthFailuresThrottled as refused:
            await _throttled(send, refused)
            return
        replaced = False

        async def watched(message: Message) -> None:
            nonlocal replaced
            if replaced:
                return  # the 401's body: the client got the 429 instead
            if message["type"] == "http.response.start" and message["status"] == 401:
                try:
                    await in_worker_thread(
                        auth_failure_record, buckets=buckets, reason="invalid_token"
                    )
                except AuthFailuresThrottled as refused:
                    replaced = True
                    await _throttled(send, refused)
                    return
            await send(message)

        await self.app(scope, receive, watched)


def _live_key(secret: str, *, method: str = "") -> AgentKey:
    """The live key, its agent and tenant loaded; enters the agent's tenant scope.
    A revoked or expired key's use is written in its tenant (``agent_key.refused``);
    ``method`` is the JSON-RPC method over stdio (over HTTP, the request's)."""
    # The last-used mark is written by the lookup itself (unless agent or tenant
    # is frozen), as for the REST API.
    check = selectors.agent_key_authenticate(secret=secret.strip(), mark_used=True)
    if check is None:
        raise KeyRefused(None)
    if check.status != "live":
        facts = _request.get()
        limits_services.key_refusal_record(
            key=check.key,
            status=check.status,
            address=facts.address,
            method=facts.method or method,
            path=facts.path,
        )
        raise KeyRefused(check.status)
    scope.enter([check.key.agent.tenant_id])
    return check.key


def caller(*, secret: str, method: str, checked: AgentKey | None = None) -> Agent:
    """The live key's agent, with its tenant loaded; enters the agent's tenant scope.

    The same key lookup as ``portal.api.AgentKeyAuthentication`` (the one
    ``selectors.agent_key_authenticate``), the same scope (``scope.enter``), the
    same freeze check (``caller_refuse_frozen``) and the same last-used mark (in
    the lookup). A
    frozen caller's refusal is written as a denial (phase ``mcp``, the JSON-RPC
    ``method``) in a transaction of its own, as the REST API's is. Run it inside
    ``scope.unit_of_work()``, which clears the scope again. ``checked`` is the key
    this request's bearer check found live (``AgentAccessToken.key``): it is not
    looked up again.

    Raises:
        KeyRefused: no such key, or it is revoked or expired, or its agent is
            inactive or its tenant deleted; or the agent or its tenant is frozen
            (``AGENT_FROZEN``, ``TENANT_FROZEN``).
    """
    if checked is not None:
        key = checked
        scope.enter([key.agent.tenant_id])
    else:
        key = _live_key(secret, method=method)
    try:
        caller_refuse_frozen(agent=key.agent)
    except CallerFrozen as frozen:
        limits_services.denial_record(
            tenant_id=frozen.tenant_id,
            agent_id=frozen.context.get("agent_id"),
            error=frozen,
            phase="mcp",
            method=method,
        )
        frozen.recorded = True
        raise KeyRefused(None, frozen=frozen) from None
    return key.agent


class AgentAccessToken(AccessToken):
    """The SDK's access token, with the key the bearer check found live for this
    request (``key``), so the handler does not look it up again."""

    _key: AgentKey | None = PrivateAttr(default=None)

    @property
    def key(self) -> AgentKey | None:
        return self._key


def _access_token(secret: str) -> AgentAccessToken | None:
    with scope.unit_of_work():
        try:
            # Not ``caller``: a frozen agent's key is valid (no 401); its request
            # goes on to the handler, which refuses it by name and records that.
            key = _live_key(secret)
        except KeyRefused:
            return None
        agent = key.agent
        token = AgentAccessToken(
            token=secret,
            # The key's prefix (the server is stateless: no session to bind it to).
            client_id=secret.partition(".")[0],
            scopes=[],
            subject=str(agent.pk),
            claims={"tenant": str(agent.tenant_id)},
        )
        token._key = key
        return token


class AgentKeyVerifier:
    """The SDK's ``TokenVerifier``: an agent API key is the Bearer token."""

    async def verify_token(self, token: str) -> AccessToken | None:
        return await in_worker_thread(_access_token, token)
