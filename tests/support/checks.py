"""The gateway's check verdicts as the events record them (issue 23): each pass is
one ``gateway.checked`` event listing its checks, and the last-moment check before
the call is listed in the ``operation.executing`` event."""

from __future__ import annotations

from typing import Any

from audit.models import Event, EventCode


def check_entries(operation_id: Any) -> list[dict[str, Any]]:
    """Every check entry the operation's events list, oldest first; each has
    ``check`` and ``verdict`` (and the event's ``reason`` code on a refusal)."""
    return [
        {**entry, "reason": reason if entry["verdict"] == "refused" else None}
        for payload, reason in Event.objects.filter(
            operation_id=operation_id,
            code__in=(EventCode.GATEWAY_CHECKED, EventCode.OPERATION_EXECUTING),
        )
        .order_by("id")
        .values_list("payload", "reason_code")
        for entry in payload.get("checks", ())
    ]
