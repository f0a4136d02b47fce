"""Tasks, operations, leases, contracts and the action gateway."""

from __future__ import annotations
