"""A TCP fault proxy between the portal and one remote (issue 25, R15).

The kernel's own network faults (``tc netem`` in a namespace) need the ``sch_netem``
module, which the machines this suite runs on do not have ("Specified qdisc kind is
unknown"), so the faults are made here, in user space, on real sockets: every byte
between a client and its upstream crosses this process, which can hold it back,
drop it or cut the connection, and change its mind while connections are open.

- ``latency_s``: each chunk waits that long before it is passed on (both ways).
- ``drip_s``: answers (upstream → client) are passed on one byte at a time, each
  after that pause: a slow-drip remote.
- ``drop_replies``: requests reach the upstream, answers (and their end) are
  swallowed: the remote acts and the client waits on an open connection (a
  partition after the request crossed).
- ``partition(True)``: nothing crosses, either way, on open connections (what is
  in flight is held, and crosses once healed, as TCP would retransmit it), and a
  new connection is not accepted: the listening socket's backlog is kept full, so
  the client's SYNs are dropped and its ``connect`` waits, as for an unreachable
  host. The sender's kernel sees its bytes acknowledged (by this proxy), so only
  the application's own timeouts end a wait, never TCP's.
- ``reset()``: every open connection is closed with an RST (``SO_LINGER`` 0).

``with FaultProxy(("127.0.0.1", port)) as proxy:`` starts it on a free port of
127.0.0.1 (``proxy.port``); leaving the block closes everything.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from types import TracebackType

_CHUNK = 65536


class FaultProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.latency_s = 0.0
        self.drip_s = 0.0
        self.drop_replies = False
        self._partitioned = threading.Event()
        self._paused = threading.Event()  # the accept loop takes no connection
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._fillers: list[socket.socket] = []
        self.accepted = 0
        self.bytes_up = 0
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)

    # --- control --------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def partitioned(self) -> bool:
        return self._partitioned.is_set()

    def partition(self, on: bool) -> None:
        """Cut (``True``) or heal (``False``) the link, open connections included."""
        if on and not self._partitioned.is_set():
            self._partitioned.set()
            # Once the accept loop has stopped taking connections, fill the accept
            # queue so the kernel drops new SYNs: listen(0) keeps one pending
            # connection, and the filler is it.
            self._paused.wait(timeout=5)
            self._listener.listen(0)
            filler = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            self._fillers.append(filler)
        elif not on and self._partitioned.is_set():
            for filler in self._fillers:  # take the filler off the queue: closed
                with contextlib.suppress(OSError):
                    self._listener.accept()[0].close()
                filler.close()
            self._fillers.clear()
            self._listener.listen(64)
            self._paused.clear()
            self._partitioned.clear()

    def reset(self) -> int:
        """Close every open connection with an RST; returns how many sockets."""
        with self._lock:
            sockets = list(self._sockets)
            self._sockets.clear()
        for sock in sockets:
            _abort(sock)
        return len(sockets)

    def close(self) -> None:
        self._stopped.set()
        self.partition(False)
        self.reset()
        self._listener.close()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    # --- the pumps ------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            if self._partitioned.is_set():
                self._paused.set()
                time.sleep(0.02)
                continue
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._partitioned.is_set():
                client.close()  # it raced the partition: as if never connected
                continue
            self.accepted += 1
            threading.Thread(target=self._open, args=(client,), daemon=True).start()

    def _open(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            _abort(client)
            return
        upstream.settimeout(None)
        client.settimeout(None)
        with self._lock:
            self._sockets.update((client, upstream))
        pair = _Pair(client, upstream)
        threading.Thread(
            target=self._pump, args=(client, upstream, False, pair), daemon=True
        ).start()
        self._pump(upstream, client, True, pair)

    def _pump(
        self, source: socket.socket, sink: socket.socket, reply: bool, pair: _Pair
    ) -> None:
        try:
            while True:
                data = source.recv(_CHUNK)
                if not data:
                    break
                # A partition holds what is in flight; it crosses once healed,
                # as TCP retransmits it (or never, if an end gives up first).
                while self._partitioned.is_set() and not self._stopped.is_set():
                    time.sleep(0.02)
                if reply and self.drop_replies:
                    continue  # the answer is lost on the way
                if not reply:
                    self.bytes_up += len(data)
                if self.latency_s:
                    time.sleep(self.latency_s)
                if reply and self.drip_s:
                    for index in range(len(data)):
                        time.sleep(self.drip_s)
                        sink.sendall(data[index : index + 1])
                else:
                    sink.sendall(data)
            with self._lock:
                live = sink in self._sockets
            # A lost answer's end is lost too: the client waits on an open socket.
            if live and not (reply and self.drop_replies):
                sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            if pair.done():
                for sock in (pair.client, pair.upstream):
                    with self._lock:
                        self._sockets.discard(sock)
                    sock.close()


class _Pair:
    """The two sockets of one proxied connection; the second pump to end closes
    both."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self._lock = threading.Lock()
        self._ended = 0

    def done(self) -> bool:
        with self._lock:
            self._ended += 1
            return self._ended == 2


def _abort(sock: socket.socket) -> None:
    """Close with an RST instead of a FIN (waking a pump blocked on it first)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    sock.close()
