"""RFC 3161 time-stamp tokens on tree heads (``rfc3161-client``).

After a checkpoint run commits, ``head_timestamp`` asks the time-stamping
authority (``PORTAL_AUDIT_TSA_URL``) for a token over the head's checkpoint body
(the note's text without signatures: origin, size, root): the token's message
imprint is ``SHA-256(body)``, what this module calls the head's hash. The whole
``TimeStampResp`` (DER) is kept in an ``audit_headstamp`` row, so anyone with the
TSA's root certificate can later show that the head existed at ``genTime``.

``stamp_verify`` checks a stored token: its imprint equals the head's hash
(``timestamp for another head`` otherwise) and its signature chains to a
configured root (``forged timestamp`` otherwise).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import httpx
import rfc3161_client
from cryptography import x509
from django.conf import settings
from django.db import IntegrityError, transaction

from .verify import Break

if TYPE_CHECKING:
    from .models import HeadStamp, TreeHead

logger = logging.getLogger(__name__)

Certificate = x509.Certificate
FORGED_TIMESTAMP: Final = "forged timestamp"
TIMESTAMP_FOR_ANOTHER_HEAD: Final = "timestamp for another head"
PLACE: Final = "timestamp"
QUERY_TYPE: Final = "application/timestamp-query"


class TimestampError(ValueError):
    """A TSA answer that is not a granted token over what was asked."""


def head_hash(body: str) -> bytes:
    """What a head's token must imprint: SHA-256 of its checkpoint body."""
    return hashlib.sha256(body.encode("utf-8")).digest()


def request(body: str, *, url: str, client: httpx.Client) -> bytes:
    """A granted ``TimeStampResp`` (DER) over ``body`` from the TSA at ``url``.

    Raises:
        TimestampError: refused, or not over this body, or another nonce.
        httpx.HTTPError: the TSA did not answer.
    """
    query = (
        rfc3161_client.TimestampRequestBuilder()
        .data(body.encode("utf-8"))
        .hash_algorithm(rfc3161_client.HashAlgorithm.SHA256)
        .build()
    )
    response = client.post(
        url,
        content=query.as_bytes(),
        headers={"Content-Type": QUERY_TYPE},
        timeout=settings.PORTAL_AUDIT_WITNESS_TIMEOUT_S,
    )
    response.raise_for_status()
    try:
        answer = rfc3161_client.decode_timestamp_response(response.content)
    except ValueError as error:
        raise TimestampError(f"not a time-stamp response: {error}") from None
    if answer.status != rfc3161_client.PKIStatus.GRANTED:
        raise TimestampError(f"the TSA refused: status {answer.status}")
    info = answer.tst_info
    if info.message_imprint.message != head_hash(body):
        raise TimestampError("the token imprints something else")
    if query.nonce is not None and info.nonce != query.nonce:
        raise TimestampError("the token answers another request (nonce)")
    return answer.as_bytes()


def head_timestamp(
    head: TreeHead, *, url: str, client: httpx.Client
) -> HeadStamp | None:
    """Get and store a token for ``head``; None (logged) when the TSA failed."""
    from .models import HeadStamp
    from .witness_client import head_body

    try:
        der = request(head_body(head), url=url, client=client)
    except (httpx.HTTPError, TimestampError) as error:
        logger.warning("TSA %s: head %s not time-stamped: %s", url, head.size, error)
        return None
    gen_time = rfc3161_client.decode_timestamp_response(der).tst_info.gen_time
    try:
        with transaction.atomic():
            return HeadStamp.objects.create(
                tenant_id=head.tenant_id,
                tree_head=head,
                kind=HeadStamp.Kind.RFC3161,
                signer=url,
                stamp=base64.b64encode(der).decode("ascii"),
                stamped_at=gen_time.astimezone(dt.UTC),
            )
    except IntegrityError:
        return None


def roots_load(pem: bytes) -> list[Certificate]:
    return list(x509.load_pem_x509_certificates(pem))


def configured_roots() -> list[Certificate]:
    path = settings.PORTAL_AUDIT_TSA_ROOT_FILE
    if not path:
        return []
    with open(path, "rb") as file:
        return roots_load(file.read())


def token_check(
    der: bytes, *, body: str, roots: Sequence[Certificate]
) -> tuple[str, str] | None:
    """(kind, detail) when the token is not a valid one over ``body``; None when it
    is. Shared with tools/verify_bundle.py's copy (it cannot import this)."""
    try:
        answer = rfc3161_client.decode_timestamp_response(der)
    except ValueError as error:
        return FORGED_TIMESTAMP, f"not a time-stamp response: {error}"
    if answer.tst_info.message_imprint.message != head_hash(body):
        return TIMESTAMP_FOR_ANOTHER_HEAD, "the token imprints another head's hash"
    failures = []
    for root in roots:
        verifier = rfc3161_client.VerifierBuilder().add_root_certificate(root).build()
        try:
            verifier.verify_message(answer, body.encode("utf-8"))
        except (rfc3161_client.VerificationError, ValueError) as error:
            failures.append(str(error))
            continue
        return None
    return (
        FORGED_TIMESTAMP,
        "the token does not verify to a given TSA root: " + "; ".join(failures),
    )


def stamp_verify(
    row: HeadStamp, *, head: TreeHead, body: str, roots: Sequence[Certificate]
) -> Break | None:
    try:
        der = base64.b64decode(row.stamp, validate=True)
    except ValueError:
        der = b""
    found = token_check(der, body=body, roots=roots)
    if found is None:
        return None
    kind, detail = found
    return Break(kind, PLACE, f"tree head of {head.size}, TSA {row.signer}: {detail}")
