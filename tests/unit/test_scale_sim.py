"""bench/scale_sim.py: the same seed gives the same run; an overloaded pool shows it."""

from __future__ import annotations

import pytest

from bench import scale_sim
from bench.scale_sim import Layout, Simulation

NODE = Layout(name="node", single_node_cores=2)
PLAN = Layout(name="plan", web=2, workers=1, relays=3, shards=2, shard_cores=1)


def test_a_seed_gives_the_same_run_and_another_seed_another():
    first = Simulation(PLAN, 40.0, seed=7).run(seconds=4, warmup=1)
    again = Simulation(PLAN, 40.0, seed=7).run(seconds=4, warmup=1)
    other = Simulation(PLAN, 40.0, seed=8).run(seconds=4, warmup=1)
    assert first == again
    assert first != other


def test_the_costs_are_the_cited_figures():
    costs = scale_sim.derived_costs()
    assert costs["web_reserve"] == pytest.approx((8204 - 1518) * 1e-6)
    assert costs["relay_own"] == pytest.approx(1 / 370)
    # Today's node carries one task per its CPU demand on 2 cores.
    (demand,) = scale_sim.demand_per_task(NODE).values()
    assert scale_sim.capacity(NODE)["node"] == pytest.approx(2 / demand)


@pytest.mark.parametrize(("load", "grows"), [(0.5, False), (2.0, True)])
def test_queue_age_grows_only_past_capacity(load, grows):
    rate = scale_sim.capacity(NODE)["node"] * load
    report = Simulation(NODE, rate, seed=3).run(seconds=12, warmup=2)
    (node,) = report.stations
    assert node.growing is grows
    if grows:
        assert node.utilisation > 0.99
        assert node.queued_at_end > 100
        assert node.oldest_age_last_s > node.oldest_age_first_s + 1
        assert report.tasks_done_per_s < rate / 2
    else:
        assert 0.35 < node.utilisation < 0.65
        assert node.queued_at_end < 50
        assert report.tasks_done_per_s == pytest.approx(rate, rel=0.15)


def test_the_first_to_saturate_is_the_one_whose_queue_grows():
    capacities = scale_sim.capacity(PLAN)
    first = min(capacities, key=lambda name: capacities[name])
    rate = capacities[first] * 1.3  # past the first, short of the second
    assert sorted(capacities.values())[1] > rate
    report = Simulation(PLAN, rate, seed=5).run(seconds=12, warmup=2)
    growing = {s.name for s in report.stations if s.growing}
    assert growing == {first}
