"""The people's own rows, and proxy models that give the portal its own pages over
domain tables.

A proxy only names a second admin page for rows that ``tasks`` owns
(docs/style.md R13: the takeover desk is a proxy-model admin whose only changes
are buttons calling the takeover services).
"""

from __future__ import annotations

from typing import Final

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from portal.ids import new_id
from tasks.models import Task

# A comment is a note to colleagues, not a document (the event names it by id).
COMMENT_MAX_CHARS: Final = 2000


class TakeoverItem(Task):
    """A task as the takeover desk shows it: one that was handed to a person."""

    class Meta:
        proxy = True
        verbose_name = "takeover desk item"
        verbose_name_plural = "takeover desk"


class SavedSearch(models.Model):
    """A person's named filter of the event browser: the list's query string.

    A person's own, never a tenant's: the query is applied to what the person may
    read when it is opened, so a saved tenant id they lost the role in shows
    nothing. Read, saved and deleted only by its owner (``console/services.py``).
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    name = models.CharField(max_length=80)
    query = models.CharField(max_length=2000)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "name"], name="console_savedsearch_name_uniq"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class DeskComment(models.Model):
    """A person's comment on a desk item (a task), for the colleagues who work it.

    A tenant's row like the task it is on: ``(tenant_id, task_id)`` points at the
    task (a composite key, migration 0003), row-level security keeps it to the
    tenant's scope. Append-only: the app role may insert and read comments, not
    change or delete them (``portal.db_roles.APP_GRANTS``; a trigger refuses any
    UPDATE), so the desk's conversation stays as it was written; only the tenant's
    deletion removes them. Written by ``console.takeover_desk.comments`` with a
    ``task.commented`` event in the same transaction.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    # No index of its own: the task index below leads with tenant_id.
    tenant = models.ForeignKey(
        "portal.Tenant", on_delete=models.PROTECT, db_index=False, related_name="+"
    )
    task = models.ForeignKey(
        "tasks.Task",
        on_delete=models.PROTECT,
        db_constraint=False,  # the composite (tenant_id, task_id) key instead
        db_index=False,
        related_name="+",
    )
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    body = models.CharField(max_length=COMMENT_MAX_CHARS)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "id"], name="console_deskcomment_tenant_id_uniq"
            ),
            # A comment says something: the service strips it, the table insists.
            models.CheckConstraint(
                condition=~Q(body__regex=r"^\s*$"),
                name="console_deskcomment_body_check",
            ),
        ]
        indexes = [
            # A task's comments in order (the item page, the story).
            models.Index(
                fields=["tenant", "task", "created_at"],
                name="console_deskcomment_task_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"comment {self.pk}"


class UsedFormToken(models.Model):
    """A one-time form token that has been spent (``console/once.py``).

    A form that makes something that must not be made twice (a new API key, whose
    secret is shown once) carries a signed token; the POST that acts spends it by
    inserting its digest here, so the same form posted again (a resubmission, a
    double click, the back button) finds it spent and makes nothing. A person's
    own, never a tenant's; rows older than a token's life are deleted as new ones
    are spent.
    """

    digest = models.CharField(primary_key=True, max_length=64)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    used_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        indexes = [
            # The clean-up of spent tokens past their life.
            models.Index(fields=["used_at"], name="console_usedformtoken_used_idx"),
        ]

    def __str__(self) -> str:
        return self.digest[:12]
