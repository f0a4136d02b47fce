"""The process launcher: ``manage.py up``, ``manage.py test`` and embedded PostgreSQL.

It starts and supervises every other process (database, ticket desk, web server,
Celery worker and beat, pytest), so it sits above the apps (docs/style.md R1), outside
``portal``. The management commands ``up`` and ``test`` are thin wrappers around
``launcher.up`` and ``launcher.suite``.
"""
