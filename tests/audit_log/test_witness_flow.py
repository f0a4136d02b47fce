"""Witnesses, RFC 3161 timestamps and the append-only export, end to end (issue 19 §3).

Real parts: a ``manage.py witness`` process on 127.0.0.1 with its own key and state
folder, a TSA answering with ``openssl ts -reply`` under a test CA made by openssl,
PostgreSQL. The checkpoint job signs heads; after its commit they go to the witness,
the TSA and the export file; ``verify_audit`` then requires the witness's
cosignature and checks every token. Tampering plays the superuser with triggers off
(tests/db/test_transparency_log.py's way); each change is caught with its kind.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import random
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings

from audit import checkpoints, export, timestamp, tlog, witness, witness_client
from audit import services as audit_services
from audit.models import EventCode, HeadStamp, TreeHead
from portal import scope
from portal.actors import Actor
from portal.models import Tenant
from tasks.evidence import task_evidence_bundle
from tests.support.db import connect_as
from tests.support.evidence import TOOL
from tests.support.tsa import Tsa, running_tsa
from tests.support.witness import RunningWitness, restart, running_witness

pytestmark = pytest.mark.django_db(transaction=True)

ACTOR = Actor.system("witness-test")


def append(tenant: Tenant, n: int) -> None:
    with transaction.atomic():
        audit_services.event_append(
            tenant_id=tenant.pk,
            task_id=uuid.uuid4(),
            code=EventCode.TASK_TRANSITIONED,
            actor=ACTOR,
            data={"n": n},
        )


def checkpoint() -> None:
    call_command("checkpoint_audit", stdout=io.StringIO())


def verify(tenant: Tenant, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("verify_audit", *args, tenant=tenant.slug, stdout=out, stderr=out)
    except SystemExit as stop:
        return int(stop.code or 0), out.getvalue()
    return 0, out.getvalue()


def kind_of(output: str) -> str:
    line = next(line for line in output.splitlines() if line.startswith("BROKEN"))
    return line.split(": ")[1]


def heads(tenant: Tenant) -> list[TreeHead]:
    with scope.tenant_scope([tenant.pk]):
        return list(TreeHead.objects.filter(tenant=tenant).order_by("size"))


def stamps(tenant: Tenant, kind: str) -> list[HeadStamp]:
    with scope.tenant_scope([tenant.pk]):
        return list(
            HeadStamp.objects.filter(tenant_id=tenant.pk, kind=kind)
            .select_related("tree_head")
            .order_by("tree_head__size")
        )


@pytest.fixture(autouse=True)
def no_witness_marked_down() -> Iterator[None]:
    """A witness one test stopped is not skipped by the next (same name)."""
    witness_client._down_until.clear()
    yield
    witness_client._down_until.clear()


@pytest.fixture
def superuser() -> Iterator[Callable[..., None]]:
    raw = connect_as("admin")

    def run(*statements: tuple[str, list[Any]]) -> None:
        with raw.transaction():
            raw.execute("SET LOCAL session_replication_role = replica")
            for sql, params in statements:
                raw.execute(sql, params)

    yield run
    raw.close()


@pytest.fixture
def witnessed(tmp_path: Path) -> Iterator[tuple[RunningWitness, Tsa, Path]]:
    """A witness process and a TSA, configured; the export in a folder of its own."""
    checkpoints.signing_key()  # the development key's public half, for the witness
    with running_tsa() as tsa, running_witness(tmp_path / "w1") as w1:
        configured = override_settings(
            PORTAL_AUDIT_WITNESSES=[w1.entry],
            PORTAL_AUDIT_TSA_URL=tsa.url,
            PORTAL_AUDIT_TSA_ROOT_FILE=str(tsa.root_file),
            PORTAL_AUDIT_EXPORT_DIR=str(tmp_path / "export"),
        )
        with configured:
            yield w1, tsa, tmp_path / "export"


@pytest.fixture
def three_heads(tenant: Tenant, witnessed) -> Tenant:
    """Three runs of the job: heads of 2, 5 and 9 events (one task chain each),
    each cosigned and time-stamped after its commit."""
    n = 0
    for batch in (2, 3, 4):
        for _ in range(batch):
            append(tenant, n)
            n += 1
        checkpoint()
    return tenant


def test_each_new_head_is_cosigned_time_stamped_and_exported(three_heads, witnessed):
    w1, tsa, export_dir = witnessed
    tenant = three_heads
    sizes = [head.size for head in heads(tenant)]
    assert sizes == [2, 5, 9]
    # then the witness cosigned each, in order (old size = the last it cosigned)
    cosigned = stamps(tenant, HeadStamp.Kind.COSIGNATURE)
    assert [s.tree_head.size for s in cosigned] == sizes
    config = witness_client.witness_parse(w1.entry)
    times = [
        witness.cosignature_open(
            s.stamp,
            body=witness_client.head_body(s.tree_head),
            name=config.name,
            public=config.public,
        )
        for s in cosigned
    ]
    assert times == sorted(times)
    # and its own state, a file outside the database, holds the newest one
    origin = tlog.origin_of(tenant.pk)
    state = (w1.state_dir / f"{witness.origin_hash(origin)}.checkpoint").read_text()
    assert state.startswith(witness_client.head_body(heads(tenant)[-1]))
    assert cosigned[-1].stamp in state
    # and the TSA's token on each imprints that head's body
    tokens = stamps(tenant, HeadStamp.Kind.RFC3161)
    assert [s.tree_head.size for s in tokens] == sizes and tsa.requests == 3
    roots = timestamp.roots_load(tsa.root_file.read_bytes())
    for token in tokens:
        assert (
            timestamp.token_check(
                base64.b64decode(token.stamp),
                body=witness_client.head_body(token.tree_head),
                roots=roots,
            )
            is None
        )
    # and the export has one line per head, with the cosigned note and the token
    lines = (export_dir / f"{tenant.pk}.jsonl").read_text().splitlines()
    exported = [json.loads(line) for line in lines]
    assert [line["size"] for line in exported] == sizes
    assert cosigned[-1].stamp in exported[-1]["note"]
    assert exported[-1]["rfc3161"][0]["token"] == tokens[-1].stamp
    # and a run with nothing new sends nothing again, writes nothing again
    checkpoint()
    assert len(stamps(tenant, HeadStamp.Kind.COSIGNATURE)) == 3
    assert len((export_dir / f"{tenant.pk}.jsonl").read_text().splitlines()) == 3
    # and verify_audit requires and finds all of it
    code, output = verify(tenant)
    assert code == 0, output
    assert "witnessed: 3 heads cosigned by witness.test/w1; 3 RFC 3161" in output


def test_the_witness_keeps_its_state_across_a_restart(three_heads, witnessed):
    w1, _, _ = witnessed
    tenant = three_heads
    again = restart(w1)
    try:
        for n in range(3):
            append(tenant, 100 + n)
        checkpoint()
        assert [s.tree_head.size for s in stamps(tenant, "cosignature")] == [
            2,
            5,
            9,
            12,
        ]
        # It refuses a head that does not extend what it cosigned before the
        # restart: the newest head of 12 again, with old size 9 (409: it has 12).
        head = heads(tenant)[-1]
        config = witness_client.witness_parse(again.entry)
        with httpx.Client() as client:
            answer = witness_client._submit(config, head, 9, client)
        assert (answer.status_code, answer.text) == (409, "12\n")
    finally:
        again.stop()


def test_a_forged_cosignature_is_caught(three_heads, witnessed, superuser):
    tenant = three_heads
    head = heads(tenant)[1]
    stranger = witness.cosign(
        body=witness_client.head_body(head),
        name="witness.test/w1",
        private=Ed25519PrivateKey.generate(),
        timestamp=int(head.signed_at.timestamp()) + 1,
    )
    superuser(
        (
            "UPDATE audit_headstamp SET stamp = %s WHERE tree_head_id = %s AND kind = 'cosignature'",
            [stranger, head.pk],
        )
    )
    code, output = verify(tenant)
    assert (code, kind_of(output)) == (1, "forged cosignature"), output


def test_a_cosignature_moved_from_another_head_is_caught_as_replayed(
    three_heads, witnessed, superuser
):
    tenant = three_heads
    first, second, _ = stamps(tenant, "cosignature")
    superuser(
        (
            "UPDATE audit_headstamp SET stamp = %s WHERE id = %s",
            [first.stamp, second.pk],
        )
    )
    code, output = verify(tenant)
    assert (code, kind_of(output)) == (1, "replayed cosignature"), output


def test_heads_cut_with_the_logs_tail_show_against_the_witness(
    three_heads, witnessed, superuser
):
    """The window the database alone leaves open: the newest run's events, chain
    heads, checkpoints, log tail, tree head and stamps deleted together verify
    against what is left, but not against the witness's own state."""
    tenant = three_heads
    newest = heads(tenant)[-1]
    superuser(
        (
            "CREATE TEMP TABLE gone ON COMMIT DROP AS SELECT event_id FROM audit_logentry WHERE tenant_id = %s AND position >= 5",
            [tenant.pk],
        ),
        ("DELETE FROM audit_headstamp WHERE tree_head_id = %s", [newest.pk]),
        ("DELETE FROM audit_treehead WHERE id = %s", [newest.pk]),
        (
            "DELETE FROM audit_logentry WHERE tenant_id = %s AND position >= 5",
            [tenant.pk],
        ),
        (
            "DELETE FROM audit_checkpoint WHERE head_event_id IN (SELECT event_id FROM gone)",
            [],
        ),
        (
            "DELETE FROM audit_chainhead WHERE head_event_id IN (SELECT event_id FROM gone)",
            [],
        ),
        ("DELETE FROM audit_event WHERE id IN (SELECT event_id FROM gone)", []),
    )
    with override_settings(PORTAL_AUDIT_WITNESSES=[], PORTAL_AUDIT_TSA_ROOT_FILE=""):
        code, output = verify(tenant)
    assert code == 0, output  # the database agrees with itself
    code, output = verify(tenant)
    assert (code, kind_of(output)) == (1, "deleted"), output
    assert "witness witness.test/w1 cosigned a head of 9; the log has 5" in output


