"""Kernel network faults for link tests: a remote on a machine of its own.

``remote_link()`` makes a network namespace (the remote's machine) and a veth pair
to it on a /30 of 10.214.0.0/16 no address here is on: this side's end ``outer``,
the namespace's ``inner``. A server started with ``Link.command`` (inside the
namespace, as ``postgres`` or any user) listens on ``inner``; the portal, on this
side, reaches it over the pair like over a wire. Then:

- ``Link.cut()``: every packet in or out of the namespace is dropped by an nft rule
  inside it (policy drop on its input and output hooks). The portal's kernel sends
  normally and nothing comes back, no FIN, no RST: a partition under open
  connections, which a user-space proxy cannot make (it acknowledges the bytes).
- ``Link.heal()``: the rule removed, the same connections may carry on.

Needs root, ``ip`` and ``nft`` (``missing()``). ``require()`` skips a test outside
CI and fails it under CI (env ``CI=true``), where .ci/run installs both. A run's
namespace is ``portal-nf-<pid>-<token>``, removed when the context ends and, if
that process was killed, by the next run (``reap_stale()``).

``tc netem`` (delay, loss) is unknown to this kernel; loss is an nft rule too
(``Link.lose(percent)``: ``numgen random mod 100 < N drop``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

NETNS_PREFIX = "portal-nf-"
VETH_PREFIX = "pnf"
LINK_SUPERNET = ipaddress.IPv4Network("10.214.0.0/16")
CUT_TABLE = "portal_cut"


def _run(*command: str, check: bool = True, stdin: str | None = None) -> str:
    done = subprocess.run(
        list(command),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if check and done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()}"
        )
    return done.stdout


def missing() -> str | None:
    """Why this machine cannot give a remote a network of its own (None: it can)."""
    if os.geteuid() != 0:
        return "a network namespace needs root (run the suite as root, as CI does)"
    for tool in ("ip", "nft", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: iproute2, nftables, util-linux)"
    probe = f"{NETNS_PREFIX}{os.getpid()}-probe"
    made = subprocess.run(
        ["ip", "netns", "add", probe], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    try:
        _run("ip", "netns", "exec", probe, "nft", "list", "tables")
    except RuntimeError as error:
        return f"nft does not work in a namespace: {error}"
    finally:
        _run("ip", "netns", "delete", probe, check=False)
    return None


def require() -> None:
    """Skip the calling test where namespaces cannot be made; under CI, fail it."""
    reason = missing()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"kernel link faults are required under CI: {reason}")
    pytest.skip(reason)


@dataclass(frozen=True)
class Link:
    """A namespace and the veth pair to it: ``outer`` here, ``inner`` there."""

    netns: str
    outer_if: str
    inner_if: str
    network: ipaddress.IPv4Network

    @property
    def outer(self) -> str:
        return str(self.network[1])

    @property
    def inner(self) -> str:
        return str(self.network[2])

    def command(self, *argv: str, user: str | None = None) -> list[str]:
        """``argv`` run inside the namespace, as ``user`` if named (``ip netns
        exec`` needs root; ``setpriv`` then drops to the user in the same process,
        so the pid a caller holds is the server's own)."""
        prefix = ["ip", "netns", "exec", self.netns]
        if user is not None:
            prefix += [
                "setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups",
            ]  # fmt: skip
        return [*prefix, *argv]

    def _nft(self, script: str) -> None:
        _run("ip", "netns", "exec", self.netns, "nft", "-f", "-", stdin=script)

    def cut(self) -> None:
        """Every packet into or out of the namespace dropped: a silent partition."""
        self._nft(
            f"table inet {CUT_TABLE} {{\n"
            "  chain input { type filter hook input priority 0; policy drop; }\n"
            "  chain output { type filter hook output priority 0; policy drop; }\n"
            "}\n"
        )

    def lose(self, percent: int) -> None:
        """``percent`` of the packets into the namespace dropped at random."""
        self._nft(
            f"table inet {CUT_TABLE} {{\n"
            "  chain input { type filter hook input priority 0; policy accept;\n"
            f"    numgen random mod 100 < {int(percent)} drop\n"
            "  }\n"
            "}\n"
        )

    def down(self) -> None:
        """The namespace's end of the pair down: its machine's network stops. Its
        own sends fail at once (no route there); what this side sends it is
        dropped without an answer, as with a pulled cable (tests/ha's cut)."""
        _run("ip", "-n", self.netns, "link", "set", self.inner_if, "down")

    def up(self) -> None:
        """The namespace's end up again; the kernel puts the /30's route back."""
        _run("ip", "-n", self.netns, "link", "set", self.inner_if, "up")

    def heal(self) -> None:
        """The rules gone: packets flow again on the same connections."""
        _run(
            "ip", "netns", "exec", self.netns,
            "nft", "delete", "table", "inet", CUT_TABLE,
            check=False,
        )  # fmt: skip


def _used_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    used: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for line in _run("ip", "-o", "-4", "addr", "show").splitlines():
        fields = line.split()
        if "inet" in fields:
            address = fields[fields.index("inet") + 1]
            used.append(ipaddress.ip_interface(address).network)
    return used


def _remove(netns: str) -> None:
    """Kill what still runs in ``netns``, then remove it (its veth pair goes with
    it: the namespace's end is destroyed, and a pair never outlives one end)."""
    for pid in _run("ip", "netns", "pids", netns, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _run("ip", "netns", "delete", netns, check=False)


def reap_stale() -> list[str]:
    """Remove the namespaces of runs whose process is gone; returns their names."""
    reaped = []
    for line in _run("ip", "netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(NETNS_PREFIX):
            continue
        owner = name.removeprefix(NETNS_PREFIX).split("-")[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            _remove(name)
            reaped.append(name)
    return reaped


@contextlib.contextmanager
def remote_link() -> Iterator[Link]:
    """A fresh namespace with a veth pair to it, removed (with whatever still runs
    in it) when the block ends."""
    reap_stale()
    token = secrets.token_hex(3)
    used = _used_networks()
    subnets = list(LINK_SUPERNET.subnets(new_prefix=30))
    network = random.choice(subnets)
    while any(network.overlaps(other) for other in used):
        network = random.choice(subnets)
    link = Link(
        netns=f"{NETNS_PREFIX}{os.getpid()}-{token}",
        outer_if=f"{VETH_PREFIX}{token}o",
        inner_if=f"{VETH_PREFIX}{token}i",
        network=network,
    )
    _run("ip", "netns", "add", link.netns)
    try:
        _run("ip", "link", "add", link.outer_if, "type", "veth",
             "peer", "name", link.inner_if, "netns", link.netns)  # fmt: skip
        _run("ip", "addr", "add", f"{link.outer}/30", "dev", link.outer_if)
        _run("ip", "link", "set", link.outer_if, "up")
        _run("ip", "-n", link.netns, "addr", "add", f"{link.inner}/30",
             "dev", link.inner_if)  # fmt: skip
        _run("ip", "-n", link.netns, "link", "set", link.inner_if, "up")
        _run("ip", "-n", link.netns, "link", "set", "lo", "up")
        yield link
    finally:
        _remove(link.netns)
