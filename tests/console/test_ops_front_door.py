"""The front door: ``/`` leads to the admin, ``/api/v1/`` to the API, docs offline."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest
from django.contrib.staticfiles import finders


@pytest.mark.django_db
def test_the_root_redirects_to_the_admin(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == "/admin/"


@pytest.mark.django_db
def test_the_browsers_favicon_request_is_answered_without_a_warning(client, caplog):
    # Every fresh browser asks for /favicon.ico; a 404 printed 'WARNING
    # django.request Not Found: /favicon.ico' into the quiet `up` (walk of issue 24).
    with caplog.at_level("INFO", logger="django.request"):
        response = client.get("/favicon.ico")
    assert response.status_code == 204
    assert "max-age" in response["Cache-Control"]
    assert not [r for r in caplog.records if r.name == "django.request"], caplog.text


@pytest.mark.django_db
def test_the_api_root_answers_anonymous_get_with_links(client):
    response = client.get("/api/v1/")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["schema"] == "http://testserver/api/schema/"
    assert body["docs"] == "http://testserver/api/docs/"
    assert body["redoc"] == "http://testserver/api/redoc/"
    assert body["resources"]["tasks"]["href"] == "http://testserver/api/v1/tasks"
    assert {"tasks", "contracts", "takeover_queue", "events"} <= set(body["resources"])
    # Every concrete link answers (not 404): it names real routes.
    for name in ("schema", "docs", "redoc"):
        assert client.get(urlsplit(body[name]).path).status_code == 200


@pytest.mark.django_db
def test_the_api_root_refuses_writes_without_a_500(client):
    assert (
        client.post("/api/v1/", {}, content_type="application/json").status_code == 405
    )


@pytest.mark.django_db
def test_the_api_root_is_not_an_operation_of_the_schema(client):
    document = client.get("/api/schema/?format=json").json()
    assert "/api/v1/" not in document["paths"]


class _References(HTMLParser):
    """Every URL an HTML page makes the browser fetch or follow."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_script = tag == "script"
        for name, value in attrs:
            if name in ("src", "href", "action", "data-src") and value:
                self.urls.append(value)

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts.append(data)


@pytest.mark.django_db
@pytest.mark.parametrize("page", ["/api/docs/", "/api/redoc/"])
def test_the_docs_pages_reference_no_external_host(client, page):
    response = client.get(page)
    assert response.status_code == 200
    html = response.content.decode()
    parser = _References()
    parser.feed(html)

    hosts = {urlsplit(url).hostname for url in parser.urls} - {None}
    # Absolute URLs anywhere in the page, inline scripts included.
    hosts |= {urlsplit(m).hostname for m in re.findall(r"https?://[^\s\"'<>)]+", html)}
    assert hosts <= {"testserver"}, hosts
    assert any("drf_spectacular_sidecar" in url for url in parser.urls)


@pytest.mark.django_db
@pytest.mark.parametrize("page", ["/api/docs/", "/api/redoc/"])
def test_the_sidecar_assets_are_static_files_of_this_server(client, settings, page):
    # collectstatic (``manage.py up``) gathers what the finders find; WhiteNoise
    # serves it. tests/browser/test_api_docs_offline.py loads them for real.
    html = client.get(page).content.decode()
    parser = _References()
    parser.feed(html)
    local = [u for u in parser.urls if "drf_spectacular_sidecar" in u]
    assert local
    for url in local:
        assert url.startswith(settings.STATIC_URL)
        assert finders.find(url.removeprefix(settings.STATIC_URL)), url