def test_a_timestamp_of_another_head_is_caught(three_heads, witnessed, superuser):
    tenant = three_heads
    first, second, _ = stamps(tenant, "rfc3161")
    superuser(
        (
            "UPDATE audit_headstamp SET stamp = %s WHERE id = %s",
            [first.stamp, second.pk],
        )
    )
    code, output = verify(tenant)
    assert (code, kind_of(output)) == (1, "timestamp for another head"), output


def test_a_token_that_does_not_chain_to_the_given_root_is_caught(
    three_heads, witnessed
):
    _, tsa, _ = witnessed
    code, output = verify(three_heads, "--tsa-root", str(tsa.other_root_file))
    assert (code, kind_of(output)) == (1, "forged timestamp"), output


def test_a_head_past_the_grace_without_a_cosignature_is_not_witnessed(
    tenant, witnessed, tmp_path
):
    w1, _, _ = witnessed
    w1.stop()  # the witness is down while the job signs
    append(tenant, 1)
    checkpoint()
    assert stamps(tenant, "cosignature") == []
    config = witness_client.witness_parse(w1.entry)
    later = dt.datetime.now(dt.UTC) + witness_client.WITNESS_GRACE * 2
    with scope.tenant_scope([tenant.pk]):
        broken = witness_client.stamps_verify(
            tenant_id=tenant.pk, heads=heads(tenant), witnesses=[config], now=later
        )
        fresh = witness_client.stamps_verify(
            tenant_id=tenant.pk, heads=heads(tenant), witnesses=[config]
        )
    assert broken is not None and broken.kind == "not witnessed"
    assert fresh is None  # within the grace: the next run may still get it
    code, output = verify(tenant)  # the witness cannot be asked: said, not a break
    assert code == 0, output
    assert "witness witness.test/w1 not asked" in output


