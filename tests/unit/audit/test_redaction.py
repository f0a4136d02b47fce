from __future__ import annotations

import hashlib
import json
import random
import uuid

import pytest
from django.conf import settings

from audit import redaction
from audit.exceptions import SensitiveValue
from audit.redaction import (
    MAX_KNOWN_VALUES,
    MAX_SCAN_CHARS,
    MAX_SCAN_STRING_CHARS,
    REDACTED,
    keyed_hash,
    redact,
    refuse_sensitive,
    search_token,
)

TENANT = uuid.UUID("00000000-0000-4000-8000-000000000001")
OTHER = uuid.UUID("00000000-0000-4000-8000-000000000002")
MAX = settings.PORTAL_EVENT_PAYLOAD_MAX_BYTES // 2

EMAIL = "ana.lima@example.com"
CARD = "4111 1111 1111 1111"
GHP = "ghp_Zx9Qm2Lr7Tn4Vb8Kc1Hs6Jd3Fg5Wp0Ey2Ua"
BASIC = "Basic YWRtaW46aHVudGVyMg=="
# The connector signing key of the finding: random, under an innocent key name.
SIGNING_KEY = "k3Y9fQ2xLp8Vw7ZrT1bN5mH4cJ6dS0aE"


def _text(value: object) -> str:
    return json.dumps(value)


def test_sensitive_keys_and_credential_shaped_values_are_redacted():
    redacted = redact(
        {
            "Authorization": "Bearer abc.def",
            "nested": [{"client_secret": "x"}, "Bearer sometoken"],
            "note": "key agp_0123456789ab.rest-of-it",
            "ok": 3,
        },
        tenant_id=TENANT,
    )
    assert redacted == {
        "Authorization": REDACTED,
        "nested": [{"client_secret": REDACTED}, "[REDACTED:auth_scheme]"],
        "note": "key [REDACTED:agent_key]",
        "ok": 3,
    }


def test_the_findings_of_issue_9_are_no_longer_stored_verbatim():
    """Each value below was found stored verbatim in events and the outbox."""
    data = {
        "note": f"Customer {EMAIL} paid with {CARD}; please call back",
        "auth_header": "Token abcdef123456",
        "header": f"Authorization: {BASIC}",
        "detail": f"pushed with {GHP} yesterday",
        "config": {"connector": SIGNING_KEY},
    }
    redacted = redact(data, tenant_id=TENANT, max_bytes=MAX)
    text = _text(redacted)
    for planted in (EMAIL, CARD, "1111", "abcdef123456", "YWRtaW46", GHP, SIGNING_KEY):
        assert planted not in text
    # what is left still reads as a note, with searchable markers
    assert redacted["note"] == (
        f"Customer [email:{keyed_hash(TENANT, EMAIL)}] paid with "
        f"[card:{keyed_hash(TENANT, '4111111111111111')}]; please call back"
    )
    assert redacted["detail"] == "pushed with [REDACTED:github] yesterday"
    assert redacted["auth_header"] == REDACTED


@pytest.mark.parametrize(
    "secret",
    [
        "AKIAIOSFODNN7EXAMPLE",
        "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
        "xoxb-123456789012-abcdefghijklmnop",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
        "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx\n"
        "-----END RSA PRIVATE KEY-----",
        "postgres://app:Pa55w0rdCanary@db.internal:5432/portal",
        'password = "hunter2canary"',
        "9f86d081884c7d659a2feaa0c55ad015",  # hex, entropy > 3.0
    ],
)
def test_detector_families_cut_the_secret_out_of_free_text(secret):
    redacted = redact({"text": f"before {secret} after"}, tenant_id=TENANT)
    core = secret.split("@")[0].split(":")[-1] if "://" in secret else secret
    assert core not in redacted["text"]
    assert redacted["text"].startswith("before ")


def test_card_numbers_need_a_luhn_check_and_are_caught_as_integers_too():
    redacted = redact(
        {"paid": 4111111111111111, "order": 4111111111111112, "ts": 1733070000000},
        tenant_id=TENANT,
    )
    assert redacted["paid"] == f"[card:{keyed_hash(TENANT, '4111111111111111')}]"
    assert redacted["order"] == 4111111111111112  # fails the Luhn check
    assert redacted["ts"] == 1733070000000


def test_public_identifiers_and_digests_stay_readable():
    data = {
        "from": "running",
        "idempotency_key": "ticket-for-issue-1042",
        "operation_id": str(uuid.uuid4()),
        "input_hash": "ab" * 32,
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "lease_token": 7,
    }
    assert redact(data, tenant_id=TENANT) == data


