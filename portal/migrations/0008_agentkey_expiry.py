"""Agent keys may expire (issue 10 §2): ``expires_at``, after ``created_at`` if set.

Rotation sets it on the old key, so old and new key both work until the cutoff.
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0007_owner_only_clock_and_truncate_guard"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentkey",
            name="expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddConstraint(
            model_name="agentkey",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("expires_at__isnull", True),
                    ("expires_at__gt", models.F("created_at")),
                    _connector="OR",
                ),
                name="portal_agentkey_expiry_check",
            ),
        ),
    ]
