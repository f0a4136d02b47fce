"""The ticket desk: a small remote business system for the demo and the tests.

It runs as its own process on a loopback address (``python -m ticketdesk``), creates
tickets under idempotency keys, verifies the gateway's credential, counts every side
effect and can be told to fail in the ways real systems fail. README.md describes it;
``harness.start_ticketdesk`` starts one for a test or a launcher. Standard library
and PyJWT (the credential is an HS256 JWT).
"""

from __future__ import annotations
