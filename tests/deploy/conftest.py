"""Fixtures of the deployment tests: databases made and dropped per test."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator

import pytest

from tests.deploy import support


@pytest.fixture
def make_database() -> Iterator[Callable[[str], str]]:
    """New databases owned by portal_owner, named ``portal_<label>_ops_<random>``;
    each is dropped when the test ends."""
    made: list[str] = []

    def make(label: str) -> str:
        name = f"portal_{label}_ops_{secrets.token_hex(4)}"
        support.create_database(name)
        made.append(name)
        return name

    yield make
    for name in made:
        support.drop_database(name)
