"""The audit trail's public API: the checkpoint signing key's public half."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from . import checkpoints


# Outside the agent API's schema, like the API root: anonymous, no problem answers
# beyond 503 (no public key file yet), documented in docs/audit-integrity.md.
@extend_schema(exclude=True)
class AuditPublicKeyApi(APIView):
    """The Ed25519 public key that verifies audit checkpoints (anonymous).

    Read from the public key file: the web holds no private key to derive it from.
    """

    authentication_classes = []
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        key_id, public = checkpoints.public_key()
        return Response(
            {
                "algorithm": "Ed25519",
                "key_id": key_id,
                "public_key_pem": checkpoints.public_key_pem(public),
            }
        )
