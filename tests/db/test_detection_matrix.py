"""The detection matrix of issue 19 §4: random trials per class, each caught.

Every class runs ``TRIALS`` seeded random trials (``PORTAL_DETECTION_TRIALS``,
100 by default; ``PORTAL_DETECTION_SEED`` moves the seeds, 0 by default), each
built honestly (it verifies) and then attacked once. A trial counts as caught
only with the verifier's exit 1 and the class's kind:

- ``verify_audit`` on the database (tampering as the superuser, triggers off):
  the §1 app-role erasure (each step the app role tries is refused; its effect,
  done with the owner's power, is ``deleted``), a whole task chain deleted
  (``deleted``), a tail cut after a checkpoint (``deleted``), a tree head that does
  not extend the previous one (``forked``);
- ``tools/verify_bundle.py`` (its ``main``, on a file) on bundles exported from
  the database: an edited bundle section (exit 1, the section named), forged
  inclusion proofs of the chain's events and of the export record (``forged
  proof``);
- forged consistency proofs, given to the two verifiers that take them: the
  witness's add-checkpoint (audit/witness.py: 422, nothing cosigned) and
  ``merkle.verify_consistency``.

Adversarial proofs: a wrong sibling (a node of the same tree from elsewhere), the
wrong order, truncated, extended, a proof for another size or index, another
leaf's proof. docs/audit-integrity.md, "Detection, measured", has the rates.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import io
import json
import os
import random
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command
from django.db import transaction

from audit import checkpoints, merkle, tlog, witness
from audit import services as audit_services
from audit.models import EventCode, LogEntry, TreeHead
from portal import scope
from portal.actors import Actor
from portal.models import Tenant
from tasks.evidence import task_evidence_bundle
from tasks.models import Task
from tests.support.db import connect_as
from tests.support.evidence import load_tool

pytestmark = pytest.mark.django_db(transaction=True)

TRIALS = int(os.environ.get("PORTAL_DETECTION_TRIALS", "100"))
SEED = int(os.environ.get("PORTAL_DETECTION_SEED", "0"))
ACTOR = Actor.system("detection-matrix")
tool = load_tool()


def seeds() -> range:
    return range(SEED, SEED + TRIALS)


# --- The trail in the database -----------------------------------------------------


def trail(make_tenant: Callable[..., Tenant], rng: random.Random) -> dict[str, Any]:
    """A tenant with 2-4 task chains of 2-6 events and a tenant chain, signed
    (checkpoints and a tree head), then a few more events and a second head."""
    tenant = make_tenant()
    tasks = [uuid.uuid4() for _ in range(rng.randint(2, 4))]
    lengths = {task: rng.randint(2, 6) for task in tasks}

    def append(task: uuid.UUID | None, n: int) -> None:
        audit_services.event_append(
            tenant_id=tenant.pk,
            task_id=task,
            code=EventCode.TASK_TRANSITIONED if task else EventCode.TENANT_CHANGED,
            actor=ACTOR,
            data={"n": n, "r": rng.random()},
        )

    with transaction.atomic():
        for task in tasks:
            for n in range(lengths[task]):
                append(task, n)
        append(None, 0)
    key = checkpoints.signing_key()
    checkpoints.tenant_checkpoint_scoped(tenant_id=tenant.pk, key=key)
    with transaction.atomic():
        for task in rng.sample(tasks, rng.randint(1, len(tasks))):
            append(task, lengths[task])
            lengths[task] += 1
    checkpoints.tenant_checkpoint_scoped(tenant_id=tenant.pk, key=key)
    return {"tenant": tenant, "tasks": tasks, "lengths": lengths, "key": key}


def verdict(tenant: Tenant) -> tuple[int, str]:
    """verify_audit's exit code and the kind of its BROKEN line ('' if none)."""
    out = io.StringIO()
    try:
        call_command("verify_audit", "--tenant", tenant.slug, stdout=out, stderr=out)
    except SystemExit as stop:
        code = int(stop.code or 0)
    else:
        code = 0
    broken = [line for line in out.getvalue().splitlines() if line.startswith("BROKEN")]
    return code, broken[0].split(": ")[1] if broken else ""


@pytest.fixture
def superuser() -> Iterator[Callable[..., None]]:
    admin = connect_as("admin")

    def run(*statements: tuple[str, Any]) -> None:
        with admin.transaction():
            admin.execute("SET LOCAL session_replication_role = replica")
            for sql, params in statements:
                admin.execute(sql, params)

    yield run
    admin.close()