def _tool(bundle: dict[str, Any], folder: Path, *args: str) -> tuple[int, str]:
    """tools/verify_bundle.py as an auditor runs it: its own process."""
    path = folder / f"bundle-{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps(bundle))
    pem = folder / "audit-public-key.pem"
    pem.write_text(checkpoints.public_key_pem(checkpoints.signing_key().public))
    done = subprocess.run(
        [sys.executable, "-I", str(TOOL), str(path), "--public-key", str(pem), *args],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def test_a_bundle_carries_the_cosignature_and_token_and_the_tool_requires_them(
    make_task, witnessed, tmp_path
):
    w1, tsa, _ = witnessed
    task = make_task()
    for n in range(4):
        with transaction.atomic():
            audit_services.event_append(
                tenant_id=task.tenant_id,
                task_id=task.pk,
                code=EventCode.TASK_TRANSITIONED,
                actor=ACTOR,
                data={"n": n},
            )
    checkpoint()
    bundle = task_evidence_bundle(task=task, by=ACTOR)
    witness_args = ("--witness-key", w1.vkey, "--tsa-root", str(tsa.root_file))
    code, output = _tool(bundle, tmp_path, *witness_args)
    assert code == 0, output
    assert "witnessed: the tree head is cosigned by witness.test/w1" in output
    assert "timestamped: an RFC 3161 token over the tree head verifies" in output
    # A stock note reader still finds the log's own signature among the lines.
    assert tlog.note_open(
        bundle["log"]["checkpoint"],
        name=tlog.origin_of(task.tenant_id),
        public=checkpoints.signing_key().public,
    )
    note = bundle["log"]["checkpoint"]
    body = note.rpartition("\n\n")[0] + "\n"
    log_line = note.rpartition("\n\n")[2].splitlines()[0]

    def with_note(text: str) -> dict[str, Any]:
        changed = json.loads(json.dumps(bundle))
        changed["log"]["checkpoint"] = text
        return changed

    other_key = witness.cosign(
        body=body,
        name=w1.name,
        private=Ed25519PrivateKey.generate(),
        timestamp=int(dt.datetime.now(dt.UTC).timestamp()),
    )
    cases = {
        "forged cosignature": with_note(f"{body}\n{log_line}\n{other_key}"),
        "not witnessed": with_note(f"{body}\n{log_line}\n"),
    }
    for kind, changed in cases.items():
        code, output = _tool(changed, tmp_path, *witness_args)
        assert code == 1 and output.startswith(f"FAILED {kind}:"), output
    # The token of another head (a second head signed now) is named as such.
    append(task.tenant, 99)
    checkpoint()
    newer = stamps(task.tenant, HeadStamp.Kind.RFC3161)[-1]
    swapped = json.loads(json.dumps(bundle))
    swapped["log"]["rfc3161"] = [{"tsa": tsa.url, "token": newer.stamp}]
    code, output = _tool(swapped, tmp_path, *witness_args)
    assert code == 1 and "FAILED timestamp for another head" in output, output
    code, output = _tool(
        bundle,
        tmp_path,
        "--witness-key",
        w1.vkey,
        "--tsa-root",
        str(tsa.other_root_file),
    )
    assert code == 1 and "FAILED forged timestamp" in output, output


def test_the_stamps_are_append_only_and_scoped_by_tenant(three_heads, other_tenant):
    tenant = three_heads
    stamp = stamps(tenant, "cosignature")[0]
    app = connect_as("app", autocommit=True)
    owner = connect_as("owner", autocommit=True)
    try:
        # The app role may not change or delete a stamp (no grant) ...
        for sql in (
            "UPDATE audit_headstamp SET stamp = 'x' WHERE id = %s",
            "DELETE FROM audit_headstamp WHERE id = %s",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute(sql, [stamp.pk])
        # ... the owner's update is refused by the trigger ...
        owner.execute(
            "SELECT set_config('portal.tenant_ids', %s, false)", [str(tenant.pk)]
        )
        with pytest.raises(psycopg.errors.IntegrityConstraintViolation):
            owner.execute(
                "UPDATE audit_headstamp SET stamp = 'x' WHERE id = %s", [stamp.pk]
            )
        # ... and another tenant's scope sees none of them, nor may write one.
        app.execute(
            "SELECT set_config('portal.tenant_ids', %s, false)", [str(other_tenant.pk)]
        )
        rows = app.execute("SELECT count(*) FROM audit_headstamp").fetchone()
        assert rows == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute(
                "INSERT INTO audit_headstamp (id, tenant_id, tree_head_id, kind, signer,"
                " stamp, stamped_at) VALUES (gen_random_uuid(), %s, %s, 'cosignature',"
                " 'w', 'x', now())",
                [tenant.pk, stamp.tree_head_id],
            )
    finally:
        app.close()
        owner.close()


def test_the_witness_process_answers_bad_requests_without_state_change(witnessed):
    w1, _, _ = witnessed
    with httpx.Client() as client:
        assert client.get(f"{w1.url}/nothing").status_code == 404
        too_big = client.post(f"{w1.url}/add-checkpoint", content=b"x" * 70_000)
        assert too_big.status_code == 400
        garbage = client.post(f"{w1.url}/add-checkpoint", content=b"old x\n\nnote")
        assert garbage.status_code == 400
        assert client.post(f"{w1.url}/other", content=b"").status_code == 404
    assert list(w1.state_dir.iterdir()) == []


def test_a_head_the_portal_did_not_record_as_cosigned_is_recovered_by_the_409(
    tenant, witnessed
):
    """The witness cosigned a head whose answer the portal lost (no stamp stored):
    the next submission's old size is stale, the witness answers 409 with its own
    size, and the portal submits again from there."""
    w1, _, _ = witnessed
    config = witness_client.witness_parse(w1.entry)
    append(tenant, 0)
    checkpoint()  # head of 1, cosigned and stored
    with override_settings(PORTAL_AUDIT_WITNESSES=[]):
        append(tenant, 1)
        checkpoint()  # head of 2, not sent
    lost = heads(tenant)[-1]
    with httpx.Client() as client:
        assert witness_client._submit(config, lost, 1, client).status_code == 200
    append(tenant, 2)
    checkpoint()  # head of 3: sent with old 1, 409 "2", sent again with old 2
    assert [s.tree_head.size for s in stamps(tenant, "cosignature")] == [1, 3]
    code, output = verify(tenant)
    assert code == 0, output


def test_the_export_only_appends(tenant, witnessed):
    _, _, export_dir = witnessed
    path = export_dir / f"{tenant.pk}.jsonl"
    export_dir.mkdir(parents=True, exist_ok=True)
    earlier = '{"note": "a line someone else wrote", "size": 0}\n'
    path.write_text(earlier)
    append(tenant, 0)
    checkpoint()
    append(tenant, 1)
    checkpoint()
    text = path.read_text()
    assert text.startswith(earlier)  # never truncated, never rewritten
    assert [json.loads(line)["size"] for line in text.splitlines()] == [0, 1, 2]
    # A head not larger than the file's last one is not written again.
    with scope.tenant_scope([tenant.pk]):
        assert export.head_export(heads(tenant)[0]) is False
    assert path.read_text() == text


TRIALS = 100


@pytest.fixture
def six_heads(tenant: Tenant, witnessed) -> Tenant:
    """Six runs of the job, each head cosigned and time-stamped."""
    for n in range(6):
        append(tenant, n)
        checkpoint()
    return tenant


def _forged_line(line: str, rng: random.Random) -> str:
    raw = bytearray(base64.b64decode(line.split(" ")[2]))
    how = rng.choice(["another key", "flipped bit", "changed time"])
    if how == "another key":
        raw[12:] = Ed25519PrivateKey.generate().sign(b"anything")
        raw[:4] = witness.cosignature_key_hash(
            line.split(" ")[1], Ed25519PrivateKey.generate().public_key()
        )
    elif how == "flipped bit":
        raw[rng.randrange(4, 76)] ^= 1 << rng.randrange(8)
    else:
        later = int.from_bytes(raw[4:12], "big") + rng.randint(1, 10**6)
        raw[4:12] = later.to_bytes(8, "big")
    return f"{line.split(' ')[0]} {line.split(' ')[1]} {base64.b64encode(bytes(raw)).decode()}\n"


@pytest.mark.parametrize(
    ("kind", "stamp_kind"),
    [
        ("forged cosignature", "cosignature"),
        ("replayed cosignature", "cosignature"),
        ("timestamp for another head", "rfc3161"),
    ],
)
def test_verify_audit_exits_1_with_the_kind_in_100_random_trials(
    six_heads, superuser, kind, stamp_kind
):
    """§4: each trial changes one stored stamp in the database (superuser, triggers
    off), runs verify_audit, and puts the stamp back."""
    tenant = six_heads
    rows = stamps(tenant, stamp_kind)
    assert len(rows) == 6
    caught = 0
    for seed in range(TRIALS):
        rng = random.Random(f"{kind}-{seed}")
        target = rng.randrange(len(rows))
        if kind == "forged cosignature":
            changed = _forged_line(rows[target].stamp, rng)
        else:  # another head's genuine cosignature or token
            changed = rows[
                rng.choice([i for i in range(len(rows)) if i != target])
            ].stamp
        update = "UPDATE audit_headstamp SET stamp = %s WHERE id = %s"
        superuser((update, [changed, rows[target].pk]))
        try:
            code, output = verify(tenant)
        finally:
            superuser((update, [rows[target].stamp, rows[target].pk]))
        assert (code, kind_of(output)) == (1, kind), (seed, output)
        caught += 1
    assert caught == TRIALS
    assert verify(tenant)[0] == 0


def test_a_witness_that_does_not_answer_is_asked_once_per_minute_not_per_tenant(
    tenant, other_tenant, tmp_path
):
    """A witness that accepts the connection and never answers: the first tenant's
    run waits for the timeout, the second tenant's run in the same process skips
    it (the job's time limit is for all tenants together)."""
    vkey = witness.verifier_key(
        "witness.test/mute", Ed25519PrivateKey.generate().public_key()
    )
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)  # accepts into the backlog, never reads or answers
        url = f"http://127.0.0.1:{mute.getsockname()[1]}"
        configured = override_settings(
            PORTAL_AUDIT_WITNESSES=[f"{vkey} {url}"], PORTAL_AUDIT_WITNESS_TIMEOUT_S=1.0
        )
        with configured:
            append(tenant, 0)
            append(other_tenant, 0)
            started = time.monotonic()
            checkpoints.tenant_checkpoint_scoped(tenant_id=tenant.pk)
            first = time.monotonic() - started
            started = time.monotonic()
            checkpoints.tenant_checkpoint_scoped(tenant_id=other_tenant.pk)
            second = time.monotonic() - started
    assert first >= 1.0 and second < 1.0, (first, second)
    assert len(heads(other_tenant)) == 1  # signed all the same
