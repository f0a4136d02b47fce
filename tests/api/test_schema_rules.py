"""The schema and the server agree both ways, finding by finding (issue 10 §4).

Invalid requests the server used to accept (an empty query value under
``minLength``, a number where the schema says string) are now refused; valid ones
it refused for rules the schema did not state are either accepted (``input: null``)
or now stated in the schema (a verified outcome needs its receipt id, ``wake_at``
only with ``to: waiting``, no unknown members, no NUL). Each test checks the server
over HTTP and, where a rule is stated, the served schema with a JSON Schema
validator.
"""

from __future__ import annotations

import copy
import datetime as dt

import jsonschema
import pytest

from tasks.models import ObjectVersion, Operation, Task

from .conftest import REGISTRATION, AgentClient, register_and_claim

pytestmark = pytest.mark.django_db


def lease(task: dict) -> dict[str, str]:
    return {"Lease-Token": str(task["lease"]["token"])}


def body_validator(api: AgentClient, operation_id: str) -> jsonschema.Validator:
    """A validator for one operation's request body, from the served schema
    (OpenAPI 3.1: its schemas are JSON Schema 2020-12)."""
    document = api.get("/api/schema/?format=json").json()
    assert document["openapi"].startswith("3.1")
    for item in document["paths"].values():
        for operation in item.values():
            if operation.get("operationId") == operation_id:
                content = operation["requestBody"]["content"]["application/json"]
                root = copy.deepcopy(document)
                root["$ref"] = content["schema"]["$ref"]
                return jsonschema.Draft202012Validator(root)
    raise AssertionError(f"no operation {operation_id}")


def query_parameter(api: AgentClient, operation_id: str, name: str) -> dict:
    document = api.get("/api/schema/?format=json").json()
    for item in document["paths"].values():
        for operation in item.values():
            if operation.get("operationId") == operation_id:
                for parameter in operation.get("parameters", []):
                    if parameter["name"] == name and parameter["in"] == "query":
                        return parameter["schema"]
    raise AssertionError(f"no parameter {name} on {operation_id}")


# --- Invalid requests that were accepted ----------------------------------------------


def test_an_empty_contract_key_filter_is_refused(api):
    # Given the schema's rule for ?key= (at least one character)
    assert query_parameter(api, "contracts_list", "key")["minLength"] == 1
    # When an agent sends it empty, then it is refused like any other bad value
    answer = api.get("/api/v1/contracts?key=")
    assert answer.status_code == 400, answer.json()
    assert answer.json()["errors"] == {"key": ["This field may not be blank."]}


def test_an_empty_updated_since_is_refused(api):
    assert query_parameter(api, "tasks_list", "updated_since")["format"] == "date-time"
    answer = api.get("/api/v1/tasks?updated_since=")
    assert answer.status_code == 400, answer.json()
    assert list(answer.json()["errors"]) == ["updated_since"]


def test_an_empty_event_order_is_refused(api):
    task = register_and_claim(api)
    assert query_parameter(api, "tasks_events", "order")["enum"] == ["oldest", "newest"]
    answer = api.get(f"/api/v1/tasks/{task['id']}/events?order=")
    assert answer.status_code == 400, answer.json()
    assert list(answer.json()["errors"]) == ["order"]


def test_an_integer_object_version_is_refused_and_not_stored(api):
    # The schema says version is a string; DRF used to store 0 as "0".
    validator = body_validator(api, "object_versions_record")
    assert not validator.is_valid({"version": 0})
    answer = api.put("/api/v1/object-versions/customer_issue/1042", {"version": 0})
    assert answer.status_code == 400, answer.json()
    assert answer.json()["errors"] == {"version": ["Must be a string."]}
    assert not ObjectVersion.objects.filter(object_id="1042").exists()
    # A string is fine.
    stored = api.put("/api/v1/object-versions/customer_issue/1042", {"version": "0"})
    assert stored.status_code == 200
    assert stored.json()["version"] == "0"


@pytest.mark.parametrize(
    ("body", "member"),
    [
        ({"owner": "w", "ttl_s": "60"}, "ttl_s"),  # a numeric string, not an integer
        ({"owner": "w", "ttl_s": 60.5}, "ttl_s"),
        ({"owner": "w", "ttl_s": True}, "ttl_s"),
        ({"owner": 7}, "owner"),
    ],
)
def test_members_of_another_json_type_are_refused(api, body, member):
    validator = body_validator(api, "tasks_claim_next")
    assert not validator.is_valid(body)
    answer = api.post("/api/v1/tasks/claim-next", body)
    assert answer.status_code == 400, answer.json()
    assert list(answer.json()["errors"]) == [member]


