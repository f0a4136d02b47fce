"""Redaction: the one way agent- or person-controlled values are stored (invariant 7).

``redact`` is the single entry point. ``audit.services.event_append`` passes every
event payload through it, and every other writer of agent- or person-controlled
values (an operation's input, call fields and result, escalation evidence, outbox
errors, the receipt id a remote system gave) does the same before the row is
written. What it does, in order (docs/redaction.md says what is detected and what is
not):

1. **Declared fields.** A key the pinned contract declares sensitive
   (``sensitive_fields``: ``personal`` or ``secret``) keeps its name; its value
   becomes a keyed hash, ``[personal:hm_…]`` / ``[secret:hm_…]``.
2. **Sensitive key names.** A value under a key such as ``password``, ``api_key``,
   ``authorization`` or ``auth_header`` becomes ``[REDACTED]``; a prompt, completion
   or provider response becomes its keyed digest and size, never the text.
3. **Value detectors**, on every string (and dict key) whatever its key: the
   detect-secrets plugins for tokens and keys (AWS, GitHub, GitLab, Slack, Stripe,
   JWT, PEM private keys, ``user:pass@`` URLs, ``password = "…"`` assignments, and
   more), its Base64 (> 4.5 bits) and hex (> 3.0 bits) entropy tests on each token,
   ``Bearer``/``Basic``/``Token`` credentials, the portal's own agent keys, e-mail
   addresses and Luhn-valid card numbers (also as JSON integers). A secret is cut
   out as ``[REDACTED:<kind>]``; an e-mail or card number becomes a keyed hash
   (``[email:hm_…]``, ``[card:hm_…]``), so the rest of a note stays readable.
4. **Bounds.** Long strings keep a 64-character prefix and a keyed digest; deep or
   wide values are cut; ``max_bytes`` replaces an oversized result by its shape.
   What is scanned is capped (issue 19): a string over ``MAX_SCAN_STRING_CHARS``
   is never scanned and keeps only its length and keyed digest, and a value with
   more than ``MAX_SCAN_CHARS`` to scan becomes its shape. The cost is linear in
   the input (bench/redaction.py).

The keyed hash is HMAC-SHA256 under a per-tenant key derived from the server secret
(``PORTAL_REDACTION_SECRET``, else ``SECRET_KEY``) and the tenant id
(``tenant_key``): the key is in no row, equal values give equal hashes within a
tenant (``search_token`` lets the admin search find them), and another tenant's
hashes do not match.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import uuid
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final

from detect_secrets.plugins.artifactory import ArtifactoryDetector
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.base import BasePlugin
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.cloudant import CloudantDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.high_entropy_strings import (
    Base64HighEntropyString,
    HexHighEntropyString,
)
from detect_secrets.plugins.ibm_cloud_iam import IbmCloudIamDetector
from detect_secrets.plugins.ibm_cos_hmac import IbmCosHmacDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.keyword import KeywordDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.softlayer import SoftlayerDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector
from django.conf import settings

from .exceptions import SensitiveValue

REDACTED: Final = "[REDACTED]"
MAX_STRING_CHARS: Final = 256
MAX_DEPTH: Final = 6
MAX_ITEMS: Final = 50
# The hard cap on what is scanned (issue 19): a string (or dict key) longer than
# MAX_SCAN_STRING_CHARS is not scanned at all, and a value with more than
# MAX_SCAN_CHARS to scan is kept as its shape: see _too_large and redact. Only a
# 64-character prefix of a string over MAX_STRING_CHARS is ever stored, so scanning
# more buys little; scanning costs about 1.5 µs a character, so the two bound the
# time one value can take (docs/redaction.md has the figures).
MAX_SCAN_STRING_CHARS: Final = 64 * 1024
MAX_SCAN_CHARS: Final = 256 * 1024
# A string's fixed cost (two dozen pattern calls), counted in characters.
_SCAN_OVERHEAD_CHARS: Final = 16
# Declared values cut out of every other string, each in a pass over all scanned
# text: past this many distinct values, the payload counts as too large to scan.
MAX_KNOWN_VALUES: Final = 64
SENSITIVE_KINDS: Final = frozenset({"personal", "secret"})

# Keys whose values never go into the audit trail, whatever they hold.
_SENSITIVE_KEY = re.compile(
    r"(secret|token|password|passwd|passphrase|api[_-]?key|authori[sz]ation|"
    r"auth[_-]?header|credential|cookie|session|private|signing[_-]?key|ssn|"
    r"card[_-]?number|\bcvc\b|\bcvv\b)",
    re.IGNORECASE,
)
# Keys whose values are model or provider text: kept as a keyed digest and a size.
_DIGEST_KEY = re.compile(
    r"^(prompt|prompts|completion|completions|messages|provider_response|"
    r"response_body|raw_response)$",
    re.IGNORECASE,
)
# Keys the patterns above would catch that name public facts, not secrets: the
# fencing token is a counter, and the audit trail must show which lease wrote; the
# credential's id and TTL say which grant was used, never its secret.
_PUBLIC_KEYS: Final = frozenset(
    {"lease_token", "credential_id", "credential_ttl_s", "session_id"}
)
# Keys whose values are the portal's own identifiers and digests: the token
# patterns still apply, the entropy tests (which any digest passes) do not.
_IDENTIFIER_KEYS: Final = frozenset(
    {
        "input_hash",
        "hash",
        "prev_hash",
        "head_hash",
        "trace_id",
        "span_id",
        "trace",
        "span",
        "q",  # an export's search term: an exact id (a trace id is 32 hex digits)
        "jti",
        "digest",
        "_digest",
        "anchors_digest",  # a purge tombstone's (audit/retention.py)
        # An approval's bindings and what an approver saw (tasks/approvals.py).
        "field_digest",
        "seen_field_digest",
        "saw_digest",
        "_reference",
    }
)

# detect-secrets' pattern plugins (their ``analyze_string`` yields the secret).
_PLUGINS: Final[tuple[BasePlugin, ...]] = (
    ArtifactoryDetector(),
    AWSKeyDetector(),
    AzureStorageKeyDetector(),
    BasicAuthDetector(),
    CloudantDetector(),
    DiscordBotTokenDetector(),
    GitHubTokenDetector(),
    GitLabTokenDetector(),
    IbmCloudIamDetector(),
    IbmCosHmacDetector(),
    JwtTokenDetector(),
    KeywordDetector(),
    MailchimpDetector(),
    NpmDetector(),
    OpenAIDetector(),
    PrivateKeyDetector(),
    PypiTokenDetector(),
    SendGridDetector(),
    SlackDetector(),
    SoftlayerDetector(),
    SquareOAuthDetector(),
    StripeDetector(),
    TelegramBotTokenDetector(),
    TwilioKeyDetector(),
)
# detect-secrets' plugins are written for the lines of a file, and some of their
# patterns try every start against the rest of the line (npm's "//.+/:_authToken",
# the JWT pattern): on one long string that costs its length squared. They run on
# windows of _WINDOW characters, each overlapping the next by _OVERLAP, so the cost
# grows with the length; a match up to _OVERLAP long lies whole in some window, and
# every occurrence of a secret a window yields is cut, wherever it is.
_WINDOW: Final = 4096
_OVERLAP: Final = 1024
_PLUGIN_KINDS: Final = tuple(
    (plugin, str(plugin.secret_type).lower().replace(" ", "_")) for plugin in _PLUGINS
)
_BASE64 = Base64HighEntropyString()  # limit 4.5, detect-secrets' default
_HEX = HexHighEntropyString()  # limit 3.0
_ENTROPY_TOKEN = re.compile(r"[A-Za-z0-9+/=_\\-]{16,}")
_HEX_TOKEN = re.compile(r"^[0-9a-fA-F]+$")
_HEX_RUN = re.compile(r"[0-9a-fA-F]{16,}")
_UUID = re.compile(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE
)
# Patterns detect-secrets has no plugin for (or reports only a part of).
_OWN_SECRETS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    (
        "private_key",
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?"
            r"(?:-----END [A-Z ]*PRIVATE KEY-----|$)",
            re.DOTALL,
        ),
    ),
    (
        "auth_scheme",
        re.compile(
            r"\b(?:bearer|basic|token|digest|negotiate)\s+[A-Za-z0-9._~+/=-]{6,}",
            re.IGNORECASE,
        ),
    ),
    ("agent_key", re.compile(r"\bagp_[0-9a-f]{12}\.[A-Za-z0-9_-]+")),
    ("stripe", re.compile(r"\b[spr]k_(?:live|test)_[0-9A-Za-z]{8,}")),
    ("slack", re.compile(r"\bxox[abposr]-[0-9A-Za-z-]{8,}")),
    ("github", re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr|github_pat)_[0-9A-Za-z_]{16,}")),
    ("aws", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("url_password", re.compile(r"(?<=://)[^\s:/?#@]+:[^\s/?#@]+(?=@)")),
)
_EMAIL_LOCAL = r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]"
_EMAIL_DOMAIN = (
    r"@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+"
)
_EMAIL = re.compile(f"{_EMAIL_LOCAL}+{_EMAIL_DOMAIN}")
# The same, only where a run of local-part characters starts (see _emails).
_EMAIL_AT_RUN_START = re.compile(f"(?<!{_EMAIL_LOCAL}){_EMAIL_LOCAL}+{_EMAIL_DOMAIN}")
# 13 to 19 digits, optionally grouped by single spaces or dashes, starting 2 to 6 as
# the card networks' numbers do (a millisecond timestamp starts with 1). Not glued to
# a letter, a digit or a dash-joined group on either side: the digit runs inside a
# UUID or a hex digest ("01a23612-5113-7067-a5fc-…") pass a Luhn check one time in ten.
_CARD = re.compile(
    r"(?<![0-9A-Za-z-])[2-6](?:[ -]?\d){12,18}(?![0-9A-Za-z]|-[0-9A-Za-z])"
)
_MARKER = re.compile(r"\[(?:REDACTED(?::[a-z_]+)?|[a-z]+:hm_[0-9a-f]+)\]")
# What this module writes: a marker, or a bare keyed hash (digests, long strings).
# Detectors skip it, so a stored value redacted again (for display) stays the same.
_OWN_OUTPUT = re.compile(
    r"\[(?:REDACTED(?::[a-z_]+)?|[a-z]+:hm_[0-9a-f]+)\]|\bhm_[0-9a-f]{16,64}\b"
)


def tenant_key(tenant_id: uuid.UUID | str, *, purpose: str = "redaction") -> bytes:
    """The tenant's key for ``purpose``: HMAC-SHA256(server secret, purpose, tenant).

    Derived, never stored: the server secret is ``PORTAL_REDACTION_SECRET`` (or
    Django's ``SECRET_KEY`` when that is unset), outside the database.
    """
    secret = settings.PORTAL_REDACTION_SECRET or settings.SECRET_KEY
    return _derived_key(secret, purpose, str(tenant_id))


# Per process, keyed by the secret too (a test's override derives afresh): the
# derived keys are no more exposed in memory than the secret they come from.
@lru_cache(maxsize=1024)
def _derived_key(secret: str, purpose: str, tenant_id: str) -> bytes:
    message = f"portal.{purpose}.v1:{uuid.UUID(tenant_id)}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).digest()


def keyed_hash(tenant_id: uuid.UUID | str, value: str, *, chars: int = 16) -> str:
    """``hm_`` and the first ``chars`` hex digits of the value's HMAC-SHA256."""
    digest = hmac.new(tenant_key(tenant_id), value.encode(), hashlib.sha256)
    return "hm_" + digest.hexdigest()[:chars]


def _normalise(kind: str, value: str) -> str:
    if kind == "email":
        return value.strip().lower()
    if kind == "card":
        return re.sub(r"\D", "", value)
    return value


def search_token(tenant_id: uuid.UUID | str, term: str) -> str | None:
    """The ``hm_…`` hash a stored marker carries for ``term``, when ``term`` is an
    e-mail address, a card number or a declared field's value; None otherwise.

    Lets an admin search find equal values without the value being stored.
    """
    term = term.strip()
    if not term:
        return None
    if _EMAIL.fullmatch(term):
        return keyed_hash(tenant_id, _normalise("email", term))
    if _CARD.fullmatch(term) and _luhn(_normalise("card", term)):
        return keyed_hash(tenant_id, _normalise("card", term))
    return keyed_hash(tenant_id, term)


def _luhn(digits: str) -> bool:
    """A card-like number: 13 to 19 digits, first digit 2 to 6, Luhn check passes."""
    if not 13 <= len(digits) <= 19 or digits[0] not in "23456":
        return False
    total = 0
    for index, char in enumerate(reversed(digits)):
        number = int(char)
        if index % 2:
            number *= 2
            if number > 9:
                number -= 9
        total += number
    return total % 10 == 0


@dataclass(frozen=True)
class Finding:
    """One detected span of a string: where, and what kind."""

    start: int
    end: int
    kind: str  # "email", "card", or the secret's family

    @property
    def personal(self) -> bool:
        return self.kind in ("email", "card")


def _spans_of(text: str, needle: str) -> Iterator[tuple[int, int]]:
    start = text.find(needle)
    while needle and start != -1:
        yield start, start + len(needle)
        start = text.find(needle, start + len(needle))


def _emails(text: str) -> Iterator[re.Match[str]]:
    """``_EMAIL.finditer(text)``, in time linear in the length of ``text``.

    ``_EMAIL`` searched on its own tries every position of a run of local-part
    characters and reads to the run's end each time: quadratic in the run (issue
    19: ``{"blob": "x" * 200_000}`` took 31 s). Every position of a run reaches the
    same "@", so a match can only start where a run starts, or where the previous
    match ended inside one (``finditer`` resumes there): those are tried, no other.
    """
    at = 0
    while True:
        match = _EMAIL.match(text, at) if at else None
        if match is None:
            match = _EMAIL_AT_RUN_START.search(text, at)
        if match is None:
            return
        yield match
        at = match.end()


def _plugin_findings(text: str) -> Iterator[Finding]:
    """What detect-secrets' plugins find, window by window (see ``_WINDOW``)."""
    secrets: dict[str, str] = {}  # each distinct secret once, with its kind
    step = _WINDOW - _OVERLAP
    for offset in range(0, max(1, len(text) - _OVERLAP), step):
        window = text[offset : offset + _WINDOW]
        for plugin, kind in _PLUGIN_KINDS:
            for secret in plugin.analyze_string(window):
                if secret and len(secret) >= 4:
                    secrets.setdefault(secret, kind)
    for secret, kind in secrets.items():
        yield from (Finding(s, e, kind) for s, e in _spans_of(text, secret))


def _entropy_secret(token: str) -> bool:
    if _UUID.match(token):
        return False
    if _HEX_TOKEN.match(token):
        return _HEX.calculate_shannon_entropy(token) > _HEX.entropy_limit
    return (
        len(token) >= 20
        and _BASE64.calculate_shannon_entropy(token) > _BASE64.entropy_limit
    )


def _findings(text: str, entropy: bool) -> tuple[Finding, ...]:
    """Every detected span of ``text``, overlaps merged (the earliest kind wins).

    Linear in the length of ``text``; short texts (keys, codes) are cached, long
    ones are not (the cache would hold them).
    """
    if len(text) < 6:
        return ()
    if len(text) <= MAX_STRING_CHARS:
        return _cached_findings(text, entropy)
    return _merged(text, _detected(text), entropy)


@lru_cache(maxsize=4096)
def _cached_findings(text: str, entropy: bool) -> tuple[Finding, ...]:
    return _merged(text, _cached_detected(text), entropy)


# The patterns' findings, without the entropy tests, cached apart: a value checked
# first without them (``refuse_sensitive``: an idempotency key) and then redacted
# with them (the same key in the event's payload) is scanned by the patterns once.
@lru_cache(maxsize=4096)
def _cached_detected(text: str) -> tuple[Finding, ...]:
    return _detected(text)


def _detected(text: str) -> tuple[Finding, ...]:
    """What the secret and personal-data patterns find (no entropy test), unmerged."""
    found: list[Finding] = []
    for kind, pattern in _OWN_SECRETS:
        found.extend(Finding(m.start(), m.end(), kind) for m in pattern.finditer(text))
    found.extend(_plugin_findings(text))
    found.extend(Finding(m.start(), m.end(), "email") for m in _emails(text))
    found.extend(
        Finding(m.start(), m.end(), "card")
        for m in _CARD.finditer(text)
        if _luhn(_normalise("card", m.group()))
    )
    return tuple(found)


def _merged(
    text: str, detected: tuple[Finding, ...], entropy: bool
) -> tuple[Finding, ...]:
    """``detected`` and, with ``entropy``, the entropy tests' findings: less what
    lies in this module's own output, overlaps merged."""
    found = list(detected)
    if entropy:
        # A hex secret glued to other letters ("x9f86d0…") is no token of its own:
        # _HEX_RUN finds it where _ENTROPY_TOKEN does not.
        found.extend(
            Finding(m.start(), m.end(), "high_entropy")
            for pattern in (_ENTROPY_TOKEN, _HEX_RUN)
            for m in pattern.finditer(text)
            if _entropy_secret(m.group())
        )
    own = [(m.start(), m.end()) for m in _OWN_OUTPUT.finditer(text)]
    if own:
        # Own output spans are disjoint and in order: the last one starting before
        # a finding ends is the only one that can reach into it.
        starts = [start for start, _ in own]
        found = [
            f
            for f in found
            if (prior := bisect_left(starts, f.end) - 1) < 0 or own[prior][1] <= f.start
        ]
    merged: list[Finding] = []
    for finding in sorted(found, key=lambda f: (f.start, -f.end)):
        if merged and finding.start < merged[-1].end:
            last = merged[-1]
            merged[-1] = Finding(last.start, max(last.end, finding.end), last.kind)
        else:
            merged.append(finding)
    return tuple(merged)


def findings(text: str) -> tuple[Finding, ...]:
    """What the value detectors find in ``text`` (spans and kinds, no values)."""
    return _findings(text, True)


def _redact_text(text: str, tenant_id: uuid.UUID | str, *, entropy: bool) -> str:
    spans = _findings(text, entropy)
    if not spans:
        return text
    out: list[str] = []
    at = 0
    for finding in spans:
        out.append(text[at : finding.start])
        value = text[finding.start : finding.end]
        if finding.personal:
            hashed = keyed_hash(tenant_id, _normalise(finding.kind, value))
            out.append(f"[{finding.kind}:{hashed}]")
        else:
            out.append(f"[REDACTED:{finding.kind}]")
        at = finding.end
    out.append(text[at:])
    return "".join(out)


def _digest(tenant_id: uuid.UUID | str, value: Any) -> dict[str, Any]:
    text = value if isinstance(value, str) else json_dumps(value)
    return {
        "_digest": keyed_hash(tenant_id, text, chars=64),
        "_bytes": len(text.encode()),
    }


def json_dumps(value: Any) -> str:
    """Compact JSON, as stored."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


class _TooLargeToScan(Exception):
    """The payload holds more than one call may scan (``MAX_SCAN_CHARS``).

    Private to this module: ``redact`` catches it and stores the payload's shape.
    """


@dataclass
class _Budget:
    """What one ``redact`` call may still scan, in characters."""

    left: int = MAX_SCAN_CHARS

    def spend(self, chars: int) -> None:
        self.left -= chars + _SCAN_OVERHEAD_CHARS
        if self.left < 0:
            raise _TooLargeToScan


@dataclass(frozen=True)
class _Context:
    tenant_id: uuid.UUID | str
    sensitive: Mapping[str, str]
    # Declared values found in this same value, with their markers: a customer's
    # name under ``customer`` is also cut out of the ``summary`` beside it.
    known: tuple[tuple[re.Pattern[str], str], ...] = ()
    budget: _Budget = field(default_factory=_Budget)


def _too_large(tenant_id: uuid.UUID | str, text: str) -> str:
    """What is kept of a string too long to scan: its length and keyed digest.

    Not a character of it is kept: it was never scanned, so a prefix could hold a
    secret. The digest is keyed like every hash here (the text may be personal).
    """
    return f"[TOO LARGE: {len(text)} chars, {keyed_hash(tenant_id, text, chars=64)}]"


def _declared_values(
    value: Any, sensitive: Mapping[str, str], depth: int = 0
) -> Iterator[tuple[str, str]]:
    """(kind, text) of every string value under a declared key, at any depth."""
    if depth > MAX_DEPTH:
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            kind = sensitive.get(str(key))
            if kind is not None and isinstance(item, str | int):
                # A value too long to scan cannot be inside a scanned string.
                if 3 <= len(str(item)) <= MAX_SCAN_STRING_CHARS:
                    yield kind, str(item)
            else:
                yield from _declared_values(item, sensitive, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _declared_values(item, sensitive, depth + 1)


def _declared(context: _Context, kind: str, value: Any) -> str:
    text = value if isinstance(value, str) else json_dumps(value)
    return f"[{kind}:{keyed_hash(context.tenant_id, text)}]"


def _replace_known(text: str, context: _Context) -> str:
    for pattern, marker in context.known:
        text = pattern.sub(marker, text)
    return text


def _shown_key(name: str, context: _Context) -> str:
    if len(name) > MAX_SCAN_STRING_CHARS:
        return _too_large(context.tenant_id, name)
    context.budget.spend(len(name))
    return _redact_text(name, context.tenant_id, entropy=True)[:MAX_STRING_CHARS]


def _walk(value: Any, context: _Context, depth: int, key: str | None) -> Any:
    if depth > MAX_DEPTH:
        return "[TOO DEEP]"
    if isinstance(value, Mapping):
        items = list(value.items())
        out: dict[str, Any] = {}
        for raw_key, item in items[:MAX_ITEMS]:
            name = str(raw_key)
            shown = _shown_key(name, context)
            declared = context.sensitive.get(name)
            if len(name) > MAX_SCAN_STRING_CHARS:
                # Never a sensitive or declared name; its value is scanned as usual.
                out[shown] = _walk(item, context, depth + 1, None)
            elif declared is not None and item is not None:
                out[shown] = _declared(context, declared, item)
            elif _SENSITIVE_KEY.search(name) and name not in _PUBLIC_KEYS:
                # A flag or an absence says nothing secret ("signing_key_replaced").
                keep = item is None or item == "" or isinstance(item, bool)
                out[shown] = item if keep else REDACTED
            elif _DIGEST_KEY.match(name) and item not in (None, ""):
                already = isinstance(item, Mapping) and set(item) == {
                    "_digest",
                    "_bytes",
                }
                out[shown] = dict(item) if already else _digest(context.tenant_id, item)
            else:
                out[shown] = _walk(item, context, depth + 1, name)
        if len(items) > MAX_ITEMS:
            out["_omitted_keys"] = len(items) - MAX_ITEMS
        return out
    if isinstance(value, list | tuple):
        kept = [_walk(item, context, depth + 1, key) for item in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            kept.append(f"[{len(value) - MAX_ITEMS} more items]")
        return kept
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return value
    if isinstance(value, int):
        digits = str(abs(value))
        if _luhn(digits):
            return f"[card:{keyed_hash(context.tenant_id, digits)}]"
        return value
    text = value if isinstance(value, str) else str(value)
    if len(text) > MAX_SCAN_STRING_CHARS:
        return _too_large(context.tenant_id, text)
    context.budget.spend(len(text))
    text = _replace_known(text, context)
    text = _redact_text(text, context.tenant_id, entropy=key not in _IDENTIFIER_KEYS)
    if len(text) > MAX_STRING_CHARS:
        reference = keyed_hash(context.tenant_id, text, chars=64)
        prefix = text[:64]
        # Do not cut a marker in half: a half marker could read as text.
        cut = prefix.rfind("[")
        if cut != -1 and "]" not in prefix[cut:]:
            prefix = prefix[:cut]
        return f"{prefix}… ({len(text)} chars, {reference})"
    return text


def redact(
    value: Any,
    *,
    tenant_id: uuid.UUID | str,
    sensitive: Mapping[str, str] | None = None,
    max_bytes: int | None = None,
) -> Any:
    """A redacted, bounded copy of ``value`` (a JSON-like value) for storage.

    The one entry point of redaction: events, outbox rows, operation inputs, call
    fields and results, escalation evidence, receipt ids and error texts all pass
    through it before they are written. ``sensitive`` maps the pinned contract's
    declared field names to ``personal`` or ``secret``. With ``max_bytes``, a
    mapping that is still bigger as compact JSON becomes its shape (its keys and a
    keyed digest).

    Bounded: a string or key over ``MAX_SCAN_STRING_CHARS`` is not scanned and
    becomes ``[TOO LARGE: N chars, hm_…]``; a value holding more than
    ``MAX_SCAN_CHARS`` to scan, or more than ``MAX_KNOWN_VALUES`` distinct declared
    values, becomes its shape as soon as that is known (a mapping; anything else a
    ``[TOO LARGE…]`` string). The time taken grows linearly with the input.

    Guarantee: no value under a sensitive key or a declared field, and no span a
    detector finds, is in the result; equal declared values, e-mail addresses and
    card numbers give equal ``hm_`` hashes within the tenant.
    """
    sensitive = sensitive or {}
    declared = set(_declared_values(value, sensitive))
    if len(declared) > MAX_KNOWN_VALUES:
        return _too_large_shape(value, tenant_id)
    known = tuple(
        (
            re.compile(re.escape(text), re.IGNORECASE),
            f"[{kind}:{keyed_hash(tenant_id, text)}]",
        )
        for kind, text in sorted(declared, key=lambda k: -len(k[1]))
    )
    context = _Context(tenant_id=tenant_id, sensitive=sensitive, known=known)
    try:
        redacted = _walk(value, context, 0, None)
    except _TooLargeToScan:
        return _too_large_shape(value, tenant_id)
    if max_bytes is None or not isinstance(redacted, dict):
        return redacted
    encoded = json_dumps(redacted)
    if len(encoded.encode()) <= max_bytes:
        return redacted
    # Too big even after redaction: keep the shape, drop the values.
    return {
        "_truncated": True,
        "_reference": keyed_hash(tenant_id, encoded, chars=64),
        "_keys": sorted(str(key)[:64] for key in redacted)[:MAX_ITEMS],
    }


def _too_large_shape(value: Any, tenant_id: uuid.UUID | str) -> Any:
    """A value with too much to scan: a mapping's shape, or a ``[TOO LARGE…]``.

    The reference is the keyed digest of the value as given (it was not redacted);
    each key shown is its first ``MAX_STRING_CHARS`` characters, redacted, then cut
    to 64 as in the shape of an oversized payload.
    """
    encoded = json_dumps(value)
    if not isinstance(value, Mapping):
        return _too_large(tenant_id, encoded)
    context = _Context(tenant_id=tenant_id, sensitive={})
    keys = [str(key)[:MAX_STRING_CHARS] for key in list(value)[:MAX_ITEMS]]
    return {
        "_truncated": True,
        "_too_large": True,
        "_reference": keyed_hash(tenant_id, encoded, chars=64),
        "_keys": sorted(_shown_key(key, context)[:64] for key in keys),
    }


def is_redacted_marker(text: str) -> bool:
    """Whether ``text`` is exactly one marker this module writes."""
    return bool(_MARKER.fullmatch(text))


def refuse_sensitive(**values: str | None) -> None:
    """Refuse identifiers that carry a secret or personal data, naming no value.

    For the columns that must be stored and matched exactly (a client task id, an
    object id, an idempotency key, a lease owner, a receipt id an agent reports):
    they cannot be redacted without breaking the match, so they must not carry
    such data at all.

    Raises:
        SensitiveValue: with the field's name and the detected kind, never the value.
    """
    for name, value in values.items():
        if not value:
            continue
        # No entropy test: opaque identifiers are random on purpose.
        found = _findings(value, False)
        if found:
            raise SensitiveValue(field=name, detected=found[0].kind)
