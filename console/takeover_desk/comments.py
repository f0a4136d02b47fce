"""Comments on a desk item: notes between the people who work a task.

Written by people with ``work_takeover`` on the task's tenant (support staff, tenant
administrators); read by everyone who reads the desk (``view_trail``: reviewers
too). A comment is a ``console.DeskComment`` row of the task's tenant (row-level
security, a composite key to the task) and one ``task.commented`` event in the same
transaction. The event names the comment by id, with its length and a keyed digest
of its text (``audit.redaction.keyed_hash``), never the text: the trail stays
references and facts (docs/redaction.md), and a comment changed behind the app's
back no longer matches its event. Comments are append-only: nobody edits or
deletes one (the app role holds no UPDATE or DELETE on the table, and a trigger
refuses any UPDATE).

The pages show them in the task's timeline (``console.story.event_rows``), at their
event's place: oldest first, time to the millisecond, the author by name.
"""

from __future__ import annotations

from django.db import transaction

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from audit.redaction import keyed_hash
from portal.actors import Actor
from portal.exceptions import TenantNotVisible, ValidationFailed
from portal.models import TenantPerm
from portal.roles import Person, require_tenant_perm
from tasks.models import Task

from ..models import COMMENT_MAX_CHARS, DeskComment


@transaction.atomic(durable=True)
def desk_comment_add(*, task: Task, user: Person, body: str) -> DeskComment:
    """Write a comment on the task's desk item, with its ``task.commented`` event.

    Guarantee: the comment and its event commit together or not at all. Leading
    and trailing white space is dropped; the text is stored as written otherwise.

    Raises:
        PermissionDenied, TenantNotVisible: no ``work_takeover`` on the tenant.
        ValidationFailed: the text is empty or longer than ``COMMENT_MAX_CHARS``.
    """
    require_tenant_perm(user=user, perm=TenantPerm.WORK_TAKEOVER, tenant=task.tenant)
    author_id = user.pk
    if author_id is None:  # an anonymous user holds no role: refused above
        raise TenantNotVisible()
    text = body.strip()
    if not text:
        raise ValidationFailed("A comment needs some text.", field="body")
    if len(text) > COMMENT_MAX_CHARS:
        raise ValidationFailed(
            f"A comment has at most {COMMENT_MAX_CHARS} characters.", field="body"
        )
    comment = DeskComment.objects.create(
        tenant_id=task.tenant_id, task_id=task.pk, author_id=author_id, body=text
    )
    audit_services.event_append(
        tenant_id=task.tenant_id,
        code=EventCode.TASK_COMMENTED,
        actor=Actor.of_user(user),
        task_id=task.pk,
        data=payloads.TaskCommented(
            {
                "comment_id": str(comment.pk),
                "chars": len(text),
                "body_digest": keyed_hash(task.tenant_id, text),
            }
        ),
    )
    return comment


def desk_comment_texts(*, task: Task) -> dict[str, str]:
    """The task's comments by id (as ``task.commented`` events name them), in one
    query: what the timeline shows on a comment's row."""
    return {
        str(pk): body
        for pk, body in DeskComment.objects.filter(
            tenant_id=task.tenant_id, task_id=task.pk
        ).values_list("id", "body")
    }
