"""Read a new key's secret off the page that shows it once (new_keys.html), and the
list pages' one-time form token that issuing one spends."""

from __future__ import annotations

import re

from django.http import HttpResponseBase
from django.test import Client

_SECRET = re.compile(r'<code class="new-key-secret">([^<]+)</code>')


def shown_secrets(response: HttpResponseBase) -> list[str]:
    """The secrets the admin's new-keys page shows, in its order."""
    return _SECRET.findall(getattr(response, "content", b"").decode())


def shown_secret(response: HttpResponseBase) -> str:
    [secret] = shown_secrets(response)
    return secret


_ONCE = re.compile(r'<input type="hidden" name="once" value="([^"]+)"')


def form_token(client: Client, url: str) -> str:
    """The one-time token of the list page's action bar (console/once.py), as the
    browser would send it with the form: read off the page."""
    page = client.get(url)
    found = _ONCE.search(page.content.decode())
    assert found, f"no one-time token on {url} ({page.status_code})"
    return found.group(1)
