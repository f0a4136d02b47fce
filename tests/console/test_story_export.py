"""Export of the event browser's selection: streamed, scoped, role-checked, audited."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.db import transaction

from audit import services as audit_services
from audit.models import Event, EventCode
from portal.actors import Actor

pytestmark = pytest.mark.django_db

SECRET = "agp_0123456789ab.x"


def _events(task, n, *, code=EventCode.TASK_TRANSITIONED):
    with transaction.atomic():
        return [
            audit_services.event_append(
                tenant_id=task.tenant_id,
                task_id=task.pk,
                code=code,
                actor=Actor.system("export-test"),
                data={"i": i, "token": SECRET, "note": "=HYPERLINK(1)"},
            )
            for i in range(n)
        ]


def _body(response) -> str:
    assert response.status_code == 200, response.status_code
    assert response.streaming
    return b"".join(response.streaming_content).decode()


def _exports(tenant):
    return list(
        Event.objects.filter(tenant=tenant, code=EventCode.AUDIT_EXPORTED).order_by(
            "id"
        )
    )


def test_a_reviewer_exports_the_filtered_selection_as_csv(
    make_task, tenant, other_tenant, make_person, login
):
    # given two tasks' events in the reviewer's tenant and some in another tenant
    task, other = make_task(), make_task()
    wanted = _events(task, 5)
    _events(other, 3, code=EventCode.TASK_WOKEN)
    foreign = _events(make_task(tenant=other_tenant), 4)
    reviewer = make_person("rita", tenant=tenant, role="reviewer")
    client = login(reviewer)
    # when the reviewer exports the selection filtered to one task
    response = client.get("/admin/audit/event/export/csv/", {"task": str(task.pk)})
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(_body(response))))
    # then exactly that task's events are in it, secrets redacted, formulas defused
    assert sorted(row["id"] for row in rows) == sorted(str(e) for e in wanted)
    assert {row["tenant"] for row in rows} == {tenant.slug}
    assert not {str(e) for e in foreign} & {row["id"] for row in rows}
    payload = json.loads(rows[0]["payload"])
    assert payload["token"] == "[REDACTED]" and payload["note"] == "=HYPERLINK(1)"
    assert all(SECRET not in row["payload"] for row in rows)
    # and the export is itself recorded, with who, which filter and how many rows
    (recorded,) = _exports(tenant)
    assert (recorded.actor_type, recorded.actor_id) == ("user", str(reviewer.pk))
    assert recorded.payload["rows"] == 5 and recorded.payload["complete"] is True
    assert recorded.payload["filters"] == {"task": str(task.pk)}
    assert recorded.payload["format"] == "csv"
    assert not _exports(other_tenant)


def test_a_csv_cell_that_a_spreadsheet_would_run_is_quoted_as_text(
    make_task, tenant, make_person, login
):
    task = make_task()
    with transaction.atomic():
        audit_services.event_append(
            tenant_id=task.tenant_id,
            task_id=task.pk,
            code=EventCode.TASK_WOKEN,
            actor=Actor.system("=cmd|'/c calc'!A1"),
        )
    client = login(make_person("rita", tenant=tenant, role="reviewer"))
    body = _body(client.get("/admin/audit/event/export/csv/", {"task": str(task.pk)}))
    (row,) = csv.DictReader(io.StringIO(body))
    assert row["actor_id"] == "'=cmd|'/c calc'!A1"


def test_json_lines_respect_the_search_and_parse_line_by_line(
    make_task, tenant, make_person, login
):
    task = make_task(trace_id="a" * 32)
    _events(task, 3)
    _events(make_task(), 2)
    client = login(make_person("rita", tenant=tenant, role="reviewer"))
    body = _body(client.get("/admin/audit/event/export/jsonl/", {"q": "a" * 32}))
    lines = [json.loads(line) for line in body.splitlines()]
    assert len(lines) == 3 and {line["task_id"] for line in lines} == {str(task.pk)}
    assert lines[0]["payload"]["token"] == "[REDACTED]"
    assert lines[0]["created_at"].startswith("20")
    (recorded,) = _exports(tenant)
    assert recorded.payload["rows"] == 3 and recorded.payload["format"] == "jsonl"


def test_support_may_not_export_and_nothing_is_recorded(
    make_task, tenant, make_person, login
):
    _events(make_task(), 2)
    client = login(make_person("sam", tenant=tenant, role="support"))
    assert client.get("/admin/audit/event/").status_code == 200
    page = client.get("/admin/audit/event/").content.decode()
    assert "Export CSV" not in page
    assert client.get("/admin/audit/event/export/csv/").status_code == 403
    assert client.get("/admin/audit/event/export/jsonl/").status_code == 403
    assert not _exports(tenant)


def test_a_tenant_filter_outside_the_export_tenants_is_refused(
    make_task, tenant, other_tenant, make_person, login
):
    # given a person who reviews tenant A and is support in tenant B
    person = make_person("mixed", tenant=tenant, role="reviewer")
    from portal import services as portal_services
    from portal.models import Role

    portal_services.membership_grant(
        tenant=other_tenant, user=person, role=Role.SUPPORT
    )
    _events(make_task(), 2)
    theirs = _events(make_task(tenant=other_tenant), 2)
    client = login(person)
    # when they ask for B's events, they are refused; without a filter, B is left out
    refused = client.get(
        "/admin/audit/event/export/csv/", {"tenant": str(other_tenant.pk)}
    )
    assert refused.status_code == 403
    rows = list(
        csv.DictReader(io.StringIO(_body(client.get("/admin/audit/event/export/csv/"))))
    )
    assert len(rows) == 2 and not {str(e) for e in theirs} & {r["id"] for r in rows}
    assert not _exports(other_tenant)
    # and the page offers export (A) while the list shows both tenants' events
    page = client.get("/admin/audit/event/").content.decode()
    assert "Export CSV" in page and str(theirs[0]) in page


def test_a_member_of_another_tenant_exports_nothing_of_this_one(
    make_task, tenant, other_tenant, make_person, login
):
    mine = _events(make_task(), 3)
    client = login(make_person("bob", tenant=other_tenant, role="reviewer"))
    body = _body(client.get("/admin/audit/event/export/jsonl/"))
    assert not any(str(e) in body for e in mine)
    assert (
        client.get(
            "/admin/audit/event/export/csv/", {"tenant": str(tenant.pk)}
        ).status_code
        == 403
    )
    (recorded,) = _exports(other_tenant)
    assert recorded.payload["rows"] == 0


def test_an_export_cut_off_by_the_client_is_recorded_as_incomplete(
    make_task, tenant, make_person, login
):
    from console import export

    task = make_task()
    _events(task, 5)
    reviewer = make_person("rita", tenant=tenant, role="reviewer")
    stream = export.export_stream(
        queryset=Event.objects.filter(tenant=tenant, task_id=task.pk).order_by("id"),
        fmt="jsonl",
        by=reviewer,
        tenants={tenant.pk: tenant.slug},
        filters={},
        chunk_rows=2,
    )
    assert next(stream).count(b"\n") == 2  # the first chunk went out
    stream.close()  # what the server does when the client goes away
    (recorded,) = _exports(tenant)
    assert recorded.payload["rows"] == 2 and recorded.payload["complete"] is False


def test_unknown_formats_and_posts_are_refused(tenant, make_person, login):
    client = login(make_person("rita", tenant=tenant, role="reviewer"))
    assert client.get("/admin/audit/event/export/xlsx/").status_code == 404
    assert client.post("/admin/audit/event/export/csv/").status_code == 405


def test_rows_carry_the_actors_names_and_their_place_in_the_chain(
    make_task, tenant, make_person, make_agent, login
):
    # given a task's events by an agent, a person and a component
    task = make_task()
    agent = make_agent(tenant=tenant)
    sam = make_person("sam", tenant=tenant, role="support")
    with transaction.atomic():
        for actor in (Actor.of_agent(agent), Actor.of_user(sam), Actor.system("relay")):
            audit_services.event_append(
                tenant_id=task.tenant_id,
                task_id=task.pk,
                code=EventCode.TASK_WOKEN,
                actor=actor,
            )
    client = login(make_person("rita", tenant=tenant, role="reviewer"))
    stored = {
        str(pk): (seq, prev, digest)
        for pk, seq, prev, digest in Event.objects.filter(task_id=task.pk).values_list(
            "pk", "chain_seq", "prev_hash", "hash"
        )
    }
    assert all(seq is not None and digest for seq, _, digest in stored.values())

    # when the reviewer exports them, as CSV and as JSON Lines
    body = _body(client.get("/admin/audit/event/export/csv/", {"task": str(task.pk)}))
    rows = list(csv.DictReader(io.StringIO(body)))
    lines = [
        json.loads(line)
        for line in _body(
            client.get("/admin/audit/event/export/jsonl/", {"task": str(task.pk)})
        ).splitlines()
    ]

    # then each row names its actor as the pages do, and its chain place and hashes
    for exported in (rows, lines):
        names = {(r["actor_type"], r["actor_name"]) for r in exported}
        assert names == {("agent", agent.name), ("user", "sam"), ("system", "relay")}
        for r in exported:
            seq, prev, digest = stored[r["id"]]
            assert str(r["chain_seq"]) == str(seq)
            assert (r["prev_hash"] or None) == prev
            assert r["hash"] == digest
    header = list(rows[0])
    assert header[header.index("actor_id") + 1] == "actor_name"
    assert header[-5:] == [
        "chain_seq",
        "prev_hash",
        "hash",
        "payload_digest",
        "payload",
    ]


def test_each_actor_is_named_once_per_export_not_once_per_chunk(
    make_task, tenant, make_person, make_agent
):
    # given 12 events alternating between one agent and one person, and a later
    # chunk that brings a second agent
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from console import export

    task = make_task()
    first, second = make_agent(tenant=tenant), make_agent(tenant=tenant)
    sam = make_person("sam", tenant=tenant, role="support")
    actors = [Actor.of_agent(first), Actor.of_user(sam)] * 5 + [
        Actor.of_agent(second)
    ] * 2
    with transaction.atomic():
        for actor in actors:
            audit_services.event_append(
                tenant_id=task.tenant_id,
                task_id=task.pk,
                code=EventCode.TASK_WOKEN,
                actor=actor,
            )
    reviewer = make_person("rita", tenant=tenant, role="reviewer")

    # when they are exported in chunks of two rows (six chunks)
    with CaptureQueriesContext(connection) as queries:
        body = b"".join(
            export.export_stream(
                queryset=Event.objects.filter(task_id=task.pk).order_by("chain_seq"),
                fmt="jsonl",
                by=reviewer,
                tenants={tenant.pk: tenant.slug},
                filters={},
                chunk_rows=2,
            )
        )

    # then every row carries its actor's name, and the names took three queries:
    # agents and people in the first chunk, the second agent in the last one
    names = [json.loads(line)["actor_name"] for line in body.splitlines()]
    assert names == [first.name, "sam"] * 5 + [second.name] * 2
    lookups = [
        q["sql"]
        for q in queries.captured_queries
        if 'FROM "portal_agent"' in q["sql"] or 'FROM "auth_user"' in q["sql"]
    ]
    assert len(lookups) == 3, lookups
