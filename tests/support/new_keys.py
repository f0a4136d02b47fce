"""Read a new key's secret off the page that shows it once (new_keys.html)."""

from __future__ import annotations

import re

from django.http import HttpResponse

_SECRET = re.compile(r'<code class="new-key-secret">([^<]+)</code>')


def shown_secrets(response: HttpResponse) -> list[str]:
    """The secrets the admin's new-keys page shows, in its order."""
    return _SECRET.findall(response.content.decode())


def shown_secret(response: HttpResponse) -> str:
    [secret] = shown_secrets(response)
    return secret
