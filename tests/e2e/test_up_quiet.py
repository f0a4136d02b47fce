"""``manage.py up`` is quiet by default: once the banner with the one-time agent key
is printed, an idle portal prints nothing more; a warning still shows; Enter prints
the banner again. (Before: about 180 lines a minute of Celery job logs.)"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from launcher import embedded_db
from tests.e2e.test_demo import (
    AGENT_KEY,
    REPO,
    STOP_TIMEOUT_S,
    Up,
    _clean_env,
    _collect,
    _wait_ready,
    scratch_database_url,
)
from tests.support.net import free_port

__all__ = ["scratch_database_url"]  # the fixture, from the demo's test

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
    env = _clean_env(
        DATABASE_URL=scratch_database_url,
        PORTAL_TICKETDESK_PORT=str(free_port()),
        PORTAL_MCP_PORT=str(free_port()),
        PORTAL_VAR_DIR=str(tmp_path / "var"),
        DJANGO_STATIC_ROOT=str(tmp_path / "static"),
        PYTHONUNBUFFERED="1",
    )
    env.pop("PORTAL_LOG_LEVEL", None)  # the default, as a new user runs it
    process = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=embedded_db.die_with_parent(signal.SIGTERM),
    )
    up = Up(process=process)
    assert process.stdout is not None and process.stdin is not None
    threading.Thread(
        target=_collect, args=(process.stdout, up.lines), daemon=True
    ).start()
    try:
        _wait_ready(up, portal)
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
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdin.close()
