"""Which kind of process this is, where that decides what it may hold.

The web server faces the internet, so it holds no audit signing key
(docs/audit-integrity.md, "The signing key"): ``config/wsgi.py`` marks its process
as the web before Django is set up, and the signer (``audit.checkpoints``) refuses
to load the key in a process so marked. Every other process (Celery workers and
beat, management commands, tests) is unmarked.
"""

from __future__ import annotations

_web = False


def mark_web() -> None:
    """Mark this process as the web server, for good (there is no unmarking)."""
    global _web
    _web = True


def is_web() -> bool:
    """Whether ``config/wsgi.py`` marked this process as the web server."""
    return _web