def rate(outcomes: list[tuple[int, str]], kind: str) -> None:
    caught = sum(1 for code, got in outcomes if (code, got) == (1, kind))
    print(f"\ndetection {kind}: {caught}/{len(outcomes)}")  # the rate, in -s runs
    assert caught == len(outcomes) == TRIALS, outcomes


# The steps of the §1 erasure as the app role tried them (docs/tenant-deletion.md).
APP_STEPS = (
    "UPDATE portal_tenant SET events_on_delete = 'purge' WHERE id = %(t)s",
    "UPDATE portal_tenant SET deleted_at = now() WHERE id = %(t)s",
    "SELECT tasks_purge_tenant_rows('audit_event'::regclass, %(t)s)",
    "SELECT * FROM tenant_deletion_purge(%(t)s)",
    "DELETE FROM audit_event WHERE tenant_id = %(t)s",
    "DELETE FROM audit_checkpoint WHERE tenant_id = %(t)s",
    "DELETE FROM audit_chainhead WHERE tenant_id = %(t)s",
    "DELETE FROM audit_logentry WHERE tenant_id = %(t)s",
    "DELETE FROM audit_treehead WHERE tenant_id = %(t)s",
    "UPDATE audit_event SET payload = NULL WHERE tenant_id = %(t)s",
    "TRUNCATE audit_event",
)


def test_the_app_role_erasure_is_refused_and_its_effect_is_deleted(
    make_tenant, superuser
):
    outcomes = []
    with connect_as("app", autocommit=True) as app:
        for seed in seeds():
            rng = random.Random(seed)
            built = trail(make_tenant, rng)
            tenant = built["tenant"]
            assert verdict(tenant) == (0, "")
            app.execute(
                "SELECT set_config('portal.tenant_ids', %s, false)", [str(tenant.pk)]
            )
            # when the app role tries a step of the erasure: refused
            step = rng.choice(APP_STEPS)
            with pytest.raises(psycopg.Error) as refused, app.transaction():
                app.execute(step, {"t": tenant.pk})
            assert refused.value.sqlstate in ("42501", "42883"), step
            # and the erasure's effect, with more power: events and checkpoints
            # gone (all, or some chains), the tenant live
            doomed = rng.sample(built["tasks"], rng.randint(1, len(built["tasks"])))
            everything = rng.random() < 0.5
            where = "tenant_id = %(t)s" + (
                "" if everything else " AND task_id = ANY(%(tasks)s)"
            )
            params = {"t": tenant.pk, "tasks": doomed}
            superuser(
                (f"DELETE FROM audit_outbox WHERE {where}", params),
                (f"DELETE FROM audit_event WHERE {where}", params),
                (f"DELETE FROM audit_checkpoint WHERE {where}", params),
            )
            outcomes.append(verdict(tenant))
    rate(outcomes, "deleted")


def test_a_whole_task_chain_deleted_is_deleted(make_tenant, superuser):
    outcomes = []
    for seed in seeds():
        rng = random.Random(seed)
        built = trail(make_tenant, rng)
        tenant, task = built["tenant"], rng.choice(built["tasks"])
        assert verdict(tenant) == (0, "")
        params = {"t": tenant.pk, "task": task}
        statements = [
            ("DELETE FROM audit_outbox WHERE tenant_id = %(t)s AND task_id = %(task)s", params),
            ("DELETE FROM audit_event WHERE tenant_id = %(t)s AND task_id = %(task)s", params),
        ]  # fmt: skip
        # the attacker also removes what vouches for the chain, or some of it
        for table in ("audit_checkpoint", "audit_chainhead"):
            if rng.random() < 0.5:
                sql = f"DELETE FROM {table} WHERE tenant_id = %(t)s AND task_id = %(task)s"
                statements.append((sql, params))
        superuser(*statements)
        outcomes.append(verdict(tenant))
    rate(outcomes, "deleted")


def test_a_tail_cut_after_a_checkpoint_is_deleted(make_tenant, superuser):
    outcomes = []
    for seed in seeds():
        rng = random.Random(seed)
        built = trail(make_tenant, rng)
        tenant, task = built["tenant"], rng.choice(built["tasks"])
        assert verdict(tenant) == (0, "")
        length = built["lengths"][task]
        keep = rng.randrange(1, length)  # the chain's first `keep` events stay
        params = {"t": tenant.pk, "task": task, "keep": keep}
        cut = "tenant_id = %(t)s AND task_id = %(task)s AND chain_seq > %(keep)s"
        statements = [
            (f"DELETE FROM audit_outbox WHERE event_id IN (SELECT id FROM audit_event WHERE {cut})", params),
            (f"DELETE FROM audit_event WHERE {cut}", params),
        ]  # fmt: skip
        if rng.random() < 0.5:  # and the head row moved back to the cut
            statements.append(
                (
                    "UPDATE audit_chainhead h SET head_seq = e.chain_seq,"
                    " head_event_id = e.id, head_hash = e.hash FROM audit_event e"
                    " WHERE h.tenant_id = %(t)s AND h.task_id = %(task)s"
                    " AND e.tenant_id = %(t)s AND e.task_id = %(task)s"
                    " AND e.chain_seq = %(keep)s",
                    params,
                )
            )
        superuser(*statements)
        outcomes.append(verdict(tenant))
    rate(outcomes, "deleted")


