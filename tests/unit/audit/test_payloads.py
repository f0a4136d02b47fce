"""Every event a service writes builds its payload through ``audit/payloads.py``.

Issue 24 §4: one typed definition per event code, so that mypy checks each payload's
keys and value types. ``event_append`` itself takes any mapping (tests write odd
payloads on purpose), so this test reads the source, as ``test_layering.py`` does:
outside ``tests/`` and ``bench/`` (both write synthetic payloads on purpose), no
writer (``event_append``, ``slotted_event_params`` or a function that hands its own
``data`` parameter to one) is given a bare dict literal, and a payload built as
``payloads.X(...)`` next to a literal ``EventCode.Y`` is ``Y``'s definition.

The one dict literal allowed starts with a typed payload spread (``{**payloads.X(...),
**context}``): the typed keys first, then facts whose keys vary with their source
(a denial's error context, limits.services ``denial_record``).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from audit import payloads
from audit.models import EventCode
from audit.services import json_text

ROOT: Final = Path(__file__).resolve().parents[3]
SKIPPED: Final = (".venv", "var", "tests", "bench", "node_modules")
WRITERS: Final = frozenset({"event_append", "slotted_event_params"})
DATA_KEYWORDS: Final = ("data", "payload")
# Codes kept for old events that nothing writes any more (audit/models.py).
NOT_WRITTEN: Final = frozenset({EventCode.CREDENTIAL_ISSUED})


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    problem: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.problem}"


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in SKIPPED or "migrations" in relative.parts:
            continue
        yield str(relative), ast.parse(path.read_text(), filename=str(relative))


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def _data_argument(call: ast.Call) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg in DATA_KEYWORDS:
            return keyword.value
    return None


def _wrappers(modules: list[tuple[str, ast.Module]]) -> frozenset[str]:
    """Functions that pass a parameter of their own as a writer's payload."""
    found: set[str] = set()
    for _, module in modules:
        for function in ast.walk(module):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            arguments = function.args
            parameters = {
                a.arg
                for a in (
                    *arguments.args,
                    *arguments.kwonlyargs,
                    *arguments.posonlyargs,
                )
            }
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and _called_name(node) in WRITERS:
                    data = _data_argument(node)
                    if isinstance(data, ast.Name) and data.id in parameters:
                        found.add(function.name)
    return frozenset(found)


def _payload_type(node: ast.expr) -> str | None:
    """``X`` of ``payloads.X(...)``."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "payloads"
    ):
        return node.func.attr
    return None


def _codes(call: ast.Call) -> list[str]:
    """The literal ``EventCode.Y`` members among the call's own arguments."""
    values = [*call.args, *(keyword.value for keyword in call.keywords)]
    return [
        node.attr
        for value in values
        if _payload_type(value) is None
        for node in ast.walk(value)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "EventCode"
    ]


def findings(modules: list[tuple[str, ast.Module]]) -> list[Finding]:
    writers = WRITERS | _wrappers(modules)
    found: list[Finding] = []
    for path, module in modules:
        for call in ast.walk(module):
            if not isinstance(call, ast.Call) or _called_name(call) not in writers:
                continue
            data = _data_argument(call)
            if isinstance(data, ast.Dict):
                first = data.values[0] if data.values else None
                typed_first = (
                    data.keys
                    and data.keys[0] is None
                    and first is not None
                    and _payload_type(first) is not None
                )
                if not typed_first:
                    found.append(
                        Finding(path, call.lineno, "a bare dict literal as the payload")
                    )
                    continue
                data = first
            built = _payload_type(data) if data is not None else None
            if built is None:
                continue
            if not hasattr(payloads, built):
                found.append(Finding(path, call.lineno, f"no payloads.{built}"))
                continue
            for code in _codes(call):
                expected = payloads.PAYLOADS.get(EventCode[code])
                if expected is not getattr(payloads, built):
                    name = expected.__name__ if expected else None
                    found.append(
                        Finding(
                            path,
                            call.lineno,
                            f"EventCode.{code} with payloads.{built}, not {name}",
                        )
                    )
    return found


def test_every_writer_builds_its_payload_through_its_definition() -> None:
    modules = list(_sources())
    assert len(modules) > 100  # the walk found the project
    problems = findings(modules)
    assert not problems, "\n".join(map(str, problems))


def test_the_check_catches_a_dict_literal_and_a_wrong_definition() -> None:
    source = """
def _event(*, code, data):
    audit_services.event_append(tenant_id=1, code=code, actor=None, data=data)

audit_services.event_append(code=EventCode.TASK_WOKEN, data={"to": "pending"})
_event(code=EventCode.AGENT_CREATED, data={"agent_id": "a"})
_event(code=EventCode.AGENT_CREATED, data=payloads.AgentKeyRevoked({}))
event_append(code=EventCode.TASK_WOKEN, data=payloads.TaskWoken({}))
event_append(code=EventCode.GATEWAY_CHECKED, data={**payloads.GatewayChecked({}), **c})
event_append(code=EventCode.GATEWAY_CHECKED, data={**c, "verdict": "refused"})
"""
    problems = findings([("example.py", ast.parse(source))])
    assert [(finding.line, finding.problem) for finding in problems] == [
        (5, "a bare dict literal as the payload"),
        (6, "a bare dict literal as the payload"),
        (7, "EventCode.AGENT_CREATED with payloads.AgentKeyRevoked, not AgentCreated"),
        (10, "a bare dict literal as the payload"),
    ]


def test_every_code_written_has_a_definition() -> None:
    referenced = {
        node.attr
        for path, module in _sources()
        if path not in ("audit/models.py", "audit/payloads.py")
        for node in ast.walk(module)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "EventCode"
        and node.attr in EventCode.__members__
    }
    written = {EventCode[name] for name in referenced}
    assert written - set(payloads.PAYLOADS) == set()
    assert set(EventCode) - set(payloads.PAYLOADS) == NOT_WRITTEN
    assert not NOT_WRITTEN & written


def test_each_definition_is_a_typed_dict_and_a_plain_dict_at_run_time() -> None:
    for code, definition in payloads.PAYLOADS.items():
        assert hasattr(definition, "__required_keys__"), code
    literal = {"from": "waiting", "to": "pending", "state_version": 3}
    built = payloads.TaskWoken({"from": "waiting", "to": "pending", "state_version": 3})
    assert type(built) is dict
    assert json_text(built) == json_text(literal)
    assert json.loads(json_text(built)) == literal
