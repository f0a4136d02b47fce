"""The ticket desk process: loopback only, ready when it says so, stops cleanly."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ticketdesk.harness import TicketDeskError, start_ticketdesk

from .conftest import create, public_jwk

REPO = Path(__file__).resolve().parents[2]


def test_sigterm_stops_the_desk_with_status_0() -> None:
    desk = start_ticketdesk()
    desk.trust(public_jwk())
    assert create(desk, "op-1").status == 201

    status = desk.stop()

    assert status == 0
    assert desk.stop() == 0  # a second stop is harmless


def test_sigint_stops_the_desk_with_status_0() -> None:
    with start_ticketdesk() as desk:
        desk.process.send_signal(signal.SIGINT)

        assert desk.process.wait(5) == 0


def test_desk_exits_when_its_launcher_goes_away() -> None:
    with start_ticketdesk() as desk:
        assert desk.process.stdin is not None
        # What a dying launcher does to the pipe, whatever kills it.
        desk.process.stdin.close()

        assert desk.process.wait(5) == 0


def test_given_port_is_used(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    keys = tmp_path / "keys.json"
    with start_ticketdesk(port=port, keys_path=keys) as desk:
        assert desk.keys_path == keys
        assert desk.url == f"http://127.0.0.1:{port}"
        assert desk.effects()["tickets_created"] == 0


def test_a_taken_port_is_reported_with_the_log() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        with pytest.raises(TicketDeskError, match="cannot listen"):
            start_ticketdesk(port=port, timeout=5)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1", "example.com", "::"])
def test_non_loopback_host_is_refused(host: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ticketdesk", "--host", host, "--port", "0",
         "--keys", "keys.json"],
        cwd=REPO, capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip

    assert result.returncode == 2
    assert "loopback" in result.stderr
    assert result.stdout == ""


def test_a_namespace_it_does_not_run_in_is_refused() -> None:
    """``--netns`` lets the desk bind beyond loopback only inside that namespace:
    named from the machine's own network, it is refused before binding."""
    result = subprocess.run(
        [sys.executable, "-m", "ticketdesk", "--host", "192.0.2.1", "--port", "0",
         "--keys", "keys.json", "--netns", "portal-nf-not-this-one"],
        cwd=REPO, capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip

    assert result.returncode == 2
    assert "not the namespace this runs in" in result.stderr


def test_missing_key_file_is_refused() -> None:
    env = {"PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "ticketdesk", "--port", "0"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip

    assert result.returncode == 2
    assert "--keys" in result.stderr


def test_ipv6_loopback_is_served() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        desk = start_ticketdesk(host="::1", timeout=5)
    except TicketDeskError as error:
        pytest.skip(f"::1 is not usable here: {error}")
    with desk:
        desk.trust(public_jwk())
        assert desk.url.startswith("http://[::1]:")
        assert create(desk, "op-1").status == 201