@pytest.mark.parametrize("number", [2**60, 1e21, -1.5e300], ids=["int", "1e21", "big"])
def test_an_input_number_beyond_the_safe_range_is_stated_and_refused(api, number):
    """One bound for every number, a double RFC 8785 can write (1e21 -> 1e+21)
    included: JSON does not tell 1e21 from 1000000000000000000000, which parsers
    read differently (docs/input-hash.md). The schema states the bound."""
    task = register_and_claim(api)
    body = {
        "idempotency_key": "k",
        "action": "a",
        "target": "t",
        "input": {"n": number},
    }
    assert not body_validator(api, "operations_reserve").is_valid(body)
    answer = api.post(f"/api/v1/tasks/{task['id']}/operations", body, **lease(task))
    assert answer.status_code == 400, answer.json()
    assert not Operation.objects.exists()


# --- Valid requests that were refused -------------------------------------------------


def test_an_integer_written_with_a_zero_fraction_is_an_integer(api):
    # JSON Schema 2020-12 (OpenAPI 3.1): 30.0 is an integer; so it is to the server.
    assert body_validator(api, "tasks_lease_acquire").is_valid(
        {"owner": "w", "ttl_s": 30.0}
    )
    assert not body_validator(api, "tasks_lease_acquire").is_valid(
        {"owner": "w", "ttl_s": 30.5}
    )
    task = api.post("/api/v1/tasks", REGISTRATION).json()
    answer = api.post(
        f"/api/v1/tasks/{task['id']}/lease", {"owner": "w", "ttl_s": 30.0}
    )
    assert answer.status_code == 200, answer.json()
    lease_ = answer.json()["lease"]
    held = dt.datetime.fromisoformat(lease_["expires_at"]) - dt.datetime.fromisoformat(
        lease_["acquired_at"]
    )
    assert held == dt.timedelta(seconds=30)


def test_a_null_input_is_accepted(api):
    # Given the schema, which allows any JSON value as an operation's input
    task = register_and_claim(api)
    body = {"idempotency_key": "k-null", "action": "a", "target": "t", "input": None}
    assert body_validator(api, "operations_reserve").is_valid(body)
    # When an agent reserves with input null, then the server takes it too
    answer = api.post(f"/api/v1/tasks/{task['id']}/operations", body, **lease(task))
    assert answer.status_code == 201, answer.json()
    assert Operation.objects.get(pk=answer.json()["id"]).input is None
    again = api.post(f"/api/v1/tasks/{task['id']}/operations", body, **lease(task))
    assert again.status_code == 200  # the same input: the stored operation


def test_the_schema_says_a_verified_outcome_needs_its_receipt_id(api):
    validator = body_validator(api, "operations_report_outcome")
    assert not validator.is_valid({"outcome": "verified"})
    assert validator.is_valid({"outcome": "verified", "provider_reference": "R-1"})
    assert validator.is_valid({"outcome": "failed"})
    assert validator.is_valid({"outcome": "unknown", "provider_reference": "R-1"})
    # And the server refuses exactly what the schema calls invalid.
    task = register_and_claim(api)
    reserved = api.post(
        f"/api/v1/tasks/{task['id']}/operations",
        {"idempotency_key": "k", "action": "a", "target": "t", "input": {}},
        **lease(task),
    ).json()
    api.post(f"/api/v1/operations/{reserved['id']}/start", **lease(task))
    outcome = f"/api/v1/operations/{reserved['id']}/outcome"
    refused = api.post(outcome, {"outcome": "verified"}, **lease(task))
    assert refused.status_code == 400
    assert refused.json()["field"] == "provider_reference"
    verified = api.post(
        outcome, {"outcome": "verified", "provider_reference": "R-1"}, **lease(task)
    )
    assert verified.status_code == 200, verified.json()


def test_the_schema_says_wake_at_is_only_for_waiting(api):
    validator = body_validator(api, "tasks_transition")
    wake_at = "2030-01-01T00:00:00Z"
    assert not validator.is_valid(
        {"to": "pending", "expected_state_version": 1, "wake_at": wake_at}
    )
    assert validator.is_valid(
        {"to": "waiting", "expected_state_version": 1, "wake_at": wake_at}
    )
    assert validator.is_valid({"to": "pending", "expected_state_version": 1})
    # And the server refuses exactly that, then takes the same time for waiting.
    task = register_and_claim(api)
    path = f"/api/v1/tasks/{task['id']}/transitions"
    version = task["state_version"]
    refused = api.post(
        path,
        {"to": "pending", "expected_state_version": version, "wake_at": wake_at},
        **lease(task),
    )
    assert refused.status_code == 400
    assert refused.json()["field"] == "wake_at"
    waiting = api.post(
        path,
        {"to": "waiting", "expected_state_version": version, "wake_at": wake_at},
        **lease(task),
    )
    assert waiting.status_code == 200, waiting.json()
    assert waiting.json()["wake_at"] == wake_at


