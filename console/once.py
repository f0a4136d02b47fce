"""One-time form tokens: a form that makes something once makes it once.

The page that offers "Issue a new API key" or "Rotate" carries a token
(:func:`once_token`, signed with the site's secret, naming the person and a random
nonce, valid for ``ONCE_MAX_AGE_S``). The POST that acts first spends it
(:func:`once_spend`): one ``INSERT … ON CONFLICT DO NOTHING`` of its digest into
``console_usedformtoken``, in a short transaction of its own, so of two POSTs of the
same page (a resubmission, a double click, the back button and send again) exactly
one goes on, whatever their timing, and the other makes nothing. The page is then
answered as before: the new secret shown once.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Final

from django.core import signing
from django.db import connection, transaction

from portal.roles import Person

from .exceptions import FormAlreadyUsed, FormExpired

ONCE_FIELD: Final = "once"
ONCE_MAX_AGE_S: Final = 3600
_SALT: Final = "console.once"


def once_token(*, user: Person) -> str:
    """A fresh token for one form on a page shown to ``user``."""
    return signing.dumps({"u": user.pk, "n": secrets.token_hex(16)}, salt=_SALT)


@transaction.atomic(durable=True)
def once_spend(*, user: Person, token: str) -> None:
    """Spend a form's token: the first POST of the form goes on, any other is refused.

    Guarantee: of any number of calls with one token, concurrent or not, at most
    one returns; spent tokens past their life are deleted in the same transaction.

    Raises:
        FormExpired: no token, a forged or another person's one, or one older than
            ``ONCE_MAX_AGE_S``.
        FormAlreadyUsed: the token was spent already.
    """
    try:
        payload = signing.loads(token, salt=_SALT, max_age=ONCE_MAX_AGE_S)
    except signing.BadSignature:  # SignatureExpired included
        raise FormExpired() from None
    if not isinstance(payload, dict) or payload.get("u") != user.pk or not user.pk:
        raise FormExpired()
    digest = hashlib.sha256(token.encode()).hexdigest()
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM console_usedformtoken"
            " WHERE used_at < now() - make_interval(secs => %s)",
            [ONCE_MAX_AGE_S * 2],
        )
        cursor.execute(
            "INSERT INTO console_usedformtoken (digest, user_id, used_at)"
            " VALUES (%s, %s, now()) ON CONFLICT (digest) DO NOTHING",
            [digest, user.pk],
        )
        if cursor.rowcount != 1:
            raise FormAlreadyUsed()
