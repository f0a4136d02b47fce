"""A list whose count stopped at the cap says so: "3+ tasks", not "3 tasks"
(console/paginator.py, the admin's pagination template)."""

from __future__ import annotations

import re

import pytest

from console.paginator import CappedPaginator

pytestmark = pytest.mark.django_db


def _count_line(html: str) -> str:
    (paginator,) = re.findall(r'<p class="paginator">(.*?)</p>', html, re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", paginator).split())


def test_a_count_past_the_cap_says_more(
    make_task, tenant, make_person, login, monkeypatch
):
    monkeypatch.setattr(CappedPaginator, "cap", 3)
    client = login(make_person("rita", tenant=tenant, role="reviewer"))
    for _ in range(3):
        make_task()

    # At the cap: every row was counted
    assert _count_line(client.get("/admin/tasks/task/").content.decode()) == "3 tasks"

    # Past it: the count stopped
    make_task()
    html = client.get("/admin/tasks/task/").content.decode()
    assert _count_line(html) == "3+ tasks"
    assert 'class="count-capped"' in html
