"""``manage.py up`` is quiet by default: once the banner with the one-time agent key
is printed, an idle portal prints nothing more; a warning still shows; Enter prints
the banner again. (Before: about 180 lines a minute of Celery job logs.)"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import httpx

from tests.support.net import free_port
from tests.support.up import (
    AGENT_KEY,
    STOP_TIMEOUT_S,
    Up,
    running_up,
    scratch_database_url,
    wait_ready,
)

__all__ = ["scratch_database_url"]  # the fixture, from tests/support/up.py

IDLE_S = 20.0  # four runs of the 5 s beat jobs, each two lines at INFO
BANNER_END = "Press Enter to show this again"


def _wait_for(up: Up, pattern: re.Pattern[str], count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(pattern.findall(up.output())) < count:
        assert time.monotonic() < deadline, up.output()[-3000:]
        time.sleep(0.2)


def test_an_idle_up_prints_nothing_after_its_banner(
    scratch_database_url: str, tmp_path: Path
) -> None:
    port = free_port()
    portal = f"http://127.0.0.1:{port}"
    with running_up(
        scratch_database_url,
        tmp_path,
        port=port,
        stdin=subprocess.PIPE,
        unset=["PORTAL_LOG_LEVEL"],  # the default, as a new user runs it
        PORTAL_TICKETDESK_PORT=str(free_port()),
        PORTAL_MCP_PORT=str(free_port()),
    ) as up:
        process = up.process
        assert process.stdin is not None
        wait_ready(up, portal)
        _wait_for(up, re.compile(BANNER_END), 1, 10)

        # When: it idles (the beat's jobs run every 5 s)
        time.sleep(IDLE_S)

        # Then: the banner is still the last thing on the screen
        last = max(i for i, line in enumerate(up.lines) if BANNER_END in line)
        assert up.lines[last + 1 :] == [], up.lines[last + 1 :]

        # When: a request goes wrong (a 404 is a warning of django.request)
        assert httpx.get(f"{portal}/no-such-page", trust_env=False).status_code == 404

        # Then: the warning shows
        _wait_for(up, re.compile(r"Not Found: /no-such-page"), 1, 10)

        # When: Enter is pressed, the banner comes again, the key in it
        process.stdin.write(b"\n")
        process.stdin.flush()
        _wait_for(up, AGENT_KEY, 2, 10)
        _wait_for(up, re.compile(BANNER_END), 2, 10)

        process.send_signal(signal.SIGINT)
        assert process.wait(STOP_TIMEOUT_S) == 0, up.output()[-3000:]
