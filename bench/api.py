"""The HTTP API under gunicorn against raw psycopg: one command, figures in the docs.

    .venv/bin/python bench/api.py [--duration 5] [--clients 1,4,16] [--workers 4]
                                  [--database-url postgres://.../portal_api_bench]

Drops, creates and migrates its own database (the name must contain "bench"), starts
gunicorn on it, and measures reserve-operation and transition requests against the
same statements through raw psycopg, in alternating slices of the same run. Writes
the ``bench:api`` section of docs/performance.md and reports/bench-api.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script: make the repository, not bench/, the first import root.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.api_coordinator import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
