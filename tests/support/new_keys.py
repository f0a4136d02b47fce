"""Read a new key's secret off the page that shows it once (new_keys.html)."""

from __future__ import annotations

import re

from django.http import HttpResponseBase

_SECRET = re.compile(r'<code class="new-key-secret">([^<]+)</code>')


def shown_secrets(response: HttpResponseBase) -> list[str]:
    """The secrets the admin's new-keys page shows, in its order."""
    return _SECRET.findall(getattr(response, "content", b"").decode())


def shown_secret(response: HttpResponseBase) -> str:
    [secret] = shown_secrets(response)
    return secret