def test_a_head_that_does_not_extend_the_previous_one_is_forked(make_tenant, superuser):
    outcomes = []
    for seed in seeds():
        rng = random.Random(seed)
        built = trail(make_tenant, rng)
        tenant, key = built["tenant"], built["key"]
        assert verdict(tenant) == (0, "")
        with scope.tenant_scope([tenant.pk]):
            tree = tlog.log_tree(tenant_id=tenant.pk)
            old_size = min(TreeHead.objects.values_list("size", flat=True))
        leaves = list(tree.leaf_hashes)
        # the log rewritten below the older head: a leaf replaced or two swapped
        params: dict[str, Any] = {"t": tenant.pk}
        i = rng.randrange(old_size)
        if rng.random() < 0.5 or len(leaves) < 2:
            new_hash = rng.randbytes(32)
            leaves[i] = merkle.leaf_hash(new_hash)
            rewrite = [(i, new_hash.hex())]
        else:
            j = rng.choice([k for k in range(len(leaves)) if k != i])
            with scope.tenant_scope([tenant.pk]):
                stored = dict(LogEntry.objects.values_list("position", "event_hash"))
            leaves[i], leaves[j] = leaves[j], leaves[i]
            rewrite = [(i, stored[j]), (j, stored[i])]
        forked = merkle.Tree(leaves)
        body = tlog.checkpoint_body(
            origin=tlog.origin_of(tenant.pk), size=len(leaves), root=forked.root()
        )
        note = checkpoints.tree_note_sign(body=body, key=key)  # the real key
        params.update(size=len(leaves), root=forked.root().hex(), note=note)
        superuser(
            *(
                (
                    "UPDATE audit_logentry SET event_hash = %(h)s"
                    " WHERE tenant_id = %(t)s AND position = %(p)s",
                    {"t": tenant.pk, "h": h, "p": p},
                )
                for p, h in rewrite
            ),
            (
                "UPDATE audit_treehead SET root_hash = %(root)s, note = %(note)s"
                " WHERE tenant_id = %(t)s AND size = %(size)s",
                params,
            ),
        )
        outcomes.append(verdict(tenant))
    rate(outcomes, "forked")


# --- Bundles ---------------------------------------------------------------------


@pytest.fixture
def bundle(make_task: Callable[..., Task]) -> dict[str, Any]:
    """A bundle exported from the database: a task with eight events (two of them
    people's decisions) among another task's, signed on demand by the export."""
    task, other = make_task(), make_task()
    for n in range(8):
        for subject in (task, other):
            code = EventCode.TASK_TRANSITIONED
            data: dict[str, Any] = {"n": n}
            if subject is task and n in (3, 6):
                code, data = (
                    EventCode.TASK_RESOLVED,
                    {"resolution": "edit", "note": "é"},
                )
            with transaction.atomic():
                audit_services.event_append(
                    tenant_id=subject.tenant_id, task_id=subject.pk, code=code,
                    actor=ACTOR, data=data,
                )  # fmt: skip
    bundle = task_evidence_bundle(task=task, by=ACTOR)
    return json.loads(json.dumps(bundle))


def run_tool(bundle: dict[str, Any], folder: Path) -> tuple[int, str]:
    """tools/verify_bundle.py's main on a file: (exit code, output)."""
    path = folder / "bundle.json"
    path.write_text(json.dumps(bundle, ensure_ascii=False))
    pem = folder / "key.pem"
    if not pem.exists():
        pem.write_text(checkpoints.public_key_pem(checkpoints.signing_key().public))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = tool.main([str(path), "--public-key", str(pem)])
    return code, out.getvalue()


def _places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a scalar (or an empty container) inside ``value``."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _places(item, (*path, key))
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            yield from _places(item, (*path, i))
    else:
        yield path


