"""Tenant deletion: the declared policy and the one privileged purge path.

It empties tables of every app (portal, tasks, audit), so it sits above them all
(docs/style.md R1); ``manage.py delete_tenant`` runs it. The policy and its reasons
are in docs/tenant-deletion.md.
"""
