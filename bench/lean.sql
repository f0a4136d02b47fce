-- The lean baseline of bench/peers.py: what a hand-written job table with an audit
-- trail needs and nothing more (primary keys, one queue index, no triggers, no
-- foreign keys). Each state change is one statement, a data-modifying CTE.
DROP SCHEMA IF EXISTS lean CASCADE;
CREATE SCHEMA lean;
CREATE TABLE lean.task (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL,
    state text NOT NULL,
    state_version integer NOT NULL,
    lease_owner text,
    lease_token bigint NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX lean_task_queue ON lean.task (tenant_id, created_at, id)
    WHERE state = 'pending';
CREATE TABLE lean.agent_grant (
    tenant_id uuid NOT NULL,
    agent_id uuid NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    PRIMARY KEY (tenant_id, agent_id, action, target)
);
CREATE TABLE lean.operation (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL,
    task_id uuid NOT NULL,
    idempotency_key text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    input_hash text NOT NULL,
    input jsonb NOT NULL,
    state text NOT NULL,
    created_at timestamptz NOT NULL,
    UNIQUE (tenant_id, idempotency_key)
);
CREATE TABLE lean.event (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL,
    task_id uuid NOT NULL,
    code text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL
);
CREATE TABLE lean.outbox (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL,
    event_id uuid NOT NULL,
    task_id uuid NOT NULL,
    envelope jsonb NOT NULL,
    state text NOT NULL DEFAULT 'pending',
    created_at timestamptz NOT NULL
);
