"""Every lookup by primary key in ``tasks/`` and ``audit/`` names its tenant too.

docs/style.md R3: a query without ``tenant`` is a smell, and a bare-``pk`` lookup is the
easiest one to write by accident (a row loaded in one place, looked up again
somewhere else by its id alone). This test reads the source, not the database: it
finds each queryset call ``.get(``/``.filter(``/``.exclude(`` (and the other
row-selecting calls below) whose keywords include ``pk``/``id``/``pk__in``/``id__in``
and fails unless a ``tenant``/``tenant_id``/``tenant__in`` keyword appears somewhere
in the same call chain (``Task.objects.select_for_update().filter(...).get(...)``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
PACKAGES: Final = ("tasks", "audit", "console")
LOOKUPS: Final = frozenset(
    {"get", "filter", "exclude", "get_or_create", "update_or_create", "in_bulk"}
)
KEYS: Final = frozenset({"pk", "id", "pk__in", "id__in"})
TENANT_KEYS: Final = frozenset({"tenant", "tenant_id", "tenant__in", "tenant_id__in"})

# (path, enclosing function) -> why a key alone is right there. Keep this short.
ALLOWED: Final[dict[tuple[str, str], str]] = {
    ("console/saved_searches.py", "saved_search_delete"): (
        "a person's own saved search, not tenant-owned: the owner is in the filter"
    ),
}
# Chains that are the tenant scope or outside it: the Tenant row itself; accounts
# (people are not tenant-owned; their memberships are); a scoped admin's own
# queryset (TenantScopedAdmin.get_queryset keeps to the person's tenants).
SCOPED_CHAINS: Final = ("Tenant.objects", "User.objects", "self.get_queryset(request)")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    function: str
    source: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} in {self.function}: {self.source}"


def _chain_calls(outermost: ast.expr) -> list[ast.Call]:
    """The calls of a method chain, outermost first: a.b(x).c(y) -> [c(y), b(x)]."""
    calls: list[ast.Call] = []
    node: ast.expr = outermost
    while True:
        if isinstance(node, ast.Call):
            calls.append(node)
            node = node.func
        elif isinstance(node, ast.Attribute):
            node = node.value
        else:
            return calls


class _Visitor(ast.NodeVisitor):
    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.text = text
        self.scope: list[str] = []
        self.findings: list[Finding] = []
        self.seen: set[int] = set()

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_Call(self, node: ast.Call) -> None:
        # Only chain heads (outermost calls) are judged; inner calls were seen there.
        if id(node) not in self.seen:
            calls = _chain_calls(node)
            self.seen.update(id(call) for call in calls)
            keywords = {kw.arg for call in calls for kw in call.keywords if kw.arg}
            for call in calls:
                func = call.func
                if not (isinstance(func, ast.Attribute) and func.attr in LOOKUPS):
                    continue
                source = ast.get_source_segment(self.text, node) or ""
                if source.startswith(SCOPED_CHAINS):
                    break
                if {kw.arg for kw in call.keywords} & KEYS and not (
                    keywords & TENANT_KEYS
                ):
                    self.findings.append(
                        Finding(
                            path=self.path,
                            line=call.lineno,
                            function=".".join(self.scope) or "<module>",
                            source=ast.get_source_segment(self.text, call) or "",
                        )
                    )
                    break
        self.generic_visit(node)


def bare_key_lookups(root: Path = ROOT) -> list[Finding]:
    """Every chain in tasks/ and audit/ that looks a row up by key without a tenant."""
    findings: list[Finding] = []
    for package in PACKAGES:
        for file in sorted((root / package).rglob("*.py")):
            relative = file.relative_to(root).as_posix()
            if "/migrations/" in relative:
                continue
            text = file.read_text()
            visitor = _Visitor(relative, text)
            visitor.visit(ast.parse(text, filename=relative))
            findings.extend(visitor.findings)
    return findings


def test_every_key_lookup_names_its_tenant() -> None:
    """No queryset in tasks/ or audit/ selects rows by key alone."""
    # Given the source of tasks/ and audit/
    # When every lookup by pk/id is collected
    findings = [
        finding
        for finding in bare_key_lookups()
        if (finding.path, finding.function) not in ALLOWED
    ]
    # Then each one also names the tenant (or is an explained exception)
    assert not findings, "lookups by key without a tenant:\n" + "\n".join(
        str(finding) for finding in findings
    )


def test_the_exceptions_are_still_needed() -> None:
    """An exception whose lookup is gone (or scoped now) is removed from the list."""
    used = {(finding.path, finding.function) for finding in bare_key_lookups()}
    assert set(ALLOWED) <= used, sorted(set(ALLOWED) - used)


def test_the_check_catches_a_bare_key(tmp_path: Path) -> None:
    """The parser flags a bare key, and accepts a tenant anywhere in the chain."""
    (tmp_path / "tasks").mkdir()
    (tmp_path / "audit").mkdir()
    (tmp_path / "tasks" / "bad.py").write_text(
        "def f(task, tenant):\n"
        "    Task.objects.get(pk=task.pk)\n"
        "    Task.objects.select_for_update(of=('self',)).get(id=task.pk)\n"
        "    Task.objects.filter(pk__in=[1]).update(state='x')\n"
        "    Task.objects.filter(tenant=tenant, pk=1).first()\n"
        "    Task.objects.filter(tenant_id=tenant.pk).get(pk=1)\n"
        "    Task.objects.filter(pk=1).filter(tenant=tenant).first()\n"
        "    Task.objects.only('id').get(tenant_id=tenant.pk, pk=1)\n"
    )
    found = bare_key_lookups(tmp_path)
    assert [finding.line for finding in found] == [2, 3, 4]
