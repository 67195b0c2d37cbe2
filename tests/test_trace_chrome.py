"""Chrome/Perfetto traces of simulated runs: valid per the format (test_trace_format.check_trace)
and faithful to the interval log, for several mappings, topologies and engine options."""

from __future__ import annotations

import gzip
from collections import Counter
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from marssim.lower import lower
from marssim.mapping import Mapping
from marssim.mapping.model import AcceleratorSet
from marssim.sim import simulate
from marssim.system import load_system
from marssim.taskgraph import TaskGraphBuilder
from marssim.trace import build_layout, write_chrome_trace
from marssim.workload import load_workload
from marssim.workload.builder import GraphBuilder
from support import RooflineCost, make_system
from test_trace_format import check_trace, read_text

ROOT = Path(__file__).resolve().parents[1]


def small_cnn(batch: int = 4, model: str = "cnn"):
    b = GraphBuilder(model, batch=batch, model=model)
    x = b.input("image", c=3, h=32, w=32)
    x = b.eltwise("relu1", b.conv("conv1", x, out_channels=16, kernel=3), fn="relu")
    y = b.conv("conv2", x, out_channels=16, kernel=3)
    x = b.eltwise("add", y, x, fn="add")
    x = b.conv("conv3", x, out_channels=32, kernel=3, stride=2)
    x = b.flatten("flat", b.global_pool("gap", x))
    b.linear("fc", x, 10)
    return b.build()


# ---------------------------------------------------------------------- cases
def case_single_set_dp():
    g = small_cnn()
    system = make_system(4, topology="ring")
    return simulate(lower(g, system, Mapping.single_set(g, system, sharding="dp"), RooflineCost()), system)


def case_pipeline_output_channels():
    g = small_cnn(batch=4)
    system = make_system(4, topology="switch", bandwidth="20 GB/s", backplane="30 GB/s")
    sets = [AcceleratorSet(("acc0", "acc1"), "os16"), AcceleratorSet(("acc2", "acc3"), "os16")]
    mapping = Mapping.pipeline(g, system, sets, [3], sharding=("oc", "dp"), micro_batches=2)
    return simulate(lower(g, system, mapping, RooflineCost()), system)


def case_spatial_halo_two_streams():
    g = small_cnn(batch=2)
    system = make_system(3, topology="chain")
    mapping = Mapping.single_set(g, system, sharding=("spatial", "dp"), micro_batches=2)
    return simulate(lower(g, system, mapping, RooflineCost()), system, streams=2)


def case_spill_to_host():
    system = make_system(2, topology="chain", capacity="1 MiB", bandwidth="10 GB/s")
    b = TaskGraphBuilder(system)
    first = b.compute("acc0", 1e-5, out_bytes=700 * 1024, op="producer")
    second = b.compute("acc0", 1e-5, preds=(first,), out_bytes=700 * 1024, op="consumer")
    b.transfer("acc0", "acc1", 1000.0, preds=(second,))
    return simulate(b.build(), system, memory_policy="spill")


CASES = {"single-set-dp": case_single_set_dp, "pipeline-oc": case_pipeline_output_channels,
         "spatial-2-streams": case_spatial_halo_two_streams, "spill": case_spill_to_host}


# ---------------------------------------------------------------------- the checks
def _process_key(name: str) -> str:
    """The node or resource a process shows: 'acc0 (os16)' -> acc0, 'link a->b' -> a->b."""
    first, _, rest = name.partition(" ")
    return rest if first in ("link", "switch") else first