@pytest.mark.parametrize("extra", ["plain", "nul\u0000inside"])
def test_unknown_members_are_stated_and_refused_whatever_they_hold(api, extra):
    # The schema admits no member it does not list, so a NUL in one is not a
    # hidden rule: the member itself is refused, by name.
    body = {**REGISTRATION, "note": extra}
    assert not body_validator(api, "tasks_register").is_valid(body)
    answer = api.post("/api/v1/tasks", body)
    assert answer.status_code == 400, answer.json()
    problem = answer.json()
    # Refused by name: as unknown, or (NUL checked first) as unstorable text.
    assert problem.get("errors") == {"note": ["Unknown member; see the schema."]} or (
        problem.get("field") == "/note"
    )
    assert not Task.objects.exists()


def test_nested_unknown_members_are_refused(api):
    task = register_and_claim(api)
    operation = api.post(
        f"/api/v1/tasks/{task['id']}/operations",
        {"idempotency_key": "k", "action": "a", "target": "t", "input": {}},
        **lease(task),
    ).json()
    field = {"name": "email", "value": "a@b", "source": "crm", "extra": 1}
    body = {"field_values": [{**field, "observed_at": "2030-01-01T00:00:00Z"}]}
    assert not body_validator(api, "operations_execute").is_valid(body)
    answer = api.post(
        f"/api/v1/operations/{operation['id']}/execute", body, **lease(task)
    )
    assert answer.status_code == 400, answer.json()
    assert "extra" in str(answer.json()["errors"])


def test_the_schema_states_that_text_may_not_hold_nul(api):
    validator = body_validator(api, "tasks_register")
    assert not validator.is_valid({**REGISTRATION, "object_id": "10\u000042"})
    answer = api.post("/api/v1/tasks", {**REGISTRATION, "object_id": "10\u000042"})
    assert answer.status_code == 400
    assert answer.json()["field"] == "/object_id"


@pytest.mark.parametrize(
    "key",
    ["n\u0000", "\u0000"],
    ids=["inside", "alone"],
)
@pytest.mark.parametrize("depth", ["top", "nested"])
def test_the_schema_states_that_object_keys_may_not_hold_nul(api, key, depth):
    """A free-form object's keys are text too: the schema says so
    (``propertyNames``), and the server refuses the key, naming where it is."""
    task = register_and_claim(api)
    value = {key: 1} if depth == "top" else {"a": [{key: 1}]}
    body = {"idempotency_key": "k", "action": "a", "target": "t", "input": value}
    assert not body_validator(api, "operations_reserve").is_valid(body)
    assert body_validator(api, "operations_reserve").is_valid(
        {**body, "input": {"n": 1} if depth == "top" else {"a": [{"n": 1}]}}
    )
    answer = api.post(f"/api/v1/tasks/{task['id']}/operations", body, **lease(task))
    assert answer.status_code == 400, answer.json()
    assert answer.json()["code"] == "VALIDATION_FAILED"
    assert answer.json()["field"] == ("/input" if depth == "top" else "/input/a/0")
    assert not Operation.objects.exists()


def test_text_is_kept_as_sent_not_trimmed(api):
    # minLength 1 admits a lone no-break space; DRF used to trim it away and then
    # refuse the blank rest. Surrounding spaces were silently dropped, too.
    validator = body_validator(api, "object_versions_record")
    assert validator.is_valid({"version": "\u00a0"})
    answer = api.put("/api/v1/object-versions/t/1", {"version": " 7 "})
    assert answer.status_code == 200, answer.json()
    assert answer.json()["version"] == " 7 "
    lone = api.put("/api/v1/object-versions/t/2", {"version": "\u00a0"})
    assert lone.status_code == 200, lone.json()


def test_an_unknown_list_cursor_is_a_documented_404(api):
    document = api.get("/api/schema/?format=json").json()
    assert "404" in document["paths"]["/api/v1/tasks"]["get"]["responses"]
    assert query_parameter(api, "tasks_list", "page_size")["maximum"] == 200
    assert api.get("/api/v1/tasks?cursor=garbage").status_code == 404
    assert api.get("/api/v1/tasks?page_size=abc").status_code == 400


@pytest.mark.parametrize("token", ["\u00b2", "\u0663"])  # superscript two, Arabic three
def test_a_lease_token_of_other_digits_is_refused(api, token):
    # The schema says an integer; str.isdigit() also admits these, and int("²")
    # then raised: a 500 for a header the schema calls invalid.
    task = register_and_claim(api)
    answer = api.post(
        f"/api/v1/tasks/{task['id']}/lease/renew", {}, **{"Lease-Token": token}
    )
    assert answer.status_code == 400, answer.content
    assert answer.json()["field"] == "Lease-Token"
