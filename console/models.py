"""The people's own rows, and proxy models that give the portal its own pages over
domain tables.

A proxy only names a second admin page for rows that ``tasks`` owns
(docs/style.md R13: the takeover desk is a proxy-model admin whose only changes
are buttons calling the takeover services).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

from portal.ids import new_id
from tasks.models import Task


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
