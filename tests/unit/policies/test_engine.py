"""The engine's matrix: allow, deny, forbid wins, approval, errors deny (fail closed).

Pure: a request and a text in, a decision out; cedarpy is the real engine.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from policies.engine import PolicyRequest, Verdict, evaluate_text
from policies.schema import schema_for
from policies.validation import policy_problems
from portal.codes import ReasonCode

MONDAY = dt.datetime(2026, 11, 30, 9, tzinfo=dt.UTC)
FRIDAY = dt.datetime(2026, 12, 4, 9, tzinfo=dt.UTC)
BASE = "permit(principal, action, resource);\n"
REFUND_NEEDS_FINANCE = """
@id("refund-needs-finance")
@approval("finance")
@quorum("2")
permit(principal, action == Action::"refund", resource)
when { context.amounts.hasTag("amount") && context.amounts.getTag("amount") > 500 };
"""
NO_DELETES_ON_FRIDAYS = """
@id("no-deletes-on-fridays")
forbid(principal, action, resource)
when { context.action like "delete*" && context.time.weekday == "Friday" };
"""


def request(**overrides: Any) -> PolicyRequest:
    values: dict[str, Any] = {
        "agent_id": "01a2-agent",
        "agent_name": "refund-bot",
        "action": "refund",
        "target": "ticket-desk",
        "object_type": "customer_issue",
        "object_id": "1042",
        "object_version": "7",
        "arguments": {"amount": 120, "reason": "late"},
        "fields": {"plan": "pro"},
        "at": MONDAY,
    }
    return PolicyRequest(**{**values, **overrides})


def test_no_permit_denies_by_default():
    decision = evaluate_text(text=NO_DELETES_ON_FRIDAYS, request=request())
    assert (decision.verdict, decision.determining) == (Verdict.DENY, ())
    assert decision.reason == ReasonCode.POLICY_DENIED


def test_a_matching_permit_allows_and_names_itself():
    decision = evaluate_text(text=BASE, request=request())
    assert (decision.verdict, decision.determining) == (Verdict.ALLOW, ("policy0",))
    assert decision.reason is None


def test_forbid_wins_over_permit():
    text = BASE + NO_DELETES_ON_FRIDAYS
    friday_delete = request(action="delete_ticket", at=FRIDAY)
    decision = evaluate_text(text=text, request=friday_delete)
    assert decision.verdict == Verdict.DENY
    assert decision.determining == ("no-deletes-on-fridays",)
    # The same delete on a Monday, and a Friday refund, pass.
    monday_delete = evaluate_text(text=text, request=request(action="delete_ticket"))
    assert monday_delete.verdict == Verdict.ALLOW
    assert evaluate_text(text=text, request=request(at=FRIDAY)).verdict == Verdict.ALLOW


@pytest.mark.parametrize(
    ("amount", "verdict"),
    [(120, Verdict.ALLOW), (500, Verdict.ALLOW), (500.01, Verdict.APPROVAL)],
)
def test_a_refund_above_500_needs_two_approvers_from_finance(amount, verdict):
    decision = evaluate_text(
        text=BASE + REFUND_NEEDS_FINANCE,
        request=request(arguments={"amount": amount}),
    )
    assert decision.verdict == verdict
    if verdict == Verdict.APPROVAL:
        assert decision.approval == {"groups": ["finance"], "quorum": 2}
        assert "refund-needs-finance" in decision.determining
        assert decision.reason == ReasonCode.APPROVAL_REQUIRED


def test_an_evaluation_error_denies_even_when_another_policy_permits():
    """Cedar skips a policy that errors: a broken forbid must not let a call by."""
    text = BASE + "forbid(principal, action, resource) when { context.fields.vip };"
    decision = evaluate_text(text=text, request=request())
    assert decision.verdict == Verdict.ERROR
    assert decision.reason == ReasonCode.POLICY_ERROR
    assert "vip" in (decision.error or "")


def test_text_that_does_not_parse_denies():
    decision = evaluate_text(
        text="permit(principal, action resource);", request=request()
    )
    assert decision.verdict == Verdict.ERROR
    assert "unexpected token" in (decision.error or "")


def test_a_malformed_annotation_in_a_stored_set_denies():
    text = '@approval("finance") @quorum("two")\npermit(principal, action, resource);'
    assert evaluate_text(text=text, request=request()).verdict == Verdict.ERROR


def test_the_shortest_credential_ttl_of_the_determining_permits_applies():
    text = '@credential_ttl_s("30")\n' + BASE + '@credential_ttl_s("10")\n' + BASE
    decision = evaluate_text(text=text, request=request())
    assert (decision.verdict, decision.credential_ttl_s) == (Verdict.ALLOW, 10)


def test_the_resource_is_the_object_inside_its_target():
    text = 'permit(principal, action, resource in Target::"crm");'
    assert evaluate_text(text=text, request=request()).verdict == Verdict.DENY
    assert (
        evaluate_text(text=text, request=request(target="crm")).verdict == Verdict.ALLOW
    )


SCHEMA = schema_for(actions=["refund", "delete_ticket"], field_names=["plan"])


# The examples of docs/policies.md, read from the doc so that it stays true.
DOCS_EXAMPLES = (
    (Path(__file__).resolve().parents[3] / "docs" / "policies.md")
    .read_text()
    .split("```cedar")[2]
    .split("```")[0]
)


def test_the_docs_examples_fit_the_schema_and_decide_as_documented():
    schema = schema_for(
        actions=["refund", "delete_ticket"],
        field_names=["plan"],
        amount_names=["amount"],
    )
    assert policy_problems(text=DOCS_EXAMPLES, schema=schema) == []

    def decide(**overrides: Any) -> Verdict:
        declared = request(amount_fields=("amount",), **overrides)
        return evaluate_text(text=DOCS_EXAMPLES, request=declared).verdict

    assert decide() == Verdict.ALLOW
    assert decide(arguments={"amount": 900}) == Verdict.APPROVAL
    # An undeclared number is no amount; a contract declaring none counts it.
    assert decide(arguments={"total": 900}) == Verdict.ALLOW
    assert decide(action="delete_ticket", at=FRIDAY) == Verdict.DENY
    assert decide(agent_name="crm-bot") == Verdict.DENY
    assert decide(agent_name="crm-bot", target="crm") == Verdict.ALLOW
    assert decide(risk_class="high") == Verdict.DENY
    assert decide(risk_class="high", agent_trust_tier="trusted") == Verdict.ALLOW


def test_principal_attributes_reach_the_policy():
    text = BASE + (
        "forbid(principal, action, resource) when {\n"
        '  principal.tags.contains("frozen-budget") || principal.sponsor == "" };\n'
    )
    assert evaluate_text(text=text, request=request()).verdict == Verdict.DENY
    sponsored = request(agent_sponsor="sol")
    assert evaluate_text(text=text, request=sponsored).verdict == Verdict.ALLOW
    tagged = request(agent_sponsor="sol", agent_tags=("refunds", "frozen-budget"))
    assert evaluate_text(text=text, request=tagged).verdict == Verdict.DENY


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (
            "permit(principal, action, resource);\n\nforbid(principal,\n action resource);\n",
            4,
            "unexpected token",
        ),
        (
            BASE + '\npermit(principal, action == Action::"refnd", resource);\n',
            3,
            "unrecognized action",
        ),
        (
            BASE
            + 'permit(principal, action, resource)\n  when { context.fields.plan == "pro" };\n',
            2,
            "optional attribute",
        ),
        (BASE + '@approval("finance") @quorum("0")\n' + BASE, 2, "@quorum"),
        (
            BASE
            + "forbid(principal, action, resource)\n"
            + "  when { context.amounts has refund && context.amounts.refund > 1 };\n",
            2,
            "no published contract declares 'refund' among its amount_fields",
        ),
        ("", None, "empty"),
    ],
    ids=[
        "parse",
        "unknown-action",
        "unguarded-optional",
        "bad-quorum",
        "undeclared-amount",
        "empty",
    ],
)
def test_problems_carry_the_parsers_message_and_line(text, line, message):
    problems = policy_problems(text=text, schema=SCHEMA)
    assert problems, "expected a problem"
    assert problems[0].line == line
    assert message in problems[0].message
