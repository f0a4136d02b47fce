"""Kill the primary under load: nothing acknowledged is lost, nothing done twice
(issue 26 §1-2). The run and its checks: ``tests/ha/failover.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import ha

from .conftest import HAJobs, HAPortal
from .failover import run_under_load

pytestmark = pytest.mark.slow


def _kill(cluster: ha.Cluster, leader: str) -> None:
    cluster.kill_postmaster(leader)


# Its setup starts the tier's cluster (etcd, Patroni, migrate, seed, gunicorn), then
# the worker and beat: 221 s of setup and 74 s of test at a load average of 28
# (2026-12-05 04:48), past the suite's 300 s.
@pytest.mark.timeout(600)
def test_killing_the_primary_under_load_loses_no_acknowledged_action(
    ha_portal: HAPortal, ha_jobs: HAJobs, amqp_url: str, tmp_path: Path
) -> None:
    # Given agents under load, when the primary's postmaster is SIGKILLed, then
    # every check of run_under_load holds
    run_under_load(ha_portal, ha_jobs, amqp_url, tmp_path, fault="kill", inject=_kill)
