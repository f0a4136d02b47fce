"""``portal.api_fields``: each serializer instance's fields, copied without DRF's
deep copy, answer and validate exactly as DRF's own copies do."""

from __future__ import annotations

import copy
import datetime as dt
import uuid
from typing import Any

import pytest
from rest_framework import serializers

from portal.api_fields import OutputSerializer, fields_copy
from portal.api_input import StrictInput
from portal.codes import ReasonCode
from tasks.api.serializers import (
    ContractOutputSerializer,
    OperationOutputSerializer,
    TaskOutputSerializer,
)
from tasks.models import Operation, Task

NOW = dt.datetime(2026, 12, 5, 8, 0, tzinfo=dt.UTC)


def deep_copied(serializer_class: type[serializers.Serializer]) -> type:
    """The same serializer with DRF's own ``get_fields`` (a deep copy)."""

    def get_fields(self: serializers.Serializer) -> dict[str, Any]:
        return copy.deepcopy(self._declared_fields)

    return type(f"Deep{serializer_class.__name__}", (serializer_class,), {
        "get_fields": get_fields,
    })  # fmt: skip


def operation() -> Operation:
    return Operation(
        id=uuid.uuid4(), tenant_id=uuid.uuid4(), task_id=uuid.uuid4(),
        idempotency_key="k-1", action="create_ticket", target="desk",
        input_hash="0" * 64, state="failed", state_version=3,
        reason_code=ReasonCode.RESULT_UNKNOWN, attempts=2, provider_reference="r-9",
        result={"a": [1, "b"]}, trace_id="a" * 32, span_id="b" * 16,
        created_at=NOW, updated_at=NOW + dt.timedelta(seconds=1),
    )  # fmt: skip


def task() -> Task:
    return Task(
        id=uuid.uuid4(), tenant_id=uuid.uuid4(), client_task_id="c-1",
        workflow_key="wf", workflow_version="1", contract_key=None,
        object_type="ticket", object_id="t-1", object_version="7",
        state="waiting", state_version=4, current_step="s", wake_at=NOW,
        reason_code=None, lease_owner="w", lease_token=5, lease_acquired_at=NOW,
        lease_expires_at=NOW, trace_id="c" * 32, span_id="d" * 16,
        created_at=NOW, updated_at=NOW,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("serializer_class", "make"),
    [(OperationOutputSerializer, operation), (TaskOutputSerializer, task)],
)
def test_an_answer_is_the_one_drf_deep_copied_fields_give(
    serializer_class: type[serializers.Serializer], make: Any
) -> None:
    instance = make()
    ours = serializer_class(instance).data
    assert ours == deep_copied(serializer_class)(instance).data
    assert ours["updated_at"] or ours["state"]  # not an empty answer


def test_each_instance_binds_fields_of_its_own_and_the_declared_ones_stay_unbound() -> (
    None
):
    first, second = OperationOutputSerializer(operation()), OperationOutputSerializer()
    assert first.data["reason_code"] == "RESULT_UNKNOWN"
    for name, field in first.fields.items():
        other = second.fields[name]
        assert field is not other
        assert field.parent is first and other.parent is second
        assert field.field_name == name
        declared = OperationOutputSerializer._declared_fields[name]
        assert declared is not field
        assert declared.parent is None, name
        assert declared.field_name is None, name


class _Nested(OutputSerializer):
    tags = serializers.ListField(child=serializers.CharField())
    contract = ContractOutputSerializer()
    state = serializers.ChoiceField(choices=["a", "b"])


def test_a_field_holding_fields_is_deep_copied_so_its_children_are_its_own() -> None:
    declared: dict[str, Any] = dict(_Nested._declared_fields)
    copied = fields_copy(declared)
    assert copied["tags"].child is not declared["tags"].child
    assert copied["tags"].child.parent is copied["tags"]
    assert copied["contract"] is not declared["contract"]
    # A plain field shares what it only reads (its choices), not its binding.
    assert copied["state"] is not declared["state"]
    assert copied["state"].choices is declared["state"].choices


class _Input(StrictInput):
    name = serializers.CharField(max_length=5)
    code = serializers.ChoiceField(choices=ReasonCode.choices, required=False)


def test_strict_input_validates_as_before_and_leaves_the_declared_fields_alone() -> (
    None
):
    good = _Input(data={"name": " ab ", "code": "STALE_STATE"})
    assert good.is_valid(), good.errors
    assert good.validated_data == {"name": " ab ", "code": "STALE_STATE"}
    bad = _Input(data={"name": "toolong", "code": "NOPE"})
    assert not bad.is_valid()
    assert set(bad.errors) == {"name", "code"}
    unknown = _Input(data={"name": "a", "extra": 1})
    assert not unknown.is_valid()
    assert set(unknown.errors) == {"extra"}
    # StrictInput keeps text untrimmed on its own copy, not on the class's field.
    declared: Any = _Input._declared_fields["name"]
    bound: Any = good.fields["name"]
    assert declared.trim_whitespace is True
    assert bound.trim_whitespace is False