def test_digit_runs_inside_uuids_and_digests_are_no_card_numbers():
    # CI once hashed an agent id in an escalation's evidence: "23612-5113-7067"
    # inside it passes the Luhn check, as about one UUID in 300 has such a run.
    rng = random.Random(20261202)
    uuids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(5000)]
    digests = [hashlib.sha256(rng.randbytes(8)).hexdigest() for _ in range(5000)]
    values = [{"agent_id": "01a23612-5113-7067-a5fc-4859706f1e14"}]
    values += [{"agent_id": value} for value in uuids]
    values += [{"input_hash": value} for value in digests]
    assert [v for v in values if redact(v, tenant_id=TENANT) != v] == []
    # the same numbers standing alone, grouped or embedded in a sentence, are caught
    for text in (
        "4111-1111-1111-1111",
        "paid 4111 1111 1111 1111.",
        "cc=4111111111111111;",
    ):
        assert "[card:hm_" in redact({"note": text}, tenant_id=TENANT)["note"], text


def test_declared_fields_become_keyed_hashes_that_match_within_a_tenant_only():
    sensitive = {"customer_name": "personal", "api_secret": "secret"}
    first = redact(
        {"customer_name": "Ana Lima", "api_secret": "s", "queue": "billing"},
        tenant_id=TENANT,
        sensitive=sensitive,
    )
    again = redact({"customer_name": "Ana Lima"}, tenant_id=TENANT, sensitive=sensitive)
    other = redact({"customer_name": "Ana Lima"}, tenant_id=OTHER, sensitive=sensitive)
    assert first["customer_name"] == again["customer_name"]
    assert first["customer_name"].startswith("[personal:hm_")
    assert first["api_secret"].startswith("[secret:hm_")
    assert other["customer_name"] != first["customer_name"]
    assert first["queue"] == "billing"
    # an admin search for the value finds the marker, without the value stored
    assert search_token(TENANT, "Ana Lima") in first["customer_name"]
    assert search_token(TENANT, EMAIL.upper()) == keyed_hash(TENANT, EMAIL)


def test_prompts_and_provider_responses_are_kept_as_digest_and_size():
    body = {"ticket_id": "T-1", "customer": EMAIL, "echo": "x" * 100_000}
    redacted = redact(
        {"prompt": "You are a helpful agent...", "provider_response": body},
        tenant_id=TENANT,
    )
    assert set(redacted["prompt"]) == {"_digest", "_bytes"}
    assert set(redacted["provider_response"]) == {"_digest", "_bytes"}
    assert redacted["provider_response"]["_bytes"] > 100_000
    assert EMAIL not in _text(redacted)


def test_dict_keys_are_scanned_too():
    redacted = redact({f"note for {EMAIL}": 1}, tenant_id=TENANT)
    assert EMAIL not in _text(redacted)


def test_a_secret_past_the_cut_of_a_long_string_is_not_kept():
    text = "a" * 300 + f" {GHP}"
    value = redact({"text": text}, tenant_id=TENANT)["text"]
    assert GHP not in value and "hm_" in value and len(value) < 200


def test_long_strings_become_a_prefix_and_a_keyed_reference():
    value = redact({"text": "a" * 10_000}, tenant_id=TENANT)["text"]
    assert value.startswith("a" * 64) and "hm_" in value and len(value) < 200


def test_an_oversized_payload_keeps_only_its_shape():
    payload = {f"k{i}": "v" * 200 for i in range(45)}
    redacted = redact(payload, tenant_id=TENANT, max_bytes=MAX)
    assert redacted["_truncated"] is True and len(redacted["_keys"]) == 45
    assert len(json.dumps(redacted)) <= settings.PORTAL_EVENT_PAYLOAD_MAX_BYTES


def test_the_fencing_token_is_a_public_fact_not_a_secret():
    """Found by the benchmark work: every event had its lease_token redacted."""
    redacted = redact(
        {"lease_token": 7, "token": "s3cret", "api_token": "x"}, tenant_id=TENANT
    )
    assert redacted == {"lease_token": 7, "token": REDACTED, "api_token": REDACTED}


def test_identifiers_carrying_secrets_or_personal_data_are_refused_unnamed():
    refuse_sensitive(object_id="issue-1042", idempotency_key=uuid.uuid4().hex)
    with pytest.raises(SensitiveValue) as refused:
        refuse_sensitive(object_id=EMAIL)
    assert refused.value.status == 422
    assert refused.value.context == {"field": "object_id", "detected": "email"}
    assert EMAIL not in str(refused.value)


def test_a_declared_value_is_cut_out_of_the_text_beside_it():
    redacted = redact(
        {"customer": "Ana Lima", "summary": "Refund for ANA LIMA, today"},
        tenant_id=TENANT,
        sensitive={"customer": "personal"},
    )
    marker = f"[personal:{keyed_hash(TENANT, 'Ana Lima')}]"
    assert redacted == {"customer": marker, "summary": f"Refund for {marker}, today"}


def test_redacting_a_stored_value_again_changes_nothing():
    """The admin redacts stored values again when it shows them."""
    once = redact(
        {"note": f"{EMAIL} {CARD} {GHP} " + "x" * 300, "prompt": "p"},
        tenant_id=TENANT,
    )
    assert redact(once, tenant_id=TENANT) == once


