"""Request input exactly as the OpenAPI schema states it, and nothing more.

DRF is lenient where the schema is not: ``CharField`` turns ``0`` into ``"0"``,
``IntegerField`` takes ``"5"``, ``BooleanField`` takes ``"yes"``, unknown members are
dropped, and an empty query value (``?key=``) counts as absent. Each leniency is a
request the schema calls invalid but the server accepts. Here the server keeps to
the schema, and the schema states what the server checks:

- a JSON body is a ``StrictInput``: every member is documented
  (``additionalProperties: false``) and has the JSON type its field documents (an
  integer written ``7.0`` is the integer 7, as JSON Schema says);
- text may not contain NUL (PostgreSQL cannot store it): every request string the
  schema documents carries ``pattern: ^[^\\u0000]*$``, and every free-form request
  object ``propertyNames`` with that pattern, for its keys (``api_schema_hook``;
  OpenAPI 3.1, whose JSON Schema has ``propertyNames``);
- free-form JSON (an operation's input, event payload facts, field values) is a
  ``JsonValue``: any JSON without NUL, and the operation input's numbers within the
  IEEE 754 safe range, as RFC 8785 hashing needs (``CanonicalJsonValue``).

Query strings stay strings: filter serializers are plain ``Serializer``s, validated
over a plain dict so that an empty value is validated (and refused) like any other.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Mapping
from typing import Any, Final

from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from .api_fields import FieldsCopiedSerializer

# Integers an IEEE 754 double holds exactly: what RFC 8785 (I-JSON) allows.
SAFE_INTEGER: Final = 2**53 - 1
NO_NUL_PATTERN: Final = "^[^\\u0000]*$"
NO_NUL_KEYS: Final[dict[str, Any]] = {"pattern": NO_NUL_PATTERN}
NO_NUL_NOTE: Final = "Text may not contain NUL (U+0000) or lone surrogates."

# The JSON type a body member must have, by field class (first match wins).
_JSON_TYPES: Final[
    tuple[tuple[type[serializers.Field], tuple[type, ...], str], ...]
] = (
    (serializers.BooleanField, (bool,), "a boolean"),
    (serializers.IntegerField, (int,), "an integer"),
    (serializers.FloatField, (int, float), "a number"),
    (serializers.CharField, (str,), "a string"),
    (serializers.ChoiceField, (str,), "a string"),
    (serializers.DateTimeField, (str,), "a string"),
    (serializers.UUIDField, (str,), "a string"),
    (serializers.ListField, (list,), "an array"),
    (serializers.DictField, (dict,), "an object"),
    (serializers.Serializer, (dict,), "an object"),
)


def _type_error(field: serializers.Field, value: Any) -> str | None:
    if isinstance(field, serializers.JSONField) or value is None:
        return None  # any JSON; null is the field's own allow_null rule
    for field_class, types, name in _JSON_TYPES:
        if isinstance(field, field_class):
            if isinstance(value, bool) and bool not in types:
                return f"Must be {name}."
            return None if isinstance(value, types) else f"Must be {name}."
    return None


class _Untrimmed(FieldsCopiedSerializer):
    """Text arrives as sent: DRF would strip surrounding whitespace (changing the
    value) and then refuse what is left blank, though ``minLength: 1`` admits it."""

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        for field in fields.values():
            if isinstance(field, serializers.CharField):
                field.trim_whitespace = False
        return fields


def _unknown_members(serializer: serializers.Serializer, data: Any) -> dict:
    return {
        str(name): ["Unknown member; see the schema."]
        for name in data
        if name not in serializer.fields
    }


class QueryInput(_Untrimmed):
    """Query-string (or path) parameters: strings, validated as the schema states.

    A parameter the operation does not document is refused, as for body members:
    a misspelt filter (``?stat=failed``) must not quietly list everything.
    """

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping) and (errors := _unknown_members(self, data)):
            raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


class StrictInput(_Untrimmed):
    """A JSON request body: documented members only, each of its documented type.

    The schema marks these objects ``additionalProperties: false``
    (``StrictInputExtension``), so an unknown member is refused, never ignored.
    """

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            data = _integral_numbers_as_integers(self, data)
            errors = _unknown_members(self, data)
            for name, field in self.fields.items():
                if name in data and (problem := _type_error(field, data[name])):
                    errors[name] = [problem]
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


def _integral_numbers_as_integers(
    serializer: serializers.Serializer, data: Mapping[str, Any]
) -> Mapping[str, Any]:
    """``7.0`` for an integer member is the integer 7, as JSON Schema (2020-12,
    OpenAPI 3.1) counts it: "a number with a zero fractional part is an integer"."""
    integral = {
        name: int(value)
        for name, field in serializer.fields.items()
        if isinstance(field, serializers.IntegerField)
        and isinstance(value := data.get(name), float)
        and value.is_integer()
    }
    return {**data, **integral} if integral else data


_STRICT_INPUT_DOC: Final = inspect.cleandoc(StrictInput.__doc__ or "")


class StrictInputExtension(OpenApiSerializerExtension):
    """drf-spectacular: a ``StrictInput`` admits no members beyond its fields."""

    target_class = StrictInput
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> Any:
        schema = auto_schema._map_basic_serializer(self.target, direction)
        schema["additionalProperties"] = False
        if schema.get("description") == _STRICT_INPUT_DOC:  # inherited, not its own
            schema["description"] = "Members not listed here are refused (400)."
        return schema


def _json_value_problem(value: Any, *, safe_numbers: bool, path: str) -> str | None:
    if isinstance(value, dict):
        for key, item in value.items():
            problem = _json_value_problem(
                item, safe_numbers=safe_numbers, path=f"{path}/{key}"
            )
            if problem:
                return problem
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problem = _json_value_problem(
                item, safe_numbers=safe_numbers, path=f"{path}/{index}"
            )
            if problem:
                return problem
    elif (
        safe_numbers
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and (not math.isfinite(value) or abs(value) > SAFE_INTEGER)
    ):
        return f"{path or '/'}: numbers must lie within ±(2^53-1)."
    return None


JSON_VALUE_SCHEMA: Final[dict[str, Any]] = {
    "description": f"Any JSON value. {NO_NUL_NOTE}",
    "anyOf": [
        {"type": "null"},
        {"type": "string", "pattern": NO_NUL_PATTERN},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "array", "items": {"$ref": "#/components/schemas/JsonValue"}},
        {
            "type": "object",
            "propertyNames": NO_NUL_KEYS,
            "additionalProperties": {"$ref": "#/components/schemas/JsonValue"},
        },
    ],
}
CANONICAL_JSON_VALUE_SCHEMA: Final[dict[str, Any]] = {
    "description": "Any JSON value that RFC 8785 can hash: every number within "
    f"±(2^53-1) (I-JSON). {NO_NUL_NOTE}",
    "anyOf": [
        {"type": "null"},
        {"type": "string", "pattern": NO_NUL_PATTERN},
        {"type": "number", "minimum": -SAFE_INTEGER, "maximum": SAFE_INTEGER},
        {"type": "boolean"},
        {
            "type": "array",
            "items": {"$ref": "#/components/schemas/CanonicalJsonValue"},
        },
        {
            "type": "object",
            "propertyNames": NO_NUL_KEYS,
            "additionalProperties": {"$ref": "#/components/schemas/CanonicalJsonValue"},
        },
    ],
}
# Added to the document by ``api_schema_hook``; the fields below point at them.
SCHEMA_COMPONENTS: Final[dict[str, Any]] = {
    "schemas": {
        "JsonValue": JSON_VALUE_SCHEMA,
        "CanonicalJsonValue": CANONICAL_JSON_VALUE_SCHEMA,
    }
}


@extend_schema_field({"$ref": "#/components/schemas/JsonValue"})
class JsonValueField(serializers.JSONField):
    """Any JSON value (NUL is refused for the whole body by ``validated``)."""


@extend_schema_field({"$ref": "#/components/schemas/CanonicalJsonValue"})
class CanonicalJsonValueField(serializers.JSONField):
    """Any JSON value with every number in the IEEE 754 safe range (RFC 8785)."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        problem = _json_value_problem(value, safe_numbers=True, path="")
        if problem:
            raise serializers.ValidationError(problem)
        return value