def check_faithful(result, path: Path):
    """The trace at ``path`` is valid and shows exactly ``result``'s log, edges and timelines."""
    checked = check_trace(path)
    iv = result.intervals
    key_of = {pid: _process_key(name) for pid, name in checked.process_names.items()}

    # every interval once, at its own times (nanosecond grid), on its device or its sender
    primary = [s for s in checked.slices if s.cat != "link"]
    assert sorted(s.args["interval"] for s in primary) == list(range(len(iv)))
    half_ns = Decimal("0.5000001")  # nearest nanosecond (the product x * 1e9 is rounded once more)
    for s in primary:
        row = iv.iloc[s.args["interval"]]
        assert abs(s.ts * 1000 - Decimal(row["start"]) * 10**9) <= half_ns
        assert abs((s.ts + s.dur) * 1000 - Decimal(row["end"]) * 10**9) <= half_ns
        assert s.cat == row["kind"] and s.args["task"] == row["task"]
        owner = row["resource"] if row["kind"] == "compute" else row["src"]
        assert key_of[s.pid] == owner
        if row["kind"] != "compute":
            assert s.args["bytes"] == row["bytes"]

    # one link slice per link or backplane each transfer crosses, at the transfer's times
    hops = Counter((s.args["interval"], key_of[s.pid]) for s in checked.slices if s.cat == "link")
    kinds = result.links["kind"].to_dict()
    expected = Counter()
    for i, row in iv[iv["kind"] != "compute"].iterrows():
        for res in row["links"].split(";"):
            if res and kinds.get(res) in ("link", "switch"):
                expected[(i, res)] += 1
    assert hops == expected

    # one flow arrow per dependency edge, from the producer's slice to the consumer's
    arrows = Counter((a.args["task"], b.args["task"]) for a, b in checked.flows)
    assert all(a.cat != "link" and b.cat != "link" for a, b in checked.flows)
    assert arrows == Counter(zip(result.edges["src_task"].tolist(), result.edges["dst_task"].tolist()))

    # counters: memory never above its capacity, bandwidth never above the link's capacity
    mem_cap = result.memories["capacity_bytes"].to_dict()
    link_cap = result.links["capacity"].to_dict()
    final = result.memory_timeline.groupby("node")["bytes"].last().to_dict()
    seen_memory = set()
    for (pid, name, key), series in checked.counters.items():
        node = key_of[pid]
        values = [v for _, v in series]
        times = [t for t, _ in series]
        assert times == sorted(times)
        if name == "memory":
            assert key == "MiB"
            assert max(values) <= Decimal(repr(mem_cap[node] / 2**20))
            assert values[-1] == Decimal(repr(final[node] / 2**20))
            seen_memory.add(node)
        elif name == "bandwidth":
            if key == "GB/s":
                assert max(values) <= Decimal(repr(link_cap[node] / 1e9))
                assert min(values) >= 0
            else:
                assert key == "flows" and min(values) >= 0
        else:
            assert name == "memory port" and key == "GB/s"
            port = f"{node}:mem" if f"{node}:mem" in link_cap else f"{node}:dram"
            assert max(values) <= Decimal(repr(link_cap[port] / 1e9))
    assert seen_memory == set(result.memory_timeline["node"])
    return checked


@pytest.mark.parametrize("name", sorted(CASES))
def test_trace_is_valid_and_shows_the_whole_log(name, tmp_path):
    result = CASES[name]()
    path = tmp_path / "t.json"
    size = write_chrome_trace(result, path)
    assert size == path.stat().st_size > 0
    check_faithful(result, path)


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_result_same_bytes_plain_and_gzip(name, tmp_path):
    result = CASES[name]()
    write_chrome_trace(result, tmp_path / "a.json")
    write_chrome_trace(result, tmp_path / "b.json")
    write_chrome_trace(result, tmp_path / "a.json.gz")
    write_chrome_trace(result, tmp_path / "b.json.gz")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert (tmp_path / "a.json.gz").read_bytes() == (tmp_path / "b.json.gz").read_bytes()
    assert gzip.decompress((tmp_path / "a.json.gz").read_bytes()) == (tmp_path / "a.json").read_bytes()


def test_concurrent_flows_on_one_link_take_one_lane_each(tmp_path):
    # k equal flows acc0 -> acc1 share the 25 GB/s link: k lanes on the link and on acc0's DMA,
    # the link counter at its capacity while they run, then back to zero.
    k = 3
    system = make_system(2, topology="chain", bandwidth="25 GB/s", latency="0 s", memory_bandwidth="1 PB/s")
    b = TaskGraphBuilder(system)
    produce = b.compute("acc0", 1e-6, op="produce")
    sends = [b.transfer("acc0", "acc1", 2e6, preds=(produce,), op="send") for _ in range(k)]
    b.compute("acc1", 1e-6, preds=tuple(sends), op="consume")
    result = simulate(b.build(), system, setup=False)
    path = tmp_path / "k.json"
    write_chrome_trace(result, path)
    checked = check_faithful(result, path)
    link_pid = next(p for p, n in checked.process_names.items() if n == "link acc0->acc1")
    acc0 = next(p for p, n in checked.process_names.items() if n.startswith("acc0"))
    assert sorted(n for (p, _), n in checked.thread_names.items() if p == link_pid) == ["flow 1", "flow 2", "flow 3"]
    assert sorted(n for (p, _), n in checked.thread_names.items() if p == acc0) == ["DMA out", "DMA out 2", "DMA out 3",
                                                                                   "compute"]
    series = checked.counters[(link_pid, "bandwidth", "GB/s")]
    flows = checked.counters[(link_pid, "bandwidth", "flows")]
    # closed form: the flows start after 1 us and all end at 1 us + 3 * 2 MB / 25 GB/s = 241 us
    assert series == [(0, 0), (1, 25), (241, 0)]
    assert flows == [(0, 0), (1, 3), (241, 0)]
    # flows: produce -> each send -> consume
    assert Counter((a.name, b.name) for a, b in checked.flows) == {("produce", "send transfer"): 3,
                                                                   ("send transfer", "consume"): 3}


