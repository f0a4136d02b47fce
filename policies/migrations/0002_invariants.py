"""A published policy set never changes; row-level security (docs/policies.md).

Like a contract version (docs/architecture.md, invariant 8): a draft may be edited or
dropped; ``draft -> published`` is the one move out of draft; a published version may
only be retired (``retired_at`` set with it); a retired one is frozen. Deleting a
published or retired version is the tenant deletion's alone: it runs as the operator
role (``tenant_deletion``, docs/tenant-deletion.md), so the trigger lets a member of
that role (or the owner) delete, and refuses the app role.

The table gets the scope policy every tenant-owned table has (tasks migration 0017).
"""

from __future__ import annotations

from django.db import migrations

OPERATOR_ROLE = "portal_operator"  # portal.db_roles.OPERATOR_ROLE (tests check it)

FORWARD = f"""
CREATE FUNCTION policies_policyset_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.state = 'draft'
           OR pg_has_role(current_user, '{OPERATOR_ROLE}', 'MEMBER')
           OR pg_has_role(current_user, (SELECT c.relowner FROM pg_class c
                                         WHERE c.oid = TG_RELID), 'MEMBER') THEN
            RETURN OLD;
        END IF;
    ELSIF OLD.state = 'draft' THEN
        IF NEW.state IN ('draft', 'published')
           AND (NEW.tenant_id, NEW.id) = (OLD.tenant_id, OLD.id) THEN
            RETURN NEW;
        END IF;
    ELSIF (NEW.tenant_id, NEW.id, NEW.version, NEW.text, NEW.note, NEW.created_by_id,
           NEW.published_by_id, NEW.created_at, NEW.updated_at, NEW.published_at)
          IS NOT DISTINCT FROM
          (OLD.tenant_id, OLD.id, OLD.version, OLD.text, OLD.note, OLD.created_by_id,
           OLD.published_by_id, OLD.created_at, OLD.updated_at, OLD.published_at)
      AND (NEW.state = OLD.state AND NEW.retired_at IS NOT DISTINCT FROM OLD.retired_at
           OR OLD.state = 'published' AND NEW.state = 'retired'
              AND NEW.retired_at IS NOT NULL) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'policy set v% (%): published versions are immutable (% refused)',
            OLD.version, OLD.state, TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              CONSTRAINT = 'policies_policyset_immutable_trg';
END $$;
CREATE TRIGGER policies_policyset_immutable_trg
    BEFORE UPDATE OR DELETE ON policies_policyset
    FOR EACH ROW EXECUTE FUNCTION policies_policyset_guard();

ALTER TABLE policies_policyset ENABLE ROW LEVEL SECURITY;
ALTER TABLE policies_policyset FORCE ROW LEVEL SECURITY;
CREATE POLICY policies_policyset_tenant_scope ON policies_policyset
    USING (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]))
    WITH CHECK (tenant_id = ANY ((SELECT portal_tenant_scope())::uuid[]));
"""

REVERSE = """
DROP POLICY policies_policyset_tenant_scope ON policies_policyset;
ALTER TABLE policies_policyset NO FORCE ROW LEVEL SECURITY;
ALTER TABLE policies_policyset DISABLE ROW LEVEL SECURITY;
DROP TRIGGER policies_policyset_immutable_trg ON policies_policyset;
DROP FUNCTION policies_policyset_guard();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("policies", "0001_initial"),
        ("tasks", "0017_row_level_security_everywhere"),  # portal_tenant_scope()
    ]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
