"""The event browser as CloudTrail's event history (issue 24 §2): the time range in
the browser's date and time pickers, filter entries that read as the codes shown,
the task's client id beside its short id, and saved searches per person. In
Chromium: tests/browser/test_event_history.py."""

from __future__ import annotations

import re

import pytest
from django.db import IntegrityError, connection, transaction

from audit import services as audit_services
from audit.models import EventCode
from console import saved_searches
from console.models import SavedSearch
from portal.actors import Actor

pytestmark = pytest.mark.django_db
LIST = "/admin/audit/event/"


def _event(task, code=EventCode.TASK_REGISTERED):
    with transaction.atomic():
        return audit_services.event_append(
            tenant_id=task.tenant_id,
            task_id=task.pk,
            code=code,
            actor=Actor.system("history-tests"),
        )


@pytest.fixture
def reviewer(tenant, make_person):
    return make_person("rita", tenant=tenant, role="reviewer")


def _sidebar(html: str) -> str:
    return html[html.index('id="changelist-filter"') :]


def test_the_code_filters_read_as_the_codes_the_list_shows(
    tenant, make_task, reviewer, login
):
    _event(make_task(client_task_id="issue-7"))
    html = login(reviewer).get(LIST).content.decode()
    sidebar = _sidebar(html)
    # the code filter offers the stored codes, linked by the same parameter
    assert re.search(
        r'href="\?code__exact=task\.registered"[^>]*>task\.registered<', sidebar
    )
    assert "Task Registered" not in html and "Task registered" not in sidebar
    # and so do the reason and actor-type filters
    assert ">FIELD_STALE<" in sidebar and ">system<" in sidebar
    # and the column shows the same string
    assert '<td class="field-event_code">task.registered</td>' in html


def test_the_time_range_is_two_date_time_pickers_showing_what_was_asked(
    reviewer, login
):
    html = login(reviewer).get(LIST, {"created_from": "2026-12-01"}).content.decode()
    assert 'type="datetime-local" id="filter-created_from"' in html
    assert 'type="datetime-local" id="filter-created_to"' in html
    # a bare date in the URL is shown as the picker can show it
    assert 'name="created_from" value="2026-12-01T00:00"' in html


def test_the_pickers_value_filters_by_the_minute(tenant, make_task, reviewer, login):
    task = make_task(client_task_id="issue-8")
    _event(task)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT to_char(app_now() AT TIME ZONE %s, 'YYYY-MM-DD\"T\"HH24:MI')",
            ["UTC"],
        )
        (minute,) = cursor.fetchone()
    client = login(reviewer)
    assert "issue-8" in client.get(LIST, {"created_from": minute}).content.decode()
    assert "issue-8" not in client.get(LIST, {"created_to": minute}).content.decode()


def test_the_task_column_shows_the_client_id_beside_the_short_id(
    tenant, make_task, reviewer, login
):
    _event(make_task(client_task_id="issue-42"))
    _event(make_task(client_task_id="issue-43"))
    html = login(reviewer).get(LIST).content.decode()
    assert html.count('class="client-id"') == 2
    assert ">issue-42</span>" in html and ">issue-43</span>" in html


def test_saved_searches_are_each_persons_own(
    tenant, other_tenant, make_task, make_person, reviewer, login, client
):
    _event(make_task(client_task_id="issue-9"))
    # when the reviewer saves a filtered list (the page number is not part of it)
    login(reviewer)
    query = f"code__exact=task.registered&tenant={tenant.pk}&p=2"
    saved = client.post(f"{LIST}saved/", {"name": "  registered  ", "query": query})
    # then it is hers, under its name, and the list opens on it
    assert saved.status_code == 302
    assert saved["Location"] == f"{LIST}?code__exact=task.registered&tenant={tenant.pk}"
    mine = SavedSearch.objects.get(user=reviewer)
    assert (mine.name, mine.query) == (
        "registered",
        f"code__exact=task.registered&tenant={tenant.pk}",
    )
    html = client.get(saved["Location"]).content.decode()
    assert 'data-name="registered"' in html and 'aria-current="true"' in html
    # saving the same name again replaces the query, never a second row
    client.post(
        f"{LIST}saved/", {"name": "registered", "query": "actor_type__exact=system"}
    )
    assert list(
        SavedSearch.objects.filter(user=reviewer).values_list("query", flat=True)
    ) == ["actor_type__exact=system"]
    # an empty name or an empty search is refused with a message, nothing saved
    refused = client.post(
        f"{LIST}saved/", {"name": " ", "query": "code__exact=x"}, follow=True
    )
    assert "A name of 1 to 80 characters." in refused.content.decode()
    refused = client.post(f"{LIST}saved/", {"name": "all", "query": "p=3"}, follow=True)
    assert "Filter or search first" in refused.content.decode()
    assert SavedSearch.objects.filter(user=reviewer).count() == 1
    assert client.get(f"{LIST}saved/").status_code == 405

    # another tenant's member sees none of hers, cannot delete it, and her query
    # (naming tenant A) shows them nothing of A
    olga = make_person("olga", tenant=other_tenant, role="admin")
    login(olga)
    html = client.get(LIST).content.decode()
    assert 'data-name="registered"' not in html
    assert client.post(f"{LIST}saved/{mine.pk}/delete/").status_code == 404
    assert SavedSearch.objects.filter(pk=mine.pk).exists()
    html = client.get(f"{LIST}?tenant={tenant.pk}").content.decode()
    assert "issue-9" not in html
    # staff of no tenant may neither save nor delete
    nobody = make_person("nobody", tenant=None, role=None)
    login(nobody)
    assert (
        client.post(
            f"{LIST}saved/", {"name": "x", "query": "code__exact=x"}
        ).status_code
        == 403
    )
    assert client.post(f"{LIST}saved/{mine.pk}/delete/").status_code == 403

    # the owner deletes it
    login(reviewer)
    assert client.post(f"{LIST}saved/{mine.pk}/delete/").status_code == 302
    assert not SavedSearch.objects.filter(pk=mine.pk).exists()


def test_a_person_keeps_at_most_the_limit(reviewer, monkeypatch):
    monkeypatch.setattr(saved_searches, "MAX_PER_PERSON", 2)
    for name in ("a", "b"):
        saved_searches.saved_search_save(
            user=reviewer, name=name, query="code__exact=x"
        )
    with pytest.raises(saved_searches.TooManySavedSearches):
        saved_searches.saved_search_save(user=reviewer, name="c", query="code__exact=x")
    # a name kept already is still replaced
    saved_searches.saved_search_save(user=reviewer, name="a", query="code__exact=y")


def test_one_name_per_person_in_the_database(reviewer):
    """Raw SQL: a second row of the same person and name is refused by the database."""
    saved_searches.saved_search_save(user=reviewer, name="a", query="code__exact=x")
    with (
        pytest.raises(IntegrityError, match="console_savedsearch_name_uniq"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            "INSERT INTO console_savedsearch (id, user_id, name, query, created_at)"
            " VALUES (gen_random_uuid(), %s, 'a', 'q', now())",
            [reviewer.pk],
        )