def test_a_flag_under_a_sensitive_key_is_kept():
    """Found by the connector audit: ``signing_key_replaced: false`` was blanked."""
    redacted = redact(
        {"signing_key_replaced": False, "signing_key": "k", "password": None},
        tenant_id=TENANT,
    )
    assert redacted == {
        "signing_key_replaced": False,
        "signing_key": REDACTED,
        "password": None,
    }


# Issue 19: redaction is linear in its input, and what it scans is capped.


def test_a_string_over_the_cap_is_kept_as_its_length_and_keyed_digest_only():
    text = f"{GHP} {EMAIL} " + "x" * MAX_SCAN_STRING_CHARS
    redacted = redact({"blob": text, text: 1}, tenant_id=TENANT)
    marker = f"[TOO LARGE: {len(text)} chars, {keyed_hash(TENANT, text, chars=64)}]"
    assert redacted == {"blob": marker, marker: 1}
    assert GHP not in _text(redacted) and EMAIL not in _text(redacted)


def test_a_string_at_the_cap_is_still_scanned():
    text = f"{GHP} " + "x" * (MAX_SCAN_STRING_CHARS - len(GHP) - 1)
    value = redact({"blob": text}, tenant_id=TENANT)["blob"]
    assert value.startswith("[REDACTED:") and "TOO LARGE" not in value


@pytest.fixture
def scanned(monkeypatch) -> list[int]:
    """The length of every text the detectors scan, in order (the real scan runs)."""
    lengths: list[int] = []
    scan = redaction._detected

    def counting_scan(text: str):
        lengths.append(len(text))
        return scan(text)

    monkeypatch.setattr(redaction, "_detected", counting_scan)
    return lengths


def test_a_string_over_the_cap_is_never_scanned(scanned):
    """The capped path is taken: not one character of the string is scanned."""
    redact({"note": "x" * (MAX_SCAN_STRING_CHARS + 1)}, tenant_id=TENANT)
    assert scanned == []  # "note" is under 6 characters: nothing to scan either


def test_a_payload_with_too_much_to_scan_becomes_its_shape_before_it_is_all_read(
    scanned,
):
    note = f"mail {EMAIL} " + "y" * 40_000
    payload = {f"to {EMAIL} {i}": [f"{j}{note}" for j in range(5)] for i in range(20)}
    redacted = redact(payload, tenant_id=TENANT)
    # then only the shape is kept, and scanning stopped at the bound (4 MB given)
    assert redacted["_truncated"] is True and redacted["_too_large"] is True
    assert len(redacted["_keys"]) == 20 and EMAIL not in _text(redacted)
    assert sum(scanned) <= MAX_SCAN_CHARS + len(note) + 1 + 256 * 20
    assert redact(redacted, tenant_id=TENANT) == redacted


def test_too_many_declared_values_make_the_payload_too_large_to_scan():
    rows = [{"customer": f"Customer number {i}"} for i in range(MAX_KNOWN_VALUES + 1)]
    redacted = redact(
        {"rows": rows}, tenant_id=TENANT, sensitive={"customer": "personal"}
    )
    assert redacted["_too_large"] is True and "Customer number" not in _text(redacted)
    kept = redact(
        {"rows": rows[:MAX_KNOWN_VALUES]},
        tenant_id=TENANT,
        sensitive={"customer": "personal"},
    )
    assert "rows" in kept and "Customer number" not in _text(kept)


def test_no_detect_secrets_plugin_reads_more_than_a_window(monkeypatch):
    """What made a plugin quadratic is bounded: each call reads one window."""
    read: list[int] = []
    for plugin in redaction._PLUGINS:
        analyze = plugin.analyze_string

        def counting(text: str, analyze=analyze):
            read.append(len(text))
            return analyze(text)

        monkeypatch.setattr(plugin, "analyze_string", counting)
    text = "//a/:_authToken=" + "eyJ" * (MAX_SCAN_STRING_CHARS // 3 - 6)
    redact({"blob": text}, tenant_id=TENANT)
    windows = len(read) // len(redaction._PLUGINS)
    assert max(read) == redaction._WINDOW
    step = redaction._WINDOW - redaction._OVERLAP
    assert windows == -(-(len(text) - redaction._OVERLAP) // step)


def test_a_secret_a_plugin_finds_is_cut_wherever_it_repeats():
    """The keyword plugin finds a password in one window; its repeat far off goes."""
    text = 'password = "hunter2canary"' + " pad" * 3000 + " then hunter2canary again"
    # (the stored form keeps a prefix only: the full redacted text is checked)
    assert "hunter2canary" not in redaction._redact_text(text, TENANT, entropy=True)


@pytest.mark.parametrize("seed", range(40))
def test_the_linear_email_scan_finds_what_the_plain_pattern_finds(seed):
    rng = random.Random(seed)
    alphabet = "ab.-_+@ c9" if seed % 2 else "xy@.com-+_ "
    text = "".join(rng.choice(alphabet) for _ in range(400))
    text += " a@b.com+c@d.org a@b.c_x@d.org x@y.z@w.org"
    expected = [m.span() for m in redaction._EMAIL.finditer(text)]
    assert [m.span() for m in redaction._emails(text)] == expected
