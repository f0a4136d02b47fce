from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("routing", "0002_composite_keys_and_row_level_security")]

    operations = [
        migrations.AddIndex(
            model_name="assignment",
            index=models.Index(
                condition=models.Q(("closed_at__isnull", True)),
                fields=["tenant", "escalate_at"],
                name="routing_assignment_due_idx",
            ),
        ),
    ]
