"""``LeaseKeeper``: keep a task's lease alive while the work runs; notice losing it.

The pattern::

    task = client.claim_next(owner="worker-1", ttl_s=30)
    with LeaseKeeper(client, task.id, task.lease.token, ttl_s=30) as keeper:
        for step in plan:
            keeper.check()  # raises LeaseLost: stop at once, write nothing more
            do(step)
        keeper.check()
        client.transition(task.id, to="succeeded", lease_token=keeper.token,
                          expected_state_version=task.state_version)

The keeper renews in a background thread every ``renew_every_s``. The lease counts as
lost when a renewal is refused (``LEASE_EXPIRED``: lapsed, released or taken over;
``NOT_FOUND``), or when no renewal has been confirmed for ``ttl_s`` (the portal is
unreachable, so the lease must be presumed lapsed). ``check()`` also compares the
clock itself, so a renewal hanging in the network cannot hide an expiry.

The keeper is an early warning, not the guarantee: the portal fences every write with
the token, so a write under a lost lease is refused with ``LEASE_EXPIRED`` anyway.
Calling ``check()`` between steps stops work (and side effects outside the portal)
that would be wasted or, worse, duplicated by the next holder.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .client import PortalClient
from .errors import LeaseExpired, LeaseLost, NotFound, PortalError

__all__ = ["LeaseKeeper", "LeaseLost"]

logger = logging.getLogger("portal_client.lease")


class LeaseKeeper:
    """Renews one task's lease in a background thread; a context manager.

    Args:
        client: the client to renew with (it is thread-safe).
        task_id: the leased task.
        token: the lease's fencing token (``task.lease.token``).
        ttl_s: the lease length each renewal asks for (whole seconds, 1..3600).
        renew_every_s: time between renewals; default a third of ``ttl_s``, so two
            renewals may fail before the lease runs out.
        on_lost: called once, from the thread that noticed, right after ``lost`` is
            set (e.g. to cancel work that cannot poll ``check()``).

    Attributes:
        lost: set once the lease is lost; never cleared.
        lost_reason: why, once ``lost`` is set.
        renewals: renewals confirmed so far.
    """

    def __init__(
        self,
        client: PortalClient,
        task_id: str,
        token: int,
        ttl_s: int,
        renew_every_s: float | None = None,
        *,
        on_lost: Callable[[LeaseLost], None] | None = None,
    ) -> None:
        if ttl_s < 1:
            raise ValueError("ttl_s must be a whole number of seconds >= 1")
        renew_every_s = ttl_s / 3 if renew_every_s is None else renew_every_s
        if not 0 < renew_every_s < ttl_s:
            raise ValueError("renew_every_s must be in (0, ttl_s)")
        self.client = client
        self.task_id = task_id
        self.token = token
        self.ttl_s = ttl_s
        self.renew_every_s = renew_every_s
        self.on_lost = on_lost
        self.lost = threading.Event()
        self.lost_reason: str | None = None
        self.renewals = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._deadline = 0.0  # monotonic time until which the lease is known live
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LeaseKeeper:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> LeaseKeeper:
        """Renew once in the caller's thread, then keep renewing in the background.

        The first renewal fixes a deadline this process can trust (the portal's
        ``expires_at`` is on another clock) and fails fast on a lease already gone.

        Raises:
            LeaseLost: the first renewal was refused.
            PortalError: the first renewal failed otherwise; nothing was started.
        """
        try:
            self._renew()
        except (LeaseExpired, NotFound) as exc:
            raise self._lose(f"renewal refused: {exc.code}") from exc
        self._thread = threading.Thread(
            target=self._run, name=f"lease-keeper-{self.task_id}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop renewing (the lease then runs out after ``ttl_s``; release it or
        transition the task to hand it back sooner).

        Waits up to ``timeout_s`` for a renewal in progress: one stuck in the network
        must not hold up the caller, and its late answer is harmless.
        """
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def check(self) -> None:
        """Raise LeaseLost if the lease is lost or may have lapsed; else return."""
        if not self.lost.is_set() and time.monotonic() >= self._deadline:
            self._lose(f"no renewal confirmed within {self.ttl_s}s")
        if self.lost.is_set():
            raise LeaseLost(self.task_id, self.token, self.lost_reason or "lost")

    def remaining_s(self) -> float:
        """Seconds the lease is known to stay live (0 once lost)."""
        if self.lost.is_set():
            return 0.0
        return max(0.0, self._deadline - time.monotonic())

    def _renew(self) -> None:
        # Taken before the request: the portal extends from its own "now", which is
        # later, so this deadline never overstates the lease.
        sent_at = time.monotonic()
        self.client.renew_lease(self.task_id, lease_token=self.token, ttl_s=self.ttl_s)
        with self._lock:
            self._deadline = max(self._deadline, sent_at + self.ttl_s)
            self.renewals += 1

    def _run(self) -> None:
        while not self._stop.wait(self.renew_every_s):
            if self.lost.is_set():
                return
            if time.monotonic() >= self._deadline:
                self._lose(f"no renewal confirmed within {self.ttl_s}s")
                return
            try:
                self._renew()
            except (LeaseExpired, NotFound) as exc:
                self._lose(f"renewal refused: {exc.code}")
                return
            except PortalError as exc:
                # Unreachable, rate limited, a 5xx: try again at the next tick; the
                # deadline decides when the lease must be presumed gone.
                logger.warning("lease renewal of task %s failed: %s", self.task_id, exc)
            except Exception as exc:  # a bug must not leave a silent, dead keeper  # noqa: BLE001
                self._lose(f"renewal crashed: {exc!r}")
                return

    def _lose(self, reason: str) -> LeaseLost:
        with self._lock:
            first = not self.lost.is_set()
            if first:
                self.lost_reason = reason
                self.lost.set()
        error = LeaseLost(self.task_id, self.token, self.lost_reason or reason)
        if first:
            logger.warning("%s", error)
            if self.on_lost is not None:
                self.on_lost(error)
        return error
