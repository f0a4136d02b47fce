"""Each request starts with no tenant scope and leaves none (portal/scope.py).

A signed-in person's scope is the set of their tenants (all tenants for the platform
operator, a superuser, who makes them); an agent's is set by its authentication
(``portal.api.AgentKeyAuthentication``). The admin runs under the person's scope, so
row-level security is the second wall behind its scoped querysets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponseBase, StreamingHttpResponse

from . import scope
from .api import connection_lost, database_unavailable
from .models import Tenant


def person_tenant_ids(user: AbstractBaseUser | AnonymousUser) -> list[str]:
    """The tenants whose rows a signed-in person may see."""
    if getattr(user, "is_superuser", False):
        return [str(pk) for pk in Tenant.objects.values_list("pk", flat=True)]
    # Memberships are scoped too: the discovery function names the tenants.
    return scope.discover("portal_person_tenants", user.pk or 0)


def _streamed_in_scope(
    ids: frozenset[str] | None, content: Iterable[bytes]
) -> Iterator[bytes]:
    # A streamed body is read after the view returned: under the request's scope.
    with scope.tenant_scope(ids or ()):
        yield from content


class TenantScopeMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        with scope.unit_of_work():
            user = getattr(request, "user", None)
            try:
                if user is not None and user.is_authenticated:
                    scope.enter(person_tenant_ids(user))
            except DatabaseError as error:
                # A signed-in request's first statements (its session, user and
                # tenants) run here, before any view: a lost connection is the
                # retryable 503 a view's would be, on every page, not a 500.
                if not connection_lost(error):
                    raise
                return database_unavailable(request)
            response = self.get_response(request)
            if isinstance(response, StreamingHttpResponse) and not response.is_async:
                response.streaming_content = _streamed_in_scope(
                    scope.current(),
                    response.streaming_content,  # type: ignore[arg-type]
                )
            return response
