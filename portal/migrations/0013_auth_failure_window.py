from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0012_job_run"),
    ]

    operations = [
        migrations.CreateModel(
            name="AuthFailureWindow",
            fields=[
                (
                    "bucket",
                    models.CharField(max_length=100, primary_key=True, serialize=False),
                ),
                ("window_start", models.DateTimeField()),
                ("failures", models.PositiveIntegerField()),
            ],
        ),
        # A throttle's counters: a crash may empty them (the window restarts).
        migrations.RunSQL(
            "ALTER TABLE portal_authfailurewindow SET UNLOGGED;",
            reverse_sql="ALTER TABLE portal_authfailurewindow SET LOGGED;",
        ),
    ]
