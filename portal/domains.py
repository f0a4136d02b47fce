"""Closed lists of values enforced by PostgreSQL domains, not by table CHECKs.

A table's CHECK constraint is stored as text and parsed again by every statement
that writes the table (``ExecRelCheck`` runs ``stringToNode`` on it), so a list of
62 event codes cost about 40 µs on every insert into ``audit_event``, 60 µs on a
loaded machine, and the 20 reason codes half that on each of the task, operation
and event tables (``docs/performance.md``, "Value lists as domains"). A domain's
CHECK is parsed once per session and kept in the type cache: the same guarantee,
checked on every write, for a few microseconds.

The lists are the Python enums' (``EventCode``, ``ReasonCode``, ``TaskState``,
``OperationState``, ``OutboxState``, ``ActorType``); a migration freezes each list
as it stands, and ``tests/db/test_constraints.py`` fails when the enum and the
database differ. The event payload's size bound is a domain over ``jsonb`` the same
way (``DomainJSONField``). Each domain's CHECK keeps the name the table CHECK had,
which errors are mapped by. To add a value: add it to the enum, run
``makemigrations``, and add to that migration the new list and the one before::

    migrations.RunSQL(
        *replace_domain_values_sql(DOMAIN, CHECK, values=NEW, previous=OLD)
    )

To move a column that holds rows onto a new domain, put the two halves of
``domain_values_for_column_sql`` (or ``domain_for_column_sql``) around the
``AlterField``: no table rewrite (tasks/migrations/0024 shows it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import models


def _values_check(values: Sequence[str]) -> str:
    for value in values:
        if "'" in value:
            raise ValueError(f"a domain value may not hold a quote: {value!r}")
    return "VALUE IN (" + ", ".join(f"'{value}'" for value in values) + ")"


def create_domain_sql(
    domain: str, constraint: str, base: str, values: Sequence[str]
) -> tuple[str, str]:
    """``CREATE DOMAIN`` over ``base`` allowing ``values`` (and NULL); and its undo."""
    return (
        f"CREATE DOMAIN {domain} AS {base} "
        f"CONSTRAINT {constraint} CHECK ({_values_check(values)})",
        f"DROP DOMAIN {domain}",
    )


def domain_for_column_sql(
    domain: str, constraint: str, base: str, check: str
) -> tuple[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]]:
    """For moving a column that holds rows onto a new domain, without a rewrite.

    Two ``RunSQL`` argument pairs, to put around the ``AlterField``: first the
    domain without its check (the column's type change is then binary-coercible:
    no rewrite, indexes kept), then its check (``VALUE`` for the value), added
    NOT VALID and validated (one scan of the rows, no rewrite). A domain created
    with its check would make PostgreSQL rewrite the whole table to change the
    column's type (``ATColumnChangeRequiresRewrite``).
    """
    return (
        (f"CREATE DOMAIN {domain} AS {base}", f"DROP DOMAIN {domain}"),
        (
            (
                f"ALTER DOMAIN {domain} ADD CONSTRAINT {constraint} "
                f"CHECK ({check}) NOT VALID",
                f"ALTER DOMAIN {domain} VALIDATE CONSTRAINT {constraint}",
            ),
            (f"ALTER DOMAIN {domain} DROP CONSTRAINT {constraint}",),
        ),
    )


def domain_values_for_column_sql(
    domain: str, constraint: str, base: str, values: Sequence[str]
) -> tuple[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]]:
    """``domain_for_column_sql`` for a closed list of ``values`` (and NULL)."""
    return domain_for_column_sql(domain, constraint, base, _values_check(values))


def replace_domain_values_sql(
    domain: str,
    constraint: str,
    values: Sequence[str],
    previous: Sequence[str],
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Swap a domain's list for ``values`` (reverse: back to ``previous``).

    The new check is added NOT VALID and then validated, so the scan of the rows
    already written does not hold the lock that blocks writers.
    """

    # Tuples, not lists: RunSQL's statement lists are typed covariantly only so.
    def swap(to: Sequence[str]) -> tuple[str, ...]:
        return (
            f"ALTER DOMAIN {domain} DROP CONSTRAINT {constraint}",
            f"ALTER DOMAIN {domain} ADD CONSTRAINT {constraint} "
            f"CHECK ({_values_check(to)}) NOT VALID",
            f"ALTER DOMAIN {domain} VALIDATE CONSTRAINT {constraint}",
        )

    return swap(values), swap(previous)


class _DomainField(models.Field):
    """A field whose column type is a PostgreSQL domain (see the module's text).

    The Python-side validation of the base field stays; the domain (created by a
    migration with ``create_domain_sql`` or ``domain_for_column_sql``) is the
    database's wall.
    """

    def __init__(self, *args: Any, domain: str, **kwargs: Any) -> None:
        self.domain = domain
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        kwargs["domain"] = self.domain
        return name, path, args, kwargs

    def db_type(self, connection: Any) -> str:
        return self.domain


class DomainCharField(_DomainField, models.CharField):
    """A CharField over a domain: ``max_length`` and ``choices`` still validate in
    Python; the domain's list is the database's wall."""


class DomainJSONField(_DomainField, models.JSONField):
    """A JSONField over a domain on ``jsonb`` (``audit_event.payload``'s size bound)."""
