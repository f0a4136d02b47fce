"""A person's saved searches of the event browser: read, save, delete their own.

A saved search is the list's query string under a name, the person's own (not a
tenant's row, so no event and no tenant scope): opening it runs the query against
what the person may read at that moment (console/admin/trail.py), so it can never
show more than the person's role does.
"""

from __future__ import annotations

import uuid
from typing import Final
from urllib.parse import parse_qsl, urlencode

from django.db import transaction

from portal.exceptions import NotFound, ValidationFailed
from portal.roles import Person

from .exceptions import TooManySavedSearches
from .models import SavedSearch

MAX_PER_PERSON: Final = 50
MAX_NAME: Final = 80
MAX_QUERY: Final = 2000
# Page and error markers are not part of a search.
_DROPPED: Final = frozenset({"p", "e", "_changelist_filters"})


def _owner_id(user: Person) -> int:
    if not user.is_authenticated or user.pk is None:
        raise NotFound()
    return int(user.pk)


def saved_search_list(*, user: Person) -> list[SavedSearch]:
    """The person's saved searches by name."""
    if not user.is_authenticated:
        return []
    return list(SavedSearch.objects.filter(user_id=_owner_id(user)).order_by("name"))


def clean_query(query: str) -> str:
    """The query string without the page number and error markers, re-encoded."""
    pairs = [
        (key, value)
        for key, value in parse_qsl(query.lstrip("?"), keep_blank_values=False)
        if key not in _DROPPED
    ]
    return urlencode(pairs)


@transaction.atomic(durable=True)
def saved_search_save(*, user: Person, name: str, query: str) -> SavedSearch:
    """Save ``query`` as ``name`` for the person; the same name replaces its query.

    Raises:
        ValidationFailed: no name, a name or query too long, or an empty search.
        TooManySavedSearches: the person already keeps ``MAX_PER_PERSON``.
    """
    name = " ".join(name.split())
    query = clean_query(query)
    if not name or len(name) > MAX_NAME:
        raise ValidationFailed(detail=f"A name of 1 to {MAX_NAME} characters.")
    if not query:
        raise ValidationFailed(detail="Filter or search first: this list is all.")
    if len(query) > MAX_QUERY:
        raise ValidationFailed(detail=f"The search is over {MAX_QUERY} characters.")
    owner = _owner_id(user)
    mine = SavedSearch.objects.select_for_update().filter(user_id=owner)
    existing = mine.filter(name=name).first()
    if existing is not None:
        existing.query = query
        existing.save(update_fields=["query"])
        return existing
    if mine.count() >= MAX_PER_PERSON:
        raise TooManySavedSearches(limit=MAX_PER_PERSON)
    return SavedSearch.objects.create(user_id=owner, name=name, query=query)


@transaction.atomic(durable=True)
def saved_search_delete(*, user: Person, search_id: uuid.UUID) -> None:
    """Delete the person's saved search; another person's is "not found"."""
    deleted, _ = SavedSearch.objects.filter(
        user_id=_owner_id(user), pk=search_id
    ).delete()
    if not deleted:
        raise NotFound()
