"""What ``audit.redaction.redact`` costs on 2 KB, 200 KB and 2 MB inputs.

    .venv/bin/python bench/redaction.py [--sizes 2000,200000,2000000] [--repeat 3]
        [--json out.json]

For each size and shape (``one_string``: one string of that size, as issue 19
measured; ``many_strings``: 200-character notes in lists of 50; ``nested``: dicts
five levels deep, two children each, four notes in each), builds the payload
and times, best of ``--repeat``:

- ``redact``: ``redact(payload, tenant_id=…)``, as an operation's input is stored;
- ``baseline``: ``json.dumps`` and ``hashlib.sha256`` of the same payload, the cost
  any handling of it pays (it is read, encoded and hashed once anyway).

Prints a table (milliseconds, the ratio of the two, and the size of what is stored),
or with ``--json`` writes the rows there too. Each run's payload differs in its
first character, so no cache of an earlier run answers. No database is needed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Run as a script: make the repository, not bench/, the first import root.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

TENANT = uuid.UUID("00000000-0000-4000-8000-0000000000be")
SIZES = (2_000, 200_000, 2_000_000)
# Plain prose with an e-mail address, a card-like number and a token-like word:
# the detectors find something in it, as in a real note.
NOTE = (
    "Customer ana.lima@example.com asked to refund order 4417 (card 4111 1111 1111 "
    "1111) after build 7f3a9c2e1b; the agent retried twice and then escalated it. "
)


def _note(salt: str, chars: int) -> str:
    text = salt + NOTE * (chars // len(NOTE) + 1)
    return text[:chars]


def one_string(size: int, salt: str) -> dict[str, Any]:
    """One string of ``size`` characters (issue 19's ``{"blob": "x" * n}``)."""
    return {"blob": salt + "x" * (size - 1)}


def many_strings(size: int, salt: str) -> dict[str, Any]:
    """200-character notes, 50 to a list, as many lists as ``size`` needs."""
    notes = max(1, size // 200)
    lists = [
        [_note(f"{salt}{i}-{j}", 200) for j in range(min(50, notes - i * 50))]
        for i in range((notes + 49) // 50)
    ]
    return {f"batch_{i}": batch for i, batch in enumerate(lists)}


def nested(size: int, salt: str) -> dict[str, Any]:
    """Dicts five levels deep, two children each; every dict holds four notes."""
    chars = max(16, size // (4 * 31))  # 31 dicts of four notes

    def level(depth: int, path: str) -> dict[str, Any]:
        node: dict[str, Any] = {
            f"note_{k}": _note(f"{salt}{path}.{k}", chars) for k in range(4)
        }
        if depth < 5:
            node["children"] = [level(depth + 1, f"{path}.{c}") for c in range(2)]
        return node

    return level(1, "r")


SHAPES: dict[str, Callable[[int, str], dict[str, Any]]] = {
    "one_string": one_string,
    "many_strings": many_strings,
    "nested": nested,
}


def _best(function: Callable[[str], object], repeat: int) -> float:
    times = []
    for run in range(repeat):
        salt = "abcdefghij"[run % 10]
        started = time.perf_counter()
        function(salt)
        times.append(time.perf_counter() - started)
    return min(times)


def measure(shape: str, size: int, repeat: int) -> dict[str, Any]:
    """One row: the best ``redact`` and baseline times for one shape and size."""
    from audit.redaction import json_dumps, redact

    make = SHAPES[shape]
    payloads = {salt: make(size, salt) for salt in "abcdefghij"[: max(1, repeat)]}

    def redact_one(salt: str) -> object:
        return redact(payloads[salt], tenant_id=TENANT)

    def baseline(salt: str) -> object:
        return hashlib.sha256(json.dumps(payloads[salt]).encode()).hexdigest()

    # Its own salt: a cache of this call must not answer a timed one.
    stored = json_dumps(redact(make(size, "z"), tenant_id=TENANT))
    redact_s = _best(redact_one, repeat)
    baseline_s = _best(baseline, repeat)
    return {
        "shape": shape,
        "input_bytes": len(json_dumps(payloads["a"]).encode()),
        "redact_ms": round(redact_s * 1000, 2),
        "baseline_ms": round(baseline_s * 1000, 3),
        "ratio": round(redact_s / baseline_s, 1) if baseline_s else None,
        "stored_bytes": len(stored.encode()),
    }


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/redaction.py", description=__doc__)
    parser.add_argument(
        "--sizes",
        default=",".join(str(size) for size in SIZES),
        help="input sizes in characters, comma-separated",
    )
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for size in (int(size) for size in args.sizes.split(",")):
        for shape in args.shapes.split(","):
            row = measure(shape, size, args.repeat)
            rows.append(row)
            print(
                f"{row['shape']:<13} {row['input_bytes']:>10,} "
                f"{row['redact_ms']:>11,.2f} {row['baseline_ms']:>12,.3f} "
                f"{row['ratio']:>7} {row['stored_bytes']:>9,}",
                flush=True,
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("PORTAL_DEV_MODE", "1")  # benchmarks run the dev setup
    import django

    django.setup()
    print(
        f"{'shape':<13} {'input B':>10} {'redact ms':>11} {'baseline ms':>12} "
        f"{'ratio':>7} {'stored B':>9}"
    )
    rows = run(args)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
