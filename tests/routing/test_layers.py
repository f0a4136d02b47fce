"""routing sits in two layers (docs/routing.md): what tasks calls (models,
selectors, services: the hook and the SLA) imports nothing of tasks or console;
only what sends over the network (delivery, jobs) uses the gateway's outbound
policy from tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_layering import ROOT, imports_of

BELOW_TASKS = ("models", "selectors", "services", "exceptions", "apps")


@pytest.mark.parametrize("name", BELOW_TASKS)
def test_what_tasks_calls_imports_nothing_above_it(name: str) -> None:
    path: Path = ROOT / "routing" / f"{name}.py"
    assert imports_of(path, "tasks", "console") == []


def test_only_delivery_and_jobs_reach_into_tasks() -> None:
    """delivery for the outbound policy (and its refusal), jobs for the approvals'
    expiry."""
    users = {
        path.name: imports_of(path, "tasks")
        for path in (ROOT / "routing").rglob("*.py")
        if imports_of(path, "tasks", "console")
    }
    assert users == {"delivery.py": ["tasks", "tasks.exceptions"], "jobs.py": ["tasks"]}
