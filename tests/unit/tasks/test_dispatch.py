"""The execute endpoint's dispatch, outside the view: Prefer parsing and the nudge."""

from __future__ import annotations

import logging
import uuid

import pytest

from tasks import dispatch, jobs


@pytest.mark.parametrize(
    ("prefer", "wanted"),
    [
        (None, False),
        ("", False),
        ("respond-async", True),
        ("Respond-Async, wait=10", True),
        ("return=minimal; respond-async", True),
        ("return=minimal", False),
    ],
)
def test_prefer_asks_for_async_only_with_respond_async(
    prefer: str | None, wanted: bool
) -> None:
    """``respond-async`` anywhere in the header, in any case, queues the call."""
    assert dispatch.prefers_respond_async(prefer) is wanted


def test_a_broker_failure_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The queued operation is pending in the database; the settle job runs it."""

    # given a broker that refuses every message
    def refuse(**kwargs: str) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(jobs.run_operation_job, "delay", refuse)
    operation_id = uuid.uuid4()

    # when a run is enqueued
    with caplog.at_level(logging.WARNING, logger="tasks.dispatch"):
        dispatch.operation_run_enqueue(
            tenant_id=uuid.uuid4(), operation_id=operation_id
        )

    # then nothing is raised and the operation is named in a warning
    assert f"could not enqueue operation {operation_id}" in caplog.text
