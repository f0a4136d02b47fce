"""Service layer against raw psycopg: one command, figures in docs/performance.md.

    .venv/bin/python bench/run.py [--duration 5] [--clients 1,4,8]
                                  [--database-url postgres://.../portal_bench]

Drops, creates and migrates its own database (the name must contain "bench").
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script: make the repository, not bench/, the first import root.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.service_layer import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
