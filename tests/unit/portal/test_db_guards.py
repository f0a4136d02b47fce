"""The two transaction guards and the constraint-name translation."""

from __future__ import annotations

import pytest
from django.db import transaction

from portal import db as portal_db
from portal.exceptions import TransactionForbidden, TransactionRequired


@pytest.mark.django_db(transaction=True)
def test_require_transaction_outside_one_raises():
    with pytest.raises(TransactionRequired):
        portal_db.require_transaction()
    with transaction.atomic():
        portal_db.require_transaction()


@pytest.mark.django_db(transaction=True)
def test_forbid_transaction_inside_one_raises():
    portal_db.forbid_transaction("calls the network")
    with pytest.raises(TransactionForbidden) as caught, transaction.atomic():
        portal_db.forbid_transaction("calls the network")
    assert caught.value.context == {"reason": "calls the network"}


@pytest.mark.django_db
def test_the_guards_ignore_the_test_cases_own_atomic_block():
    """Under pytest-django's wrapping transaction the guards behave as in production."""
    portal_db.forbid_transaction("network")
    with pytest.raises(TransactionRequired):
        portal_db.require_transaction()