def _edit(section: Any, rng: random.Random) -> Any:
    """``section`` with one random place changed (never to the same value)."""
    edited = copy.deepcopy(section)
    places = list(_places(edited))
    path = rng.choice(places)
    if not path:  # a scalar section (format, version, exported_at)
        return f"{edited}x" if isinstance(edited, str) else [edited]
    *parents, last = path
    holder = edited
    for step in parents:
        holder = holder[step]
    old = holder[last]
    how = rng.choice(["change", "drop", "add"])
    if how == "drop" and isinstance(holder, dict):
        del holder[last]
    elif how == "add" and isinstance(holder, dict):
        holder[f"extra{rng.randrange(99)}"] = "added"
    elif isinstance(old, bool) or old is None:
        holder[last] = not old if isinstance(old, bool) else "set"
    elif isinstance(old, int | float):
        holder[last] = old + rng.choice([-1, 1])
    elif isinstance(old, str) and old:
        i = rng.randrange(len(old))
        holder[last] = old[:i] + ("0" if old[i] != "0" else "1") + old[i + 1 :]
    else:
        holder[last] = "filled"
    return edited


# The members of log and export a check reads; the others only describe, and the
# verifier names them as not checked (the test after this one).
CHECKED_MEMBERS = {
    "log": ("checkpoint", "inclusion"),
    "export": ("event", "index", "proof"),
}


def test_an_edited_bundle_section_is_caught_and_named(bundle, tmp_path):
    code, output = run_tool(bundle, tmp_path)
    assert code == 0 and "\nbound: every section (" in output, output
    assert output.splitlines()[-1].startswith("not covered (no signature vouches")
    outcomes = []
    sections = sorted(bundle)
    for seed in seeds():
        rng = random.Random(seed)
        name = sections[seed % len(sections)]  # every section, in turn
        edited = copy.deepcopy(bundle)
        while edited[name] == bundle[name]:
            if name in CHECKED_MEMBERS:
                member = rng.choice(CHECKED_MEMBERS[name])
                edited[name][member] = _edit(bundle[name][member], rng)
            else:
                edited[name] = _edit(bundle[name], rng)
        code, output = run_tool(edited, tmp_path)
        # the section is named; the chain's, checkpoint's and log's own checks
        # name the kind and the event (``altered at #3``, ``forged proof``, …)
        named = f"in section {name}" in output or name in ("chain", "checkpoint", "log")
        outcomes.append((code, "named" if named else output))
    rate(outcomes, "named")


def test_edits_to_descriptive_members_are_named_as_not_checked(bundle, tmp_path):
    edited = copy.deepcopy(bundle)
    edited["log"]["format"] = "something else"
    edited["export"]["binding"] = "something else"
    code, output = run_tool(edited, tmp_path)
    assert code == 0
    assert output.splitlines()[-1] == (
        "not covered (no signature vouches for them, not checked): export.binding, "
        "log.format, log.rfc3161, log.tree"
    )


# tools/verify_bundle.py's first line on a failure: the kind, then where.
FAILED = re.compile(
    r"FAILED (.+?)(?: in section \S+)?(?: at #\d+)?(?: \(event [^)]*\))?: "
)


def _forged_path(
    rng: random.Random, tree: merkle.Tree, index: int, size: int
) -> tuple[str, int, list[bytes]]:
    """An adversarial inclusion proof for leaf ``index`` in the first ``size``
    leaves: (how, index claimed, proof)."""
    proof = tree.inclusion_proof(index, size)
    others = [
        tree.inclusion_proof(k, size)[h]
        for k in range(size)
        for h in range(len(tree.inclusion_proof(k, size)))
    ]
    hows = ["sibling", "truncated", "extended", "another size", "another index"]
    if len(proof) > 1:
        hows.append("order")
    how = rng.choice(hows)
    if how == "sibling" and proof:
        h = rng.randrange(len(proof))
        wrong = [node for node in others if node != proof[h]]
        return how, index, [*proof[:h], rng.choice(wrong), *proof[h + 1 :]]
    if how == "order":
        h = rng.randrange(len(proof) - 1)
        return how, index, [*proof[:h], proof[h + 1], proof[h], *proof[h + 2 :]]
    if how == "truncated" and proof:
        return how, index, proof[:-1] if rng.random() < 0.5 else proof[1:]
    if how == "extended":
        extra = rng.choice(others) if others else rng.randbytes(32)
        return how, index, [*proof, extra] if rng.random() < 0.5 else [extra, *proof]
    if how == "another size" and index + 1 < size:
        smaller = rng.randint(index + 1, size - 1)
        honest = tree.inclusion_proof(index, smaller)
        if honest != proof:
            return how, index, honest
    other = rng.choice([k for k in range(size) if k != index])
    if rng.random() < 0.5:
        return "another index", other, proof
    return "another leaf's proof", index, tree.inclusion_proof(other, size)


