"""The data set of ``manage.py load_scale_data``: realistic, at scale, by COPY.

    manage.py load_scale_data --tasks 1000000 --events 10000000 --tenants 20
        [--outbox N] [--seed S] [--append]

What it makes:

- ``--tenants`` tenants ``scale-t01`` … with skewed sizes (tenant *n* gets a share
  proportional to 1/n, so ``scale-t01`` is the largest), each with a reviewer, a
  support user and a tenant admin (``reviewer-t03``, ``support-t03``, ``admin-t03``,
  password ``scale-demo-password``), three agents, the ``customer-issue`` contract
  and the ``ticket-desk`` connector. These go through the services, as an admin
  would make them, so memberships carry their object permissions.
- Tasks in a realistic mix of states (mostly succeeded; some failed, cancelled,
  pending, running, waiting; about 0.5 % waiting for a person, with escalations and
  evidence, a few of them claimed), their operations and credentials, and 5-15
  events per task with the codes, actors (agent, user, system), payloads and reason
  codes the services write. A task's events share its trace id; each has its own
  span id. Finished tasks are spread over the last 90 days; unfinished ones over
  the time they plausibly stay so (running: the last hour; pending: two days;
  waiting: a week; escalations: two weeks).
- The gateway's events as it writes them now: one ``gateway.checked`` per check
  pass (every check that ran, a refusal last), and a call's credentials (execute
  and lookup) listed in its ``operation.executing`` event and revoked by its
  ``connector.called`` (``credentials_revoked``). Every payload is its code's live
  shape, the ``TypedDict`` of ``audit/payloads.py``
  (``tests/console/test_scale_loader_shapes.py`` checks each story and a tiny load).
- One outbox row per published event, as ``event_append`` writes them
  (``gateway.checked`` is not published), mostly sent, a few pending or dead;
  ``--outbox N`` keeps only about N of them.

Rows go in through ``COPY … FROM STDIN`` in chunks of tasks, one transaction per
chunk, so constraints, composite foreign keys and triggers all apply (nothing is
disabled) and an interrupted load leaves whole tasks only. ``--writers`` threads
(default 2), each on its own connection, COPY chunks while the next is built. Ids
are UUIDv7 built from each row's own timestamp, as ``portal.ids.new_id`` would have
made them then.

``--tasks`` and ``--events`` are totals for the database: a run tops it up to them
(so a second run after an interruption finishes the load) and refuses when the
database already holds that many; ``--append`` adds that many on top instead.
Progress goes to stderr: a live line on a terminal, a line every few seconds
otherwise (``nohup … > load.log``).

In parts: ``rows`` (sizes, tables, row helpers), ``tenants`` (made through the
services), ``stories`` (one task's rows and events), ``loading`` (chunks, writers,
progress).
"""

from __future__ import annotations
