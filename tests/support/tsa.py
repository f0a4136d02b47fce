"""A real RFC 3161 time-stamping authority on 127.0.0.1 for the tests.

``openssl ts -reply`` answers each ``application/timestamp-query`` POSTed to a small
HTTP server; the TSA's certificate (extended key usage ``timeStamping``) is issued
by a test root CA that openssl makes at test time, in a temporary folder. The
root's PEM is what verifiers are given (``PORTAL_AUDIT_TSA_ROOT_FILE``,
``verify_audit --tsa-root``). A second, unrelated root (``other_root``) is there
to show that a token is refused against the wrong root.
"""

from __future__ import annotations

import http.server
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

OPENSSL = shutil.which("openssl") or "openssl"

_CONFIG = """
[ tsa ]
default_tsa = tsa_config
[ tsa_config ]
dir = {dir}
serial = $dir/serial
crypto_device = builtin
signer_cert = $dir/tsa.crt
signer_key = $dir/tsa.key
signer_digest = sha256
default_policy = 1.3.6.1.4.1.99999.1
digests = sha256, sha384, sha512
accuracy = secs:1
ordering = no
tsa_name = yes
ess_cert_id_chain = no
ess_cert_id_alg = sha256
"""

_TSA_EXT = """
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = critical, timeStamping
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True)


def _root(directory: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
        "-subj", f"/CN={name} test root", "-addext",
        "basicConstraints=critical,CA:TRUE", "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


def make_authority(directory: Path) -> None:
    """The root, the TSA's key and certificate, and openssl's TSA config."""
    _root(directory, "root")
    _root(directory, "other")
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "tsa.key", "-out", "tsa.csr", "-subj", "/CN=portal test TSA",
        cwd=directory,
    )  # fmt: skip
    (directory / "tsa.ext").write_text(_TSA_EXT)
    _openssl(
        "x509", "-req", "-in", "tsa.csr", "-CA", "root.crt", "-CAkey", "root.key",
        "-CAcreateserial", "-out", "tsa.crt", "-days", "2", "-extfile", "tsa.ext",
        cwd=directory,
    )  # fmt: skip
    (directory / "serial").write_text("01\n")
    (directory / "tsa.cnf").write_text(_CONFIG.format(dir=directory))


@dataclass
class Tsa:
    url: str
    directory: Path
    requests: int = 0
    # Seconds each answer waits before it is sent: a remote TSA's latency.
    delay_s: float = 0.0

    @property
    def root_file(self) -> Path:
        return self.directory / "root.crt"

    @property
    def other_root_file(self) -> Path:
        return self.directory / "other.crt"

    def reply(self, query: bytes) -> bytes:
        """``openssl ts -reply`` for one query (DER in, DER out)."""
        with tempfile.TemporaryDirectory(dir=self.directory) as scratch:
            q, r = Path(scratch) / "q.tsq", Path(scratch) / "r.tsr"
            q.write_bytes(query)
            subprocess.run(
                [OPENSSL, "ts", "-reply", "-config", str(self.directory / "tsa.cnf"),
                 "-queryfile", str(q), "-out", str(r)],
                check=True, capture_output=True,
            )  # fmt: skip
            return r.read_bytes()


@contextmanager
def running_tsa() -> Iterator[Tsa]:
    """A TSA on a free port of 127.0.0.1 until the block ends."""
    lock = threading.Lock()  # openssl's serial file: one reply at a time
    with tempfile.TemporaryDirectory(prefix="portal-tsa-") as folder:
        directory = Path(folder)
        make_authority(directory)
        tsa = Tsa(url="", directory=directory)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                query = self.rfile.read(length)
                if self.headers.get("Content-Type") != "application/timestamp-query":
                    self.send_response(415)
                    self.end_headers()
                    return
                time.sleep(tsa.delay_s)
                with lock:
                    tsa.requests += 1
                    answer = tsa.reply(query)
                self.send_response(200)
                self.send_header("Content-Type", "application/timestamp-reply")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        tsa.url = f"http://127.0.0.1:{server.server_address[1]}/"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield tsa
        finally:
            server.shutdown()
            server.server_close()
