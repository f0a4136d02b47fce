"""The relay's lease in a column of its own, in no index, and room for HOT updates.

The relay's claim leased a row by pushing ``available_at`` out, and ``available_at``
is a key of ``audit_outbox_due_idx``: every claim wrote a new entry into each of the
outbox's indexes (a non-HOT update), then the ``sent`` mark did the same again. Now
the claim sets ``leased_until``, which no index names, so PostgreSQL can keep the
new row version on its page and skip the indexes (a HOT update), when the page has
room for it. ``fillfactor = 45`` leaves that room: inserts fill a page to 45 %, and
the claim's versions of the page's rows (8 bytes longer: the lease) take the rest,
with a margin for that growth. ``available_at`` keeps its meaning (due from; a
back-off moves it).

``ALTER TABLE ... SET (fillfactor)`` takes a brief lock, rewrites nothing, and only
changes how new pages are filled. Adding a nullable column without a default is a
catalogue change. docs/outbox.md, "Row updates"; figures in docs/performance-log.md.
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("audit", "0028_invitation_event_codes")]

    operations = [
        migrations.AddField(
            model_name="outbox",
            name="leased_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunSQL(
            "ALTER TABLE audit_outbox SET (fillfactor = 45);",
            "ALTER TABLE audit_outbox RESET (fillfactor);",
        ),
    ]
