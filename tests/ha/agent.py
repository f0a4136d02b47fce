"""One agent process of the failover test: governed actions through the REST API.

Run as ``python -m tests.ha.agent --base-url URL --api-key KEY --name NAME
--stop FILE --out FILE``; it starts no new action once the file ``--stop`` exists. It takes ``create_ticket`` actions on the demo's
``ticket-desk`` one after the other, as the example agent does
(examples/customer_issue_agent.py): it records the issue's version
(``PUT /api/v1/object-versions/...``), then takes the action
(``POST /api/v1/actions``) under the issue's own business key. It repeats each the same call until the portal answers it for good,
as an agent must (docs/api.md): a ``503 DATABASE_UNAVAILABLE``, a refused
connection, a ``409 REQUEST_IN_FLIGHT`` or a ``202 unknown`` is repeated after its
``Retry-After`` (capped, to keep the test short). A key whose call is still not
answered after ``KEY_PATIENCE_S``, or still ``409 REQUEST_IN_FLIGHT`` after
``IN_FLIGHT_PATIENCE_S``, is left in doubt, unacknowledged, and the agent moves on:
the lease a request cut by the failover took lapses only after two minutes
(``tasks/actions.py``, ``LEASE_TTL_S``), and a repeat settles the key then.

Every response is one JSON line in ``--out``: the key, when it was sent and
answered (``time.time()``, the same clock as the test's), its status and body
fields. No Django here: this is a client, like any agent.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import httpx

KEY_PATIENCE_S = 20.0
IN_FLIGHT_PATIENCE_S = 3.0
MAX_BACKOFF_S = 0.5
REQUEST_TIMEOUT_S = 30.0


def _body(key: str, object_id: str) -> dict[str, Any]:
    read_at = dt.datetime.now(dt.UTC).isoformat()
    return {
        "action": "create_ticket",
        "target": "ticket-desk",
        "object_type": "customer_issue",
        "object_id": object_id,
        "object_version": "7",
        "fields": {
            "email": {"value": "ana@example.com", "source": "crm", "read_at": read_at},
            "plan": {"value": "pro", "source": "billing", "read_at": read_at},
        },
        "arguments": {
            "queue": "billing",
            "summary": f"Refund {key}",
            "customer": "ana",
        },
        "idempotency_key": key,
        "contract_key": "customer-issue",
    }


def _record(out: Any, **fields: Any) -> None:
    out.write(json.dumps(fields) + "\n")
    out.flush()


def run(*, base_url: str, api_key: str, name: str, stop: Path, out: Any) -> None:
    client = httpx.Client(
        base_url=base_url,
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=REQUEST_TIMEOUT_S,
    )
    number = 0
    while not stop.exists():
        number += 1
        key = f"ha-{name}-{number}"
        object_id = f"{name}-{number}"
        given_up_at = time.time() + KEY_PATIENCE_S
        in_flight_since: float | None = None
        version_recorded = False
        while True:
            sent = time.time()
            try:
                if not version_recorded:
                    answer = client.put(
                        f"/api/v1/object-versions/customer_issue/{object_id}",
                        json={"version": "7"},
                    )
                    if answer.is_success:
                        version_recorded = True
                        continue
                else:
                    answer = client.post("/api/v1/actions", json=_body(key, object_id))
            except httpx.TransportError as error:
                _record(
                    out,
                    key=key,
                    sent=sent,
                    answered=time.time(),
                    status=None,
                    error=type(error).__name__,
                )
                wait = MAX_BACKOFF_S
            else:
                try:
                    payload = answer.json()
                except ValueError:
                    payload = {"raw": answer.text[:500]}
                _record(
                    out,
                    key=key,
                    step="action" if version_recorded else "version",
                    sent=sent,
                    answered=time.time(),
                    status=answer.status_code,
                    content_type=answer.headers.get("content-type"),
                    retry_after=answer.headers.get("retry-after"),
                    code=payload.get("code"),
                    outcome=payload.get("status"),
                    operation_id=payload.get("operation_id"),
                    task_id=payload.get("task_id"),
                    provider_reference=payload.get("provider_reference"),
                    reason_code=payload.get("reason_code"),
                )
                if answer.status_code == 200:
                    break  # answered for good (verified, or a settled refusal)
                if answer.status_code not in (202, 409, 503):
                    break  # not retryable: the test reports it
                wait = min(float(answer.headers.get("retry-after") or 0), MAX_BACKOFF_S)
                if answer.status_code == 409:
                    in_flight_since = in_flight_since or sent
                    if sent - in_flight_since > IN_FLIGHT_PATIENCE_S:
                        given_up_at = sent
                else:
                    in_flight_since = None
            if time.time() >= given_up_at:
                _record(
                    out,
                    key=key,
                    sent=sent,
                    answered=time.time(),
                    status=None,
                    error="gave_up",
                )
                break
            time.sleep(wait)
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--stop", type=Path, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.out, "a", encoding="utf-8") as out:
        run(
            base_url=args.base_url,
            api_key=args.api_key,
            name=args.name,
            stop=args.stop,
            out=out,
        )


if __name__ == "__main__":
    main()
