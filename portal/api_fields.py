"""A serializer's fields for one instance, without DRF's deep copy of each.

DRF gives every serializer instance its own fields: ``Serializer.get_fields``
deep-copies the declared ones, and a field's ``__deepcopy__`` deep-copies its
constructor arguments and runs its ``__init__`` again. For a ``ChoiceField`` that
is the whole list of choices, copied and indexed anew: with the reason codes'
twenty, one field cost about 0.45 ms, and building ``OperationOutputSerializer``'s
fields was the largest part of a reserve request's CPU in the web process
(docs/performance-log.md, "Issue 23: the REST request's CPU in the web").

What an instance needs of its own is only what ``bind`` sets (``field_name``,
``parent``, ``source``, ``source_attrs``, ``label``) and what a serializer sets
on its fields afterwards (``StrictInput``'s ``trim_whitespace``): attributes,
assigned on the instance's copy. The rest (choices, validators, error messages,
formats) is read, never changed, while a request is served. So a plain field is
copied shallowly: a new object with the declared one's attributes. A field that
holds other fields (a nested serializer, a ``ListField``'s or ``DictField``'s
``child``, a related field's ``child_relation``) is deep-copied as DRF does, so
that its children are bound to it and not to the declared field.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

_CONTAINER_ATTRIBUTES = ("child", "child_relation")


def fields_copy(declared: Mapping[str, serializers.Field]) -> dict[str, Any]:
    """Fresh, unbound fields for one serializer instance (see the module)."""
    fields: dict[str, Any] = {}
    for name, field in declared.items():
        if isinstance(field, serializers.BaseSerializer) or any(
            hasattr(field, attribute) for attribute in _CONTAINER_ATTRIBUTES
        ):
            fields[name] = copy.deepcopy(field)
            continue
        fresh = object.__new__(type(field))
        fresh.__dict__.update(field.__dict__)
        fields[name] = fresh
    return fields


class FieldsCopiedSerializer(serializers.Serializer):
    """A ``Serializer`` whose instances copy their declared fields as
    ``fields_copy`` does, instead of deep-copying them."""

    def get_fields(self) -> dict[str, Any]:
        return fields_copy(self._declared_fields)


class OutputSerializer(FieldsCopiedSerializer):
    """An answer's shape: reads attributes of the object it is given and formats
    them. Every output serializer of the API derives from it."""