def test_forged_inclusion_proofs_are_forged_proof(bundle, tmp_path):
    log = bundle["log"]
    tenant_id = uuid.UUID(bundle["tenant"]["id"])
    size = int(log["checkpoint"].split("\n")[1])
    with scope.tenant_scope([tenant_id]):
        tree = tlog.log_tree(tenant_id=tenant_id, size=size)
    outcomes = []
    hows: dict[str, int] = {}
    for seed in seeds():
        rng = random.Random(seed)
        forged = copy.deepcopy(bundle)
        # a chain event's proof, or the export record's
        if rng.random() < 0.5:
            entry = rng.choice(forged["log"]["inclusion"])
        else:
            entry = forged["export"]
        how, index, proof = _forged_path(rng, tree, entry["index"], size)
        hows[how] = hows.get(how, 0) + 1
        entry["index"] = index
        entry["proof"] = [node.hex() for node in proof]
        code, output = run_tool(forged, tmp_path)
        found = re.match(FAILED, output)
        outcomes.append((code, found.group(1) if found else output))
    print(f"\nforged inclusion proofs by kind: {hows}")
    rate(outcomes, "forged proof")


def _forged_consistency(
    rng: random.Random, tree: merkle.Tree, old: int, new: int
) -> list[bytes]:
    proof = tree.consistency_proof(old, new)
    nodes = {tree.inclusion_proof(k, new)[h] for k in range(new) for h in range(len(tree.inclusion_proof(k, new)))}  # fmt: skip
    hows = ["sibling", "truncated", "extended", "another size"]
    if len(proof) > 1:
        hows.append("order")
    how = rng.choice(hows)
    if how == "sibling" and proof:
        h = rng.randrange(len(proof))
        wrong = sorted(nodes - {proof[h]})
        return [*proof[:h], rng.choice(wrong), *proof[h + 1 :]]
    if how == "order":
        h = rng.randrange(len(proof) - 1)
        return [*proof[:h], proof[h + 1], proof[h], *proof[h + 2 :]]
    if how == "truncated" and proof:
        return proof[:-1] if rng.random() < 0.5 else proof[1:]
    if how == "extended" or not proof:
        extra = rng.choice(sorted(nodes))
        return [*proof, extra] if rng.random() < 0.5 else [extra, *proof]
    for other in rng.sample(range(1, new), new - 1):  # a proof for another size
        honest = tree.consistency_proof(other, new)
        if other != old and honest != proof:
            return honest
    return proof[:-1]


def _add(
    w: witness.Witness,
    key: checkpoints.SigningKey,
    tree: merkle.Tree,
    old_size: int,
    proof: list[bytes],
    size: int,
) -> int:
    """The witness's answer to an add-checkpoint of the tree's head of ``size``."""
    body = tlog.checkpoint_body(
        origin=tlog.origin_of(uuid.UUID(int=19)), size=size, root=tree.root(size)
    )
    note = checkpoints.tree_note_sign(body=body, key=key)
    lines = "".join(f"{base64.b64encode(node).decode()}\n" for node in proof)
    return w.add_checkpoint(f"old {old_size}\n{lines}\n{note}".encode()).status


def test_forged_consistency_proofs_are_refused_by_the_witness_and_merkle(tmp_path):
    key = checkpoints.SigningKey(private=Ed25519PrivateKey.generate(), key_id="k")
    outcomes = []
    for seed in seeds():
        rng = random.Random(seed)
        new = rng.randint(3, 120)
        old = rng.randint(1, new - 1)
        tree = merkle.Tree([merkle.leaf_hash(rng.randbytes(32)) for _ in range(new)])
        forged = _forged_consistency(rng, tree, old, new)
        w = witness.Witness(
            name="witness.test/matrix",
            private=Ed25519PrivateKey.generate(),
            state=witness.WitnessState(tmp_path / f"w{seed}"),
            log_keys=[key.public],
        )
        assert _add(w, key, tree, 0, [], old) == 200  # it cosigned the old head
        refused = _add(w, key, tree, old, forged, new)
        with pytest.raises(merkle.ProofError):
            merkle.verify_consistency(
                old_size=old, new_size=new, old_root=tree.root(old),
                new_root=tree.root(new), proof=forged,
            )  # fmt: skip
        # and the honest proof is accepted after it: the forged one changed nothing
        honest = _add(w, key, tree, old, tree.consistency_proof(old, new), new)
        outcomes.append((1 if refused == 422 and honest == 200 else 0, "refused"))
    rate(outcomes, "refused")
