from __future__ import annotations

import json

from django.conf import settings

from audit.redaction import REDACTED, redact_payload


def test_sensitive_keys_and_credential_shaped_values_are_redacted():
    redacted = redact_payload(
        {
            "Authorization": "Bearer abc.def",
            "nested": [{"client_secret": "x"}, "Bearer sometoken"],
            "note": "key agp_0123456789ab.rest-of-it",
            "prompt": "You are a helpful agent...",
            "ok": 3,
        }
    )
    assert redacted == {
        "Authorization": REDACTED,
        "nested": [{"client_secret": REDACTED}, REDACTED],
        "note": REDACTED,
        "prompt": REDACTED,
        "ok": 3,
    }


def test_long_strings_become_a_prefix_and_a_reference():
    value = redact_payload({"text": "a" * 10_000})["text"]
    assert value.startswith("a" * 64) and "sha256:" in value and len(value) < 200


def test_an_oversized_payload_keeps_only_its_shape():
    payload = {f"k{i}": "v" * 200 for i in range(45)}
    redacted = redact_payload(payload)
    assert redacted["_truncated"] is True and len(redacted["_keys"]) == 45
    assert len(json.dumps(redacted)) <= settings.PORTAL_EVENT_PAYLOAD_MAX_BYTES


def test_the_fencing_token_is_a_public_fact_not_a_secret():
    """Found by the benchmark work: every event had its lease_token redacted."""
    redacted = redact_payload({"lease_token": 7, "token": "s3cret", "api_token": "x"})
    assert redacted == {"lease_token": 7, "token": REDACTED, "api_token": REDACTED}
