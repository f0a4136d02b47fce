"""Connector signing keys the app role can never read (issue 19 §1).

The clear HS256 ``signing_key`` column goes. Each connector gets an Ed25519 key pair
instead: ``public_key`` and its thumbprint ``key_id`` in clear (the target installs
the public key), the private key only in ``sealed_private_key``, AES-256-GCM under a
key derived from the server secret outside the database and bound to the tenant and
the connector (tasks/sealed.py). Two CHECKs give each column its one shape, so a
clear key cannot be written where the sealed one belongs.

An existing connector's shared secret is not kept, not even sealed: every connector
gets a fresh pair here, and a target that verified the old HS256 key refuses the
gateway's credentials until it is given the new public key (the connector's admin
page shows it; docs/gateway.md). Keeping the old secret would have kept a second,
symmetric mode in which the target can forge the portal's credentials.

The data step imports the sealing and key helpers (tasks.credentials,
tasks.sealed) rather than copying AES-GCM and the key derivation in: a copy of key
handling that could drift from the code that opens it would be worse than the
coupling. It runs as the owner under FORCE ROW LEVEL SECURITY (0017), so it puts
every tenant in its scope first.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

PUBLIC = r"^[A-Za-z0-9_-]{43}$"
SEALED = r"^v1:[A-Za-z0-9+/]{80}$"


def _new_pairs(apps: Any, schema_editor: Any) -> None:
    from tasks.credentials import key_id, key_pair_new
    from tasks.sealed import connector_key_seal

    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('portal.tenant_ids', "
            "coalesce(string_agg(id::text, ','), ''), true) FROM portal_tenant"
        )
        cursor.execute("SELECT id, tenant_id FROM tasks_connector ORDER BY id")
        for connector_id, tenant_id in cursor.fetchall():
            private_key, public_key = key_pair_new()
            cursor.execute(
                "UPDATE tasks_connector SET public_key = %s, key_id = %s, "
                "sealed_private_key = %s WHERE id = %s",
                [
                    public_key,
                    key_id(public_key),
                    connector_key_seal(
                        tenant_id=tenant_id,
                        connector_id=connector_id,
                        private_key=private_key,
                    ),
                    connector_id,
                ],
            )


class Migration(migrations.Migration):
    dependencies = [("tasks", "0017_row_level_security_everywhere")]

    operations = [
        migrations.AddField(
            model_name="connector",
            name="key_id",
            field=models.CharField(editable=False, max_length=43, null=True),
        ),
        migrations.AddField(
            model_name="connector",
            name="public_key",
            field=models.CharField(editable=False, max_length=43, null=True),
        ),
        migrations.AddField(
            model_name="connector",
            name="sealed_private_key",
            field=models.TextField(editable=False, null=True),
        ),
        migrations.RunPython(_new_pairs, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="connector",
            name="key_id",
            field=models.CharField(editable=False, max_length=43),
        ),
        migrations.AlterField(
            model_name="connector",
            name="public_key",
            field=models.CharField(editable=False, max_length=43),
        ),
        migrations.AlterField(
            model_name="connector",
            name="sealed_private_key",
            field=models.TextField(editable=False),
        ),
        # Backwards the old secret is gone: signing_key comes back empty, which
        # signs nothing a target accepts, until a person sets one.
        migrations.RemoveField(model_name="connector", name="signing_key"),
        migrations.AddConstraint(
            model_name="connector",
            constraint=models.CheckConstraint(
                condition=models.Q(("public_key__regex", PUBLIC))
                & models.Q(("key_id__regex", PUBLIC)),
                name="tasks_connector_public_key_check",
            ),
        ),
        migrations.AddConstraint(
            model_name="connector",
            constraint=models.CheckConstraint(
                condition=models.Q(("sealed_private_key__regex", SEALED)),
                name="tasks_connector_sealed_private_key_check",
            ),
        ),
    ]
