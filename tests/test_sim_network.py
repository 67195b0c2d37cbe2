"""The fair-share network on its own, against hand-computed schedules: a flow that joins while
another is serialising, delivery after latency, busy time, and both delivery callbacks."""

from __future__ import annotations

import math

import pytest
import simpy

from marssim.sim import FairShareNetwork


def _staggered(use_event_callback: bool):
    """Flows A (1000 B) at t=0 and B (1000 B) at t=0.5 s on one 1000 B/s resource, both with
    0.25 s latency; C (300 B) at t=0.5 s on a second 100 B/s resource, no latency.

    By hand: A alone sends 500 B by 0.5 s; then A and B get 500 B/s each, so A's last 500 B
    take 1 s (serialised 1.5 s, delivered 1.75 s); B has sent 500 B by then and its last 500 B
    take 0.5 s alone (serialised 2.0 s, delivered 2.25 s). C is alone on its resource: 3 s
    (delivered 3.5 s). Resource 0 carried flows from 0 to 2.0 s, resource 1 from 0.5 to 3.5 s."""
    env = simpy.Environment()
    arrived: dict[str, float] = {}
    names = {0: "A", 1: "B", 2: "C"}
    net = FairShareNetwork(env, [1000.0, 100.0], lambda token: arrived.__setitem__(names[token], env.now),
                           routes=[(0,), (1,)])
    if use_event_callback:
        net.on_delivered_event = lambda event: arrived.__setitem__(names[event.value], env.now)
    net.add_flow(0, 1000.0, 0, 0.25)
    active = []

    def later():
        yield env.timeout(0.5)
        net.add_flow(1, 1000.0, 0, 0.25)
        net.start(2, 300, [1], 0.0)  # no latency: delivered synchronously, not through the event
        active.append(net.active)

    env.process(later())
    env.run()
    return arrived, net, active


@pytest.mark.parametrize("use_event_callback", [False, True])
def test_a_flow_joining_midway_shares_the_rest_of_the_link(use_event_callback):
    arrived, net, active = _staggered(use_event_callback)
    assert math.isclose(arrived["A"], 1.75, rel_tol=1e-12)
    assert math.isclose(arrived["B"], 2.25, rel_tol=1e-12)
    assert math.isclose(arrived["C"], 3.5, rel_tol=1e-12)
    assert active == [3]
    assert math.isclose(net.busy[0], 2.0, rel_tol=1e-12)
    assert math.isclose(net.busy[1], 3.0, rel_tol=1e-12)
    assert net.active == 0


def test_event_callback_is_only_a_faster_path():
    token_path, _, _ = _staggered(False)
    event_path, net, _ = _staggered(True)
    assert token_path == event_path  # same times, bit for bit
    assert net.on_delivered_event is not None
    net.on_delivered_event = None
    assert net.on_delivered_event is None


def test_rates_are_memoised_by_the_multiset_of_routes():
    # Two rounds of the same two flows (one per route): the second round's rates come from the memo.
    env = simpy.Environment()
    net = FairShareNetwork(env, [10.0, 10.0, 10.0], lambda token: None, routes=[(0, 2), (1, 2)])

    def rounds():
        for k in range(2):
            net.add_flow(2 * k, 10.0, 0, 0.0)
            net.add_flow(2 * k + 1, 10.0, 1, 0.0)
            yield env.timeout(5.0)

    env.process(rounds())
    env.run()
    # each round: both flows share resource 2 (5 B/s each) and finish together after 2 s; only
    # the starts recompute (the finishes leave no flow to rate)
    assert net.recomputes == 2
    assert net.cache_hits == 1  # the second round repeats the first one's multiset
    assert math.isclose(net.busy[2], 4.0, rel_tol=1e-12)


