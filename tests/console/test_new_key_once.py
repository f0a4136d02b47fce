"""Issue a key once per page (issue 24 §2): the agents and keys lists carry a
one-time token (console/once.py) that issuing or rotating spends, so the same page
posted again, even at the same moment from two connections, makes one key; a
token that is missing, forged, another person's or expired makes none. As each
role and as another tenant's admin. In Chromium: tests/browser/test_new_key_secret.py.
"""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.core import signing
from django.test import Client

from console import once
from console import services as console_services
from console.exceptions import FormAlreadyUsed, FormExpired
from console.models import UsedFormToken
from portal.models import AgentKey
from tests.support.concurrency import run_in_threads
from tests.support.new_keys import form_token, shown_secrets

from .conftest import Cast

pytestmark = pytest.mark.django_db

AGENTS = "/admin/portal/agent/"
KEYS = "/admin/portal/agentkey/"


def _agent(cast: Cast, name: str = "once-bot"):
    return console_services.agent_create(
        tenant=cast.a, by=cast.people["admin_a"].user, name=name
    )


def _issue(client: Client, agent, token: str | None):
    data = {"action": "issue_key", "_selected_action": [str(agent.pk)]}
    if token is not None:
        data["once"] = token
    return client.post(AGENTS, data, follow=True)


def _messages(response) -> str:
    return " ".join(str(m) for m in response.context["messages"])


def test_the_same_page_posted_twice_issues_one_key(cast: Cast):
    client = cast.client("admin_a")
    agent = _agent(cast)
    token = form_token(client, AGENTS)
    first = _issue(client, agent, token)
    assert len(shown_secrets(first)) == 1
    # the browser's resubmission of the same page: no second key, no secret
    again = _issue(client, agent, token)
    assert shown_secrets(again) == []
    assert "This form was sent already" in _messages(again)
    assert AgentKey.objects.filter(agent=agent).count() == 1
    # a fresh page issues the next one
    fresh = _issue(client, agent, form_token(client, AGENTS))
    assert len(shown_secrets(fresh)) == 1
    assert AgentKey.objects.filter(agent=agent).count() == 2


def test_each_render_carries_its_own_token(cast: Cast):
    client = cast.client("admin_a")
    assert form_token(client, AGENTS) != form_token(client, AGENTS)
    assert form_token(client, KEYS) != form_token(client, KEYS)


@pytest.mark.parametrize("kind", ["missing", "forged", "another person's", "expired"])
def test_a_token_that_is_not_this_pages_issues_nothing(cast: Cast, kind, monkeypatch):
    client = cast.client("admin_a")
    agent = _agent(cast)
    if kind == "missing":
        token = None
    elif kind == "forged":
        token = form_token(client, AGENTS)[:-4] + "AAAA"
    elif kind == "another person's":
        token = once.once_token(user=cast.people["support_a"].user)
    else:  # signed an hour and more ago
        token = form_token(client, AGENTS)
        monkeypatch.setattr(once, "ONCE_MAX_AGE_S", -1)
    response = _issue(client, agent, token)
    assert shown_secrets(response) == []
    assert "This page is too old" in _messages(response)
    assert not AgentKey.objects.filter(agent=agent).exists()


def test_a_rotation_posted_twice_rotates_once(cast: Cast):
    from portal import services as portal_services
    from portal.db import db_now

    client = cast.client("admin_a")
    key = portal_services.agent_key_issue(agent=_agent(cast)).key
    until = (db_now() + dt.timedelta(minutes=30)).strftime("%Y-%m-%d %H:%M:%S")
    data = {
        "action": "rotate_keys",
        "_selected_action": [str(key.pk)],
        "until": until,
        "once": form_token(client, KEYS),
    }
    assert len(shown_secrets(client.post(KEYS, data, follow=True))) == 1
    again = client.post(KEYS, data, follow=True)
    assert shown_secrets(again) == []
    assert "This form was sent already" in _messages(again)
    assert AgentKey.objects.filter(agent_id=key.agent_id).count() == 2


@pytest.mark.parametrize(
    "persona",
    ["reviewer_a", "support_a", "member_of_b_only", "staff_without_membership"],
)
def test_no_one_else_issues_a_key_even_with_a_valid_token(cast: Cast, persona):
    agent = _agent(cast)
    client = cast.client(persona)
    token = once.once_token(user=cast.people[persona].user)
    response = client.post(
        AGENTS,
        {"action": "issue_key", "_selected_action": [str(agent.pk)], "once": token},
        follow=True,
    )
    assert response.status_code in (200, 403)
    assert shown_secrets(response) == []
    assert not AgentKey.objects.filter(agent=agent).exists()


@pytest.mark.django_db(transaction=True)
def test_two_connections_spending_one_token_at_once_let_one_through(cast: Cast):
    user = cast.people["admin_a"].user
    token = once.once_token(user=user)
    barrier = threading.Barrier(2, timeout=10)

    def spend() -> str:
        barrier.wait()
        once.once_spend(user=user, token=token)
        return "spent"

    outcomes = run_in_threads(spend, spend)
    assert sorted(map(repr, outcomes)).count(repr("spent")) == 1, outcomes
    assert sum(isinstance(o, FormAlreadyUsed) for o in outcomes) == 1, outcomes
    assert UsedFormToken.objects.filter(user=user).count() == 1


def test_a_token_is_bound_to_its_person_and_signature(cast: Cast):
    user = cast.people["admin_a"].user
    other = cast.people["member_of_b_only"].user
    with pytest.raises(FormExpired):
        once.once_spend(user=other, token=once.once_token(user=user))
    with pytest.raises(FormExpired):
        once.once_spend(user=user, token=signing.dumps({"u": user.pk, "n": "x"}))
    once.once_spend(user=user, token=once.once_token(user=user))
