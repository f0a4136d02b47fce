-- A reviewer-scale data set for bench/story_pages.py: 10 tenants, 100k tasks, 1M
-- events (10 per task; every tenth a person's claim on its own trace). psql -f.
INSERT INTO portal_tenant (id, slug, name, events_on_delete, created_at)
SELECT gen_random_uuid(), 'bench-' || t, 'Bench ' || t, 'keep', now() FROM generate_series(1, 10) t;
CREATE TEMP TABLE tn AS SELECT id, row_number() OVER (ORDER BY slug) AS n FROM portal_tenant;
INSERT INTO tasks_task (id, tenant_id, client_task_id, registration_hash, workflow_key, workflow_version,
  object_type, object_id, object_version, state, state_version, current_step, lease_token, trace_id, span_id, created_at, updated_at)
SELECT gen_random_uuid(), tn.id, 'ct-' || i, repeat('0', 64), 'wf', '1', 'customer_issue', 'ISSUE-' || i, '1',
  'succeeded', 1, '', 0, md5('t' || i), '', now() - (i || ' seconds')::interval, now()
FROM generate_series(1, 100000) i JOIN tn ON tn.n = 1 + i % 10;
INSERT INTO audit_event (id, tenant_id, task_id, operation_id, code, actor_type, actor_id, reason_code, contract_key, contract_version, payload, trace_id, span_id, created_at)
SELECT audit_uuid7_at(t.created_at + (k || ' seconds')::interval), t.tenant_id, t.id, NULL,
  CASE WHEN k = 9 THEN 'task.human_claimed' ELSE 'task.transitioned' END,
  CASE WHEN k = 9 THEN 'user' ELSE 'system' END, CASE WHEN k = 9 THEN '1' ELSE 'bench' END, NULL, 'ci', 1,
  jsonb_build_object('k', k, 'note', repeat('x', 80)),
  CASE WHEN k = 9 THEN md5('h' || t.client_task_id) ELSE t.trace_id END, '',
  t.created_at + (k || ' seconds')::interval
FROM tasks_task t CROSS JOIN generate_series(0, 9) k;
ANALYZE;
