"""The transition's one statement stays within what psycopg converts once."""

from __future__ import annotations

from psycopg import _queries

from tasks.services.tasks import _TRANSITION_AND_EVENT, _TRANSITION_SLOTS


def test_the_statement_is_short_enough_for_psycopg_to_cache_its_conversion() -> None:
    # psycopg parses a longer statement's placeholders again on every call
    assert len(_TRANSITION_AND_EVENT) <= _queries.MAX_CACHED_STATEMENT_LENGTH


def test_the_statement_names_every_slot_the_payload_leaves_out() -> None:
    assert tuple(sorted(_TRANSITION_SLOTS)) == _TRANSITION_SLOTS
    assert "%(_p2)s" in _TRANSITION_AND_EVENT  # two slots, three pieces
    assert "%(_p3)s" not in _TRANSITION_AND_EVENT
