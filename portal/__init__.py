"""Tenancy and identity (tenants, agents, keys, grants, memberships) and the plumbing
every app builds on: the ground floor, which imports no other app; the wiring above
the apps is in ``config/``."""

from __future__ import annotations