@extend_schema_field(
    {
        "type": "object",
        "propertyNames": NO_NUL_KEYS,
        "additionalProperties": {"$ref": "#/components/schemas/JsonValue"},
    }
)
class JsonObjectField(serializers.DictField):
    """A JSON object of free-form facts."""


def query_data(params: Any) -> dict[str, Any]:
    """A query string as a plain dict (the last value of a repeated key).

    DRF reads an empty value of an optional field from a ``QueryDict`` as absent;
    from a plain dict it validates it, so ``?key=`` is refused like ``?key=x…``
    (over the length limit), as the schema's ``minLength: 1`` says.
    """
    if hasattr(params, "dict"):
        return dict(params.dict())
    return dict(params)


def _schemas(schema: Any) -> Any:
    """Every schema object in a schema (its own, and all nested), for
    ``api_schema_hook``."""
    if isinstance(schema, dict):
        yield schema
        for value in schema.values():
            yield from _schemas(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _schemas(item)


def _of_type(schema: dict[str, Any], name: str) -> bool:
    kind = schema.get("type")
    return kind == name or (isinstance(kind, list) and name in kind)


def _as_oas_3_1(schema: dict[str, Any]) -> None:
    """One schema in OpenAPI 3.1's words: ``nullable`` (3.0; DRF's paginators
    still write it) becomes a ``null`` type, and drf-spectacular's ``oneOf: [X,
    {type: null}]`` for a nullable field becomes ``anyOf``: ``oneOf`` would refuse
    ``null`` where X admits it too (a free-form ``{}``, ``JsonValue``)."""
    if schema.pop("nullable", False):
        kind = schema.get("type")
        if isinstance(kind, str):
            schema["type"] = [kind, "null"]
        elif isinstance(kind, list) and "null" not in kind:
            kind.append("null")
    variants = schema.get("oneOf")
    if isinstance(variants, list) and {"type": "null"} in variants:
        schema["anyOf"] = schema.pop("oneOf")


def api_schema_hook(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing: the JSON value components, the NUL rule, and
    OpenAPI 3.1's words for null.

    Free text (no format, enum or pattern of its own) gets ``pattern:
    ^[^\\u0000]*$``, and an object that admits members beyond its properties
    ``propertyNames`` with it: in request components (``…Request``, split by
    ``COMPONENT_SPLIT_REQUEST``) and in query and path parameters.
    """
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components.update(copy.deepcopy(SCHEMA_COMPONENTS["schemas"]))
    targets: list[Any] = [
        schema for name, schema in components.items() if name.endswith("Request")
    ]
    targets.extend(
        parameter.get("schema", {})
        for item in result.get("paths", {}).values()
        for operation in item.values()
        for parameter in operation.get("parameters", [])
        if parameter.get("in") in {"query", "path"}
    )
    for target in targets:
        for schema in _schemas(target):
            if _of_type(schema, "string"):
                if not {"format", "enum", "pattern"} & set(schema):
                    schema["pattern"] = NO_NUL_PATTERN
            elif (
                _of_type(schema, "object")
                and schema.get("additionalProperties", True) is not False
            ):  # keys beyond its properties: no NUL in them either
                schema.setdefault("propertyNames", NO_NUL_KEYS)
    for schema in _schemas(result.get("paths", {})):
        _as_oas_3_1(schema)
    for schema in _schemas(components):
        _as_oas_3_1(schema)
    # drf-spectacular cannot tell that a oneOf of bodies (PolymorphicProxySerializer)
    # with required members needs a body at all; say so.
    for item in result.get("paths", {}).values():
        for operation in item.values():
            body = operation.get("requestBody")
            if body is None or body.get("required"):
                continue
            for media in body.get("content", {}).values():
                ref = media.get("schema", {}).get("$ref", "")
                variants = components.get(ref.rsplit("/", 1)[-1], {}).get("oneOf")
                if variants and all(
                    components.get(v.get("$ref", "").rsplit("/", 1)[-1], {}).get(
                        "required"
                    )
                    for v in variants
                ):
                    body["required"] = True
    return result
