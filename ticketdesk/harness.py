"""Start a ticket desk as a child process and drive its control API.

For tests and launchers::

    with start_ticketdesk() as desk:
        desk.trust(public_jwk, tenant=tenant_id)  # the connector's public key
        desk.set_fault("execute_then_drop")
        ...  # call desk.url as the gateway would
        assert desk.effects()["tickets_created"] == 1

The child listens on a free port (it binds port 0 and reports the real one), and
stops when ``stop()`` is called or, whatever happens, when this process dies: it
watches the pipe on its standard input. Given ``tls`` (a certificate and its key), it
serves https, and the control calls trust ``ca_file``.
"""

from __future__ import annotations

import json
import os
import queue
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final
from urllib.request import Request, urlopen

START_TIMEOUT: Final = 15.0
STOP_TIMEOUT: Final = 5.0
CONTROL_TIMEOUT: Final = 10.0
_LISTENING: Final = re.compile(r"ticketdesk listening on (?P<url>https?://\S+)")
# The folder holding the ticketdesk package: the child imports it from there,
# whatever the caller's working directory.
_IMPORT_ROOT: Final = Path(__file__).resolve().parent.parent


class TicketDeskError(RuntimeError):
    """The ticket desk did not start, or a control call failed."""


class TicketDesk:
    """A running ticket desk child process; a context manager that stops it."""

    def __init__(
        self,
        *,
        process: subprocess.Popen[bytes],
        url: str,
        keys_path: Path,
        owns_keys: bool,
        log_path: Path,
        owns_log: bool,
        stdout_pump: threading.Thread,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.process = process
        self.url = url
        self.keys_path = keys_path
        self._owns_keys = owns_keys
        self._keys_lock = threading.Lock()
        self.log_path = log_path
        self._owns_log = owns_log
        self._stdout_pump = stdout_pump
        self._ssl_context = ssl_context

    def __enter__(self) -> TicketDesk:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _control(self, method: str, path: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        # The URL is always the child's own loopback http(s) address.
        request = Request(  # noqa: S310
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urlopen(  # noqa: S310
                request, timeout=CONTROL_TIMEOUT, context=self._ssl_context
            ) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            detail = error.read().decode("utf-8", "replace")
            raise TicketDeskError(f"{method} {path}: {error.code} {detail}") from None

    def trust(self, jwk: dict[str, Any], *, tenant: str | None = None) -> None:
        """Install a public key (a JWK with a ``kid``) in the desk's JWKS file,
        bound to ``tenant``'s tokens when given; the desk reads it on its next
        request. A key of the same ``kid`` is replaced.

        Raises:
            ValueError: the JWK holds a private part (``d``).
        """
        write_jwks(self.keys_path, jwk, tenant=tenant, lock=self._keys_lock)

    def effects(self) -> dict[str, Any]:
        """The desk's own ledger: ``tickets_created``, ``by_idempotency_key``, ..."""
        result: dict[str, Any] = self._control("GET", "/_control/effects")
        return result

    def tickets(self) -> list[dict[str, Any]]:
        """Every ticket the desk holds, of every tenant, oldest first."""
        result: list[dict[str, Any]] = self._control("GET", "/_control/tickets")[
            "tickets"
        ]
        return result

    def set_fault(
        self,
        mode: str,
        *,
        times: int = 1,
        delay_s: float | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        """Arm a fault for the next ``times`` requests of its kind (0: until cleared).

        Faults queue: one armed behind another on the same kind of request acts
        once the first is used up.
        """
        spec: dict[str, Any] = {"mode": mode, "times": times}
        if delay_s is not None:
            spec["delay_s"] = delay_s
        if retry_after_s is not None:
            spec["retry_after_s"] = retry_after_s
        self._control("POST", "/_control/faults", spec)

    def clear_faults(self) -> None:
        self._control("DELETE", "/_control/faults")

    def reset(self) -> None:
        """Forget tickets, counts and faults; ticket ids start again at 1."""
        self._control("POST", "/_control/reset")

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; return the exit status.

        Safe to call again.
        """
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdin is not None:
            self.process.stdin.close()
        # The pump closes stdout itself at EOF; closing it here could race its read.
        self._stdout_pump.join(STOP_TIMEOUT)
        if self._owns_log:
            self.log_path.unlink(missing_ok=True)
        if self._owns_keys:
            self.keys_path.unlink(missing_ok=True)
        return self.process.returncode


def write_jwks(
    path: Path,
    jwk: dict[str, Any],
    *,
    tenant: str | None = None,
    lock: threading.Lock | None = None,
) -> None:
    """Add ``jwk`` (public, with a ``kid``) to the JWKS file at ``path``, replacing
    a key of the same ``kid``; written to a temporary file and renamed over, so the
    desk never reads half a file.

    Raises:
        ValueError: the JWK holds a private part (``d``) or has no ``kid``.
    """
    if "d" in jwk:
        raise ValueError("the desk takes public keys only")
    if not jwk.get("kid"):
        raise ValueError("the key needs a kid")
    entry = {**jwk, **({"tenant": str(tenant)} if tenant is not None else {})}
    with lock or threading.Lock():
        try:
            keys = json.loads(path.read_text(encoding="utf-8"))["keys"]
        except FileNotFoundError:
            keys = []
        keys = [key for key in keys if key.get("kid") != jwk["kid"]] + [entry]
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=".jwks-", dir=path.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump({"keys": keys}, out, indent=1)
        os.replace(name, path)


def _pump_lines(stream: IO[bytes], lines: queue.Queue[str | None]) -> None:
    # Drains stdout for the child's whole life, so a full pipe can never block it.
    with stream:
        for raw in stream:
            lines.put(raw.decode("utf-8", "replace").rstrip("\n"))
    lines.put(None)


def _wait_for_url(lines: queue.Queue[str | None], timeout: float) -> str | None:
    """The URL from the child's "listening" line; None if it exits or stays silent."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        if line is None:
            return None
        if match := _LISTENING.fullmatch(line):
            return match["url"]


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def start_ticketdesk(
    port: int | None = None,
    *,
    keys_path: Path | None = None,
    host: str = "127.0.0.1",
    timeout: float = START_TIMEOUT,
    log_path: Path | None = None,
    audience: str | None = None,
    tls: tuple[Path, Path] | None = None,
    ca_file: Path | None = None,
    netns: str | None = None,
) -> TicketDesk:
    """Start ``python -m ticketdesk`` and return it once it accepts connections.

    Args:
        port: the port to listen on; None picks a free one.
        keys_path: the JWKS file of trusted public keys (``trust`` adds to it);
            by default an empty temporary file, removed by ``stop()``.
        host: a loopback address; inside a network namespace of its own, that
            namespace's address (tests/support/netns.py).
        timeout: seconds to wait for the "listening" line.
        log_path: where the child's stderr (request log) goes; by default a
            temporary file, removed by ``stop()``.
        audience: the desk's target name (a credential's ``aud``); by default
            ``ticket-desk``.
        tls: ``(certificate, key)`` PEM files: the desk serves https with them
            (``--tls-cert``, ``--tls-key``) and its URL is ``https://``.
        ca_file: the PEM file of the CA the control calls trust for an https desk;
            by default the system's trust store.
        netns: a network namespace to start the desk in (``ip netns exec``; root
            only): ``host`` is then that namespace's address.

    Raises:
        TicketDeskError: the child exited or stayed silent past ``timeout``; the
            message carries the end of its log.
    """
    owns_log = log_path is None
    if log_path is None:
        handle, name = tempfile.mkstemp(prefix="ticketdesk-", suffix=".log")
        os.close(handle)
        log_path = Path(name)
    owns_keys = keys_path is None
    if keys_path is None:
        handle, name = tempfile.mkstemp(prefix="ticketdesk-keys-", suffix=".json")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump({"keys": []}, out)
        keys_path = Path(name)
    env = dict(os.environ, TICKETDESK_KEYS=str(keys_path))
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (str(_IMPORT_ROOT), env.get("PYTHONPATH")) if part
    )
    command = [
        sys.executable, "-m", "ticketdesk", "--host", host,
        "--port", str(port or 0), "--exit-on-stdin-eof",
    ]  # fmt: skip
    if audience is not None:
        command += ["--audience", audience]
    if netns is not None:
        command = ["ip", "netns", "exec", netns, *command, "--netns", netns]
    ssl_context = None
    if tls is not None:
        command += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
        ssl_context = ssl.create_default_context(cafile=ca_file)
    with log_path.open("ab") as log:
        process = subprocess.Popen(  # noqa: S603 (this interpreter, fixed arguments)
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
        )
    assert process.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    pump = threading.Thread(
        target=_pump_lines, args=(process.stdout, lines), daemon=True
    )
    pump.start()
    url = _wait_for_url(lines, timeout)
    desk = TicketDesk(
        process=process,
        url=url or "",
        keys_path=keys_path,
        owns_keys=owns_keys,
        log_path=log_path,
        owns_log=owns_log,
        stdout_pump=pump,
        ssl_context=ssl_context,
    )
    if url is None:
        tail = _log_tail(log_path)
        status = desk.stop()
        raise TicketDeskError(
            f"the ticket desk did not start within {timeout:g} s "
            f"(exit status {status}):\n{tail}"
        )
    return desk