def _reference_finish_times(capacity, routes, flows):
    """A brute-force fluid simulation: at every start or finish, every active flow's rate is
    the global max-min fair share (``max_min_rates``); returns each flow's finish time."""
    from marssim.sim.network import max_min_rates

    t = 0.0
    left = {}
    finish = {}
    pending = sorted(range(len(flows)), key=lambda i: flows[i][0])
    while pending or left:
        active = sorted(left)
        rates = max_min_rates([routes[flows[i][2]] for i in active], capacity) if active else []
        next_start = flows[pending[0]][0] if pending else math.inf
        ends = [t + left[i] / r for i, r in zip(active, rates) if r > 0]
        next_end = min(ends) if ends else math.inf
        t_next = min(next_start, next_end)
        for i, r in zip(active, rates):
            left[i] -= r * (t_next - t)
        t = t_next
        for i in list(active):
            if left[i] <= 1e-9 * flows[i][1]:
                finish[i] = t
                del left[i]
        while pending and flows[pending[0]][0] <= t:
            i = pending.pop(0)
            left[i] = flows[i][1]
    return finish


@pytest.mark.parametrize("seed", range(6))
def test_component_local_rates_equal_a_global_recomputation(seed):
    """Random flows on random routes over 8 resources, some sharing and some not: every flow
    finishes when a simulation that recomputes every flow's global max-min rate at every event
    says it does."""
    import random

    rng = random.Random(seed)
    capacity = [rng.choice([1.0, 2.0, 5.0, 10.0]) for _ in range(8)]
    routes = [tuple(sorted(rng.sample(range(8), rng.randint(1, 3)))) for _ in range(6)]
    flows = [(rng.choice([0.0, 0.5, 1.0, 1.5, 3.0]), rng.uniform(1.0, 20.0), rng.randrange(len(routes)))
             for _ in range(25)]
    env = simpy.Environment()
    done = {}
    net = FairShareNetwork(env, capacity, lambda token: done.__setitem__(token, env.now), routes=routes)

    def starter(i, at, nbytes, route):
        yield env.timeout(at)
        net.add_flow(i, nbytes, route, 0.0)

    for i, (at, nbytes, route) in enumerate(flows):
        env.process(starter(i, at, nbytes, route))
    env.run()
    want = _reference_finish_times(capacity, routes, flows)
    assert set(done) == set(want)
    for i in want:
        assert done[i] == pytest.approx(want[i], rel=1e-9, abs=1e-12), i


def test_a_token_started_again_is_not_finished_by_its_earlier_flow():
    """A stepped transfer starts its next step under the same token. Flow X (1000 B) shares a
    1000 B/s resource with Y (500 B) from t=0: its first finish estimate is 2 s; Y ends at 1 s,
    X then runs alone and ends at 1.5 s, when it starts again with 10,000 B (Z, 1750 B alone on a
    second resource, keeps X's first estimate in the heap below it). The first estimate (2 s) is
    stale: the new flow ends at 1.5 + 10 = 11.5 s, not at 2 s."""
    env = simpy.Environment()
    arrived: list[tuple[int, float]] = []
    net = FairShareNetwork(env, [1000.0, 1000.0], lambda token: None, routes=[(0,), (1,)])

    def delivered(event):
        arrived.append((event.value, env.now))
        if event.value == 0 and [token for token, _ in arrived] == [1, 0]:
            net.add_flow(0, 10_000.0, 0, 1e-9)

    net.on_delivered_event = delivered
    net.add_flow(0, 1000.0, 0, 1e-9)
    net.add_flow(1, 500.0, 0, 1e-9)
    net.add_flow(2, 1750.0, 1, 1e-9)
    env.run()
    times: dict[int, list[float]] = {}
    for token, t in arrived:
        times.setdefault(token, []).append(t)
    assert times[1] == [pytest.approx(1.0 + 1e-9, rel=1e-12)]
    assert times[2] == [pytest.approx(1.75 + 1e-9, rel=1e-12)]
    assert times[0] == [pytest.approx(1.5 + 1e-9, rel=1e-12), pytest.approx(11.5 + 2e-9, rel=1e-12)]
