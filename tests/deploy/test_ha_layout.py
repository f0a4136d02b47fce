"""deploy/ha/ says one thing three times: each node's Patroni file is db1's but for
its name and its own addresses, and the portal's URL names every node (issue 26).

db1's file itself is what tests/ha/ starts its cluster from (tests/support/ha.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from portal import database_url

HA = Path(__file__).resolve().parents[2] / "deploy" / "ha"
NODES = {"db1": "10.0.0.1", "db2": "10.0.0.2", "db3": "10.0.0.3"}


def _load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((HA / f"patroni-{name}.yml").read_text())
    return loaded


def _without_node(config: dict[str, Any]) -> dict[str, Any]:
    """The file with its node's own lines taken out."""
    rest = {
        key: value for key, value in config.items() if key not in ("name", "restapi")
    }
    rest["postgresql"] = {
        key: value
        for key, value in config["postgresql"].items()
        if key not in ("listen", "connect_address")
    }
    return rest


def test_each_node_differs_from_db1_in_its_name_and_addresses_only() -> None:
    first = _load("db1")
    for name, address in NODES.items():
        config = _load(name)
        assert config["name"] == name
        assert config["restapi"] == {
            "listen": f"{address}:8008",
            "connect_address": f"{address}:8008",
        }
        assert config["postgresql"]["listen"] == f"{address}:5432"
        assert config["postgresql"]["connect_address"] == f"{address}:5432"
        assert _without_node(config) == _without_node(first), name


def test_the_cluster_promises_what_the_failover_test_relies_on() -> None:
    dcs = _load("db1")["bootstrap"]["dcs"]
    assert dcs["synchronous_mode"] is True
    assert dcs["primary_start_timeout"] == 0
    assert dcs["postgresql"]["use_pg_rewind"] is True
    assert dcs["postgresql"]["parameters"]["wal_log_hints"] == "on"
    # Every etcd member is named, and every node is one
    hosts = _load("db1")["etcd3"]["hosts"]
    assert hosts == [f"{address}:2379" for address in NODES.values()]


def test_the_documented_url_names_every_node_and_asks_for_the_primary() -> None:
    readme = (HA / "README.md").read_text()
    (line,) = [row for row in readme.splitlines() if row.startswith("DATABASE_URL=")]
    config = database_url.parse(line.removeprefix("DATABASE_URL="))
    assert config["HOST"].split(",") == list(NODES.values())
    assert config["PORT"] == "5432,5432,5432"
    assert config["OPTIONS"]["target_session_attrs"] == "read-write"
