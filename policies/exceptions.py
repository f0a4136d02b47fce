"""Errors of the policy domain (docs/policies.md)."""

from __future__ import annotations

from portal import db as portal_db
from portal.codes import ReasonCode
from portal.exceptions import NotFound, PortalError, ValidationFailed


class PolicySetNotFound(NotFound):
    """No such policy set version."""


class PolicyInvalid(ValidationFailed):
    """The policy set does not parse or does not fit the tenant's schema.

    ``problems`` lists each with its message, the policy it is in and its line.
    """

    code = "POLICY_INVALID"


class PolicyImmutable(PortalError):
    """A published policy set cannot change; draft a new version instead."""

    code = "POLICY_IMMUTABLE"
    status = 409


class PolicyDenied(PortalError):
    """The tenant's policies do not permit this action (no permit, or a forbid)."""

    code = ReasonCode.POLICY_DENIED
    status = 403


class PolicyError(PortalError):
    """The tenant's policies could not be evaluated, so the action is refused."""

    code = ReasonCode.POLICY_ERROR
    status = 403


portal_db.register_constraint_errors(
    {"policies_policyset_immutable_trg": PolicyImmutable}
)
