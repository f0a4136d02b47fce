"""The API's JSON parser: DRF's, with the limits every body must keep to.

DRF's own parser hands ``json.load`` a body of any size and depth: a 2 KB body of
1,000 nested arrays raised ``RecursionError`` (a 500), a 3 MB body sent without an
``Idempotency-Key`` was never held to ``DATA_UPLOAD_MAX_MEMORY_SIZE``, and ``1e999``
parsed to an infinity PostgreSQL cannot store. Here each of those is a 4xx.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework import parsers

from .exceptions import MalformedRequest

# Deep enough for any task input or contract; shallow enough that nothing after
# the parser (validation, RFC 8785 hashing, jsonb) comes near Python's recursion
# limit. Documented in docs/api.md, "Errors".
MAX_DEPTH = 64


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {text[:20]}")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_depth(value: Any) -> int:
    """How deeply arrays and objects nest in ``value`` (a scalar is 0), iteratively."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


class JSONParser(parsers.JSONParser):
    """``application/json`` bodies: size-, depth- and number-checked."""

    def parse(
        self,
        stream: IO[bytes],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        # DRF's own check that the charset is a text encoding (newer than its stubs).
        encoding = parsers.get_encoding(parser_context or {})  # type: ignore[attr-defined]
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read() if limit is None else stream.read(limit + 1)
        if limit is not None and len(raw) > limit:
            raise RequestDataTooBig("The request body is too large.")
        try:
            data = json.loads(
                raw.decode(encoding),
                parse_constant=_no_constant,
                parse_float=_finite_float,
            )
        except RecursionError:  # deeper than the interpreter goes
            raise _too_deep() from None
        except ValueError as exc:  # also UnicodeDecodeError
            raise MalformedRequest(
                "The request body is not valid JSON.", error=str(exc)[:200]
            ) from None
        if json_depth(data) > MAX_DEPTH:
            raise _too_deep()
        return data


def _too_deep() -> MalformedRequest:
    return MalformedRequest(
        f"The JSON body nests deeper than {MAX_DEPTH} levels.", max_depth=MAX_DEPTH
    )
