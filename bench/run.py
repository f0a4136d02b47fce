"""Service layer against raw psycopg: one command, figures in docs/performance.md.

    .venv/bin/python bench/run.py [--duration 5] [--clients 1,4,8] [--rounds 5]
        [--workloads transition,reservation,claim] [--database-url postgres://...]
        [--what-if] [--no-docs] [--json reports/bench-service-layer.json] [--reuse]

Drops, creates and migrates its own database (default portal_bench on
127.0.0.1:5432; the name must contain "bench"). ``--what-if`` adds the service on a
Django connection with server-side binding and prepared statements forced on. Where a
client's time goes: ``bench/profile_client.py``. Against the peers (DBOS Transact,
Procrastinate, a lean one-statement baseline): ``bench/peers.py``. On 1M tasks and
10M events against empty tables: ``bench/flat.py`` (``--reuse`` keeps its rows).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script: make the repository, not bench/, the first import root.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.service_layer import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
