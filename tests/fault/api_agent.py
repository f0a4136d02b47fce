"""One agent of the API crash test: a separate process that writes and probes.

``python -m tests.fault.api_agent BASE_URL NAME SECRET OUT STOP``: until the file
STOP exists, register a task (``client_task_id`` ``NAME-<n>``), repeating the same
``n`` until the portal acknowledges it (200 or 201; registration is idempotent on
``client_task_id``), then list the tenant's tasks (the probe). Every answer, and every
transport error, is one JSON line in OUT, written and flushed as it comes: the test
reads the file while the agent runs. Only ``httpx``: no Django, no database.

A 503 is retried after a short pause, not the ``Retry-After`` it names (1 s): the
test wants requests in flight while the server comes back, and checks the header.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

PAUSE_AFTER_503_S = 0.2
TIMEOUT_S = 30.0


def _answer(response: httpx.Response) -> dict[str, Any]:
    line: dict[str, Any] = {
        "status": response.status_code,
        "ctype": response.headers.get("content-type", ""),
        "retry_after": response.headers.get("retry-after"),
    }
    try:
        body = response.json()
    except ValueError:
        line["body"] = response.text[:300]
        return line
    if response.status_code >= 300:
        line["code"] = body.get("code") if isinstance(body, dict) else None
    return line | {"json": body}


def main(base_url: str, name: str, secret: str, out_path: str, stop_path: str) -> None:
    stop = Path(stop_path)
    headers = {"Authorization": f"Bearer {secret}"}
    with (
        Path(out_path).open("a", encoding="utf-8") as out,
        httpx.Client(base_url=base_url, headers=headers, timeout=TIMEOUT_S) as http,
    ):

        def call(
            kind: str, method: str, url: str, tag: str = "", **kwargs: Any
        ) -> dict[str, Any]:
            began = time.time()
            try:
                line = _answer(http.request(method, url, **kwargs))
            except httpx.TransportError as error:
                line = {"status": None, "error": f"{type(error).__name__}: {error}"}
            line |= {"kind": kind, "tag": tag, "t0": began, "t": time.time()}
            summary = {k: v for k, v in line.items() if k != "json"}
            if kind == "write" and line.get("status") in (200, 201):
                summary |= {"task_id": line["json"]["id"]}
            if kind == "probe" and line.get("status") == 200:
                summary |= {
                    "seen": [t["client_task_id"] for t in line["json"]["results"]]
                }
            out.write(json.dumps(summary) + "\n")
            out.flush()
            return line

        n = 0
        while not stop.exists():
            client_task_id = f"{name}-{n}"
            tries = 0
            while True:  # a write is finished before the agent looks at STOP again
                tries += 1
                line = call(
                    "write",
                    "POST",
                    "/api/v1/tasks",
                    tag=client_task_id,
                    json={
                        "client_task_id": client_task_id,
                        "workflow_key": "customer-issue",
                        "workflow_version": "1",
                        "object_type": "customer_issue",
                        "object_id": client_task_id,
                        "object_version": "1",
                    },
                )
                if line["status"] in (200, 201):
                    break
                time.sleep(PAUSE_AFTER_503_S)
            n += 1
            call("probe", "GET", "/api/v1/tasks", params={"page_size": 50})


if __name__ == "__main__":
    main(*sys.argv[1:6])