def test_two_streams_put_overlapping_compute_on_two_lanes(tmp_path):
    system = make_system(1, topology="chain")
    b = TaskGraphBuilder(system)
    for i in range(4):
        b.compute("acc0", 1e-3, op=f"t{i}")
    result = simulate(b.build(), system, streams=2, setup=False)
    layout = build_layout(result)
    names = [t.name for t in layout.threads if t.pid == layout.node_pid["acc0"]]
    assert names == ["compute", "compute 2"]
    path = tmp_path / "s.json"
    write_chrome_trace(result, path)
    check_faithful(result, path)


def test_processes_in_a_stable_order_accelerators_hosts_links(tmp_path):
    result = case_pipeline_output_channels()
    layout = build_layout(result)
    rank = {"accelerator": 0, "host": 1, "link": 2, "switch": 2}
    ranks = [rank[p.kind] for p in layout.processes]
    assert ranks == sorted(ranks)
    assert [p.key for p in layout.processes[:4]] == ["acc0", "acc1", "acc2", "acc3"]
    links = [p.key for p in layout.processes if p.kind in ("link", "switch")]
    table = [r for r in result.links.index if r in set(links)]
    assert links == table  # the system's own order of resources
    assert [p.pid for p in layout.processes] == list(range(1, len(layout.processes) + 1))
    tids = [t.tid for t in layout.threads]
    assert len(set(tids)) == len(tids) and not set(tids) & {p.pid for p in layout.processes}


def test_resnet50_on_16_accelerators_pipelined_and_sharded(tmp_path):
    g = load_workload("resnet50:batch=4")
    system = load_system(str(ROOT / "topologies" / "mars-adaptive-16.yaml"))
    designs = ["os32", "ws32", "nvdla64", "shi32"]
    sets = [AcceleratorSet(tuple(f"acc{4 * k + i}" for i in range(4)), d) for k, d in enumerate(designs)]
    n_layers = len(g.layers)
    mapping = Mapping.pipeline(g, system, sets, [n_layers // 4, n_layers // 2, 3 * n_layers // 4],
                               sharding=("oc", "dp"), micro_batches=2)
    result = simulate(lower(g, system, mapping, RooflineCost()), system)
    path = tmp_path / "resnet50.json.gz"
    write_chrome_trace(result, path)
    checked = check_faithful(result, path)
    assert {_process_key(n) for n in checked.process_names.values()} >= {f"acc{i}" for i in range(16)}
    assert len(checked.flows) == len(result.edges) > 1000
    assert read_text(path).startswith('{"traceEvents":[')


def test_optional_parts_can_be_left_out(tmp_path):
    result = CASES["pipeline-oc"]()
    path = tmp_path / "slim.json"
    write_chrome_trace(result, path, flows=False, link_slices=False, counters=False)
    checked = check_trace(path)
    assert {e["ph"] for e in checked.events} == {"M", "X"}
    assert sorted(s.args["interval"] for s in checked.slices) == list(range(len(result.intervals)))


def test_counter_rounding_noise_is_clamped_but_real_excess_stays_visible():
    from marssim.trace.chrome import _clamp_noise

    cap = 25e9
    values = np.array([0.0, cap, cap * (1 + 1e-12), cap * 1.01])
    assert _clamp_noise(values, cap).tolist() == [0.0, cap, cap, cap * 1.01]
