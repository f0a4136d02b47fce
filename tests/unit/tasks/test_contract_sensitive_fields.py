"""A contract version declares its personal-data and secret fields."""

from __future__ import annotations

import pytest

from tasks.contracts import contract_sensitive_fields, contract_spec_validate
from tasks.exceptions import ContractInvalid
from tests.support.contracts import SPEC


def test_a_spec_may_declare_personal_and_secret_fields():
    spec = {**SPEC, "sensitive_fields": {"email": "personal", "api_key": "secret"}}
    contract_spec_validate(spec)
    assert contract_sensitive_fields(spec) == {"email": "personal", "api_key": "secret"}
    assert contract_sensitive_fields(SPEC) == {}  # versions before it declare none


@pytest.mark.parametrize(
    "declared", [{"email": "public"}, {"": "personal"}, {"x" * 101: "secret"}]
)
def test_an_unknown_kind_or_a_bad_name_is_refused(declared):
    with pytest.raises(ContractInvalid) as refused:
        contract_spec_validate({**SPEC, "sensitive_fields": declared})
    assert refused.value.context["problems"][0]["path"].startswith("/sensitive_fields")
