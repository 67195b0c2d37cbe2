"""Collectives as NCCL runs them: NCCL's tuning model against closed forms read from its source,
the measured tables and their converters, the plans the lowerings will call for, their flows, and
the median-error target on the shipped measurements."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from marssim.collectives import nccl
from marssim.collectives.flows import plan_taskgraph
from marssim.collectives.measured import (
    CollectiveRow, configurations, geometric_sizes, interpolate, load_collective_tables, load_collectives,
    vidur_network_rows, write_collectives, xla_textproto_rows,
)
from marssim.collectives.nccl import NcclFabric, bandwidths, channel_graphs, choose, latencies
from marssim.collectives.plan import plan_collective, system_info
from marssim.collectives.validate import heldout_check
from marssim.errors import InputError
from marssim.system import load_system

DATA = Path(__file__).parent / "data"
A100 = dict(compute_capability=8.0, nvlinks=12, nvls=False, nic_bandwidth=25e9, cpu_vendor="amd")
H100 = dict(compute_capability=9.0, nvlinks=18, nvls=True, nic_bandwidth=50e9, cpu_vendor="intel")


def _fabric(gpu: dict, ranks: int, nodes: int = 1, **kw) -> NcclFabric:
    return NcclFabric(ranks=ranks, nodes=nodes, nics_per_node=ranks // nodes, **{**gpu, **kw})


# ----------------------------------------------------------------------------- NCCL's model
def test_channel_search_results_on_dgx_nodes():
    """search.cc on DGX nodes: 12 NVLinks x 20 GB/s = 240 GB/s: 6 channels at 40 GB/s, doubled to
    12 x 20 (ncclTopoDupChannels from 25 GB/s); 18 x 20.6 = 370.8 GB/s: 6 x 60, doubled to 12 x 30;
    NVLS one channel per GPU at the fastest speed all eight fit (8 x 40 <= 370.8 < 8 x 50), its
    bwInter raised to the top speed (60); across nodes one channel per NIC at the fastest speed
    below its bandwidth (HDR 25 GB/s: 24; NDR 50: 48)."""
    a = channel_graphs(_fabric(A100, 8))
    assert (a["ring"].channels, a["ring"].bw_intra) == (12, 20.0) and "nvls" not in a
    h = channel_graphs(_fabric(H100, 8))
    assert (h["ring"].channels, h["ring"].bw_intra) == (12, 30.0)
    assert (h["nvls"].channels, h["nvls"].bw_intra, h["nvls"].bw_inter) == (8, 40.0, 60.0)
    assert (channel_graphs(_fabric(A100, 16, 2))["ring"].channels, channel_graphs(_fabric(A100, 16, 2))["ring"].bw_intra) \
        == (8, 24.0)
    assert channel_graphs(_fabric(H100, 16, 2))["ring"].bw_intra * channel_graphs(_fabric(H100, 16, 2))["ring"].channels \
        == 8 * 48.0


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_ring_bandwidths_are_the_bus_bandwidth_formula(ranks):
    """nccl-tests' bus bandwidth of a ring all-reduce is its algorithm bandwidth times 2 (n-1)/n;
    NCCL's model inverts it from channels x bandwidth (Simple), x 0.92 capped at 20 GB/s a channel
    (LL128 on Ampere: 120/128 of the line), x 0.5 capped at llMaxBw (LL: half the line)."""
    f = _fabric(A100, ranks)
    bw = bandwidths("all_reduce", f)
    bus = 12 * 20.0
    assert bw[("ring", "Simple")] == pytest.approx(bus * ranks / (2 * (ranks - 1)))
    assert bw[("ring", "LL128")] == pytest.approx(min(0.92 * bus, 12 * 20.0) * ranks / (2 * (ranks - 1)))
    assert bw[("ring", "LL")] == pytest.approx(min(87.7, 0.5 * bus) * ranks / (2 * (ranks - 1)))
    ag = bandwidths("all_gather", f)
    assert ag[("ring", "Simple")] == pytest.approx(bus * ranks / (ranks - 1))  # N - 1 steps
    assert nccl.PROTOCOL_EFFICIENCY["LL128"] == 15 / 16 and nccl.PROTOCOL_EFFICIENCY["LL"] == 0.5


def test_nvls_bandwidth_and_latency_follow_tuning_cc():
    """NVLS all-reduce: per channel min(bwIntra x 0.85 x (n-1)/n x 2, bwInter), times channels, to
    algorithm bandwidth by n / (2 (n - 1)); its latency is the NVLink hwLat 25 us alone."""
    f = _fabric(H100, 8)
    bw = bandwidths("all_reduce", f)[("nvls", "Simple")]
    assert bw == pytest.approx(8 * min(40 * 0.85 * 7 / 8 * 2, 60.0) * 8 / 14)
    assert latencies("all_reduce", f)[("nvls", "Simple")] == 25.0
    assert ("nvls", "LL") not in bandwidths("all_reduce", f)


def test_ring_latency_is_base_plus_steps_times_hw_latency():
    for ranks in (2, 4, 8):
        lat = latencies("all_reduce", _fabric(A100, ranks))
        assert lat[("ring", "Simple")] == pytest.approx(8.4 + 2 * (ranks - 1) * 3.4)
        assert lat[("ring", "LL")] == pytest.approx(6.6 + 2 * (ranks - 1) * 0.6)


def test_choice_is_the_fastest_and_moves_from_ll_to_simple_with_size():
    f = _fabric(A100, 8)
    small, large = choose("all_reduce", 4096, f), choose("all_reduce", 2 ** 30, f)
    assert small.protocol == "LL" and large.protocol == "Simple"
    bws, lats = bandwidths("all_reduce", f), latencies("all_reduce", f)
    for nbytes in (4096, 2 ** 20, 2 ** 24, 2 ** 30):
        c = choose("all_reduce", nbytes, f)
        for (a, p), bw in bws.items():
            assert c.time <= nccl.algo_time("all_reduce", a, p, nbytes, f, bw, lats[(a, p)]) * 1e-6 + 1e-15
    # H100 with NVLS: NVLS wins large all-reduces on one node; not across nodes (needs CollNet)
    assert choose("all_reduce", 2 ** 30, _fabric(H100, 8)).algorithm == "nvls"
    assert choose("all_reduce", 2 ** 30, _fabric(H100, 16, 2)).algorithm != "nvls"
    # large messages approach the algorithm bandwidth: time -> bytes / bw
    assert large.time == pytest.approx(large.latency + 2 ** 30 / large.algo_bandwidth)


# ----------------------------------------------------------------------------- the tables
def test_vidur_network_excerpt_converts_to_rows_with_provenance():
    text = (DATA / "vidur/data/profiling/network/a100_dgx/all_reduce.csv").read_text()
    rows = vidur_network_rows(text, system="dgx-a100", net_system="dgx-a100+net", gpu="A100", stack="vidur-2024",
                              source="microsoft/vidur", commit="c", file="f.csv", license_="MIT", date="2024-05-14")
    import csv
    import io

    src = list(csv.DictReader(io.StringIO(text)))
    by_key = {(int(r["num_workers"]), int(r["devices_per_node"]), float(r["size"])):
              float(r["time_stats.all_reduce.median"]) * 1e-3 for r in src}
    assert rows
    for r in rows:
        assert r.time_s == by_key[(r.ranks, r.ranks_per_node, r.bytes)]
        assert r.system == ("dgx-a100" if r.ranks == r.ranks_per_node else "dgx-a100+net")
        assert (r.source, r.license, r.dtype) == ("microsoft/vidur", "MIT", "fp16")
    # the sizes kept lie within 5 % of a power of two or three times one
    for r in rows:
        e = math.log2(r.bytes)
        assert min(abs(r.bytes / 2 ** round(e) - 1), abs(r.bytes / (3 * 2 ** round(math.log2(r.bytes / 3))) - 1)) <= 0.05


def test_xla_excerpt_sizes_follow_the_generators_tensors():
    text = (DATA / "xla/collective_interpolator_data_sm90_excerpt.h").read_text()
    rows = xla_textproto_rows(text, system="hgx-h100", gpu="H100", stack="xla-2025", source="openxla/xla",
                              commit="c", file="f", license_="Apache-2.0", date="2025-01-01")
    assert len(rows) == 26 and {r.ranks for r in rows} == {8}
    rs = [r for r in rows if r.collective == "reduce_scatter"]
    # reduce-scatter entries carry the output shape; the tensor (the size) is 8 x 4 bytes per element
    assert min(r.bytes for r in rs) == 2 ** 20
    ar_1g = next(r for r in rows if r.collective == "all_reduce" and r.bytes == 2 ** 30)
    assert ar_1g.time_s == pytest.approx(2 ** 30 / 222030980976)


PUBLISHED_STACKS = {"vidur-2024", "xla-2025"}
AIC_STACKS = {"nccl-2.27.3", "nccl-2.29.2", "trtllm-1.3.0rc20", "vllm-0.24.0", "sglang-0.5.14"}


def test_shipped_tables_load_and_round_trip(tmp_path):
    rows = load_collective_tables()
    assert {r.stack for r in rows} == PUBLISHED_STACKS | AIC_STACKS
    assert all(r.license in ("MIT", "Apache-2.0") and r.source and r.file for r in rows)
    path = tmp_path / "t.csv"
    write_collectives(path, rows[:20], ["a comment"])
    again = load_collectives(path)
    assert [(r.config, r.bytes) for r in again] == [(r.config, r.bytes) for r in rows[:20]]
    assert all(a.time_s == pytest.approx(b.time_s, rel=1e-6) for a, b in zip(again, rows))
    bad = tmp_path / "bad.csv"
    bad.write_text(path.read_text().replace(f",{rows[0].collective},", ",allreduce,", 1))
    with pytest.raises(InputError, match="collective"):
        load_collectives(bad)


def test_bus_bandwidth_geometric_sizes_and_interpolation():
    r = CollectiveRow("s", "A100", "x", "all_reduce", 8, 8, 64e6, 1e-3, "fp16", "", "", "", "", "2024-01-01")
    assert r.bus_bandwidth == pytest.approx(64e9 * 2 * 7 / 8)
    assert geometric_sizes([1000, 1024, 1400, 2048, 3000, 3072, 5000]) == [1, 3, 5]  # 1400: 9 % off 1536
    curve = [CollectiveRow("s", "A100", "x", "all_reduce", 8, 8, b, t, "fp16", "", "", "", "", "2024-01-01")
             for b, t in ((1e6, 1e-4), (4e6, 4e-4))]
    assert interpolate(curve, 1e6) == pytest.approx(1e-4)
    assert interpolate(curve, 2e6) == pytest.approx(2e-4)  # log-log between two points on a line through 0
    assert interpolate(curve, 8e6) is None and interpolate(curve, 5e5) is None


# ----------------------------------------------------------------------------- plans and flows
def test_plan_structure_and_models():
    system = load_system("dgx-a100-cluster:nodes=1")
    devices = [f"gpu{i}" for i in range(4)]
    info = system_info(system, devices)
    assert info.stack == "vidur-2024" and info.line_bandwidth == 300e9
    inside = plan_collective("all_reduce", 2 ** 24, devices, info)  # a measured curve holds it
    assert inside.model == "measured" and inside.algorithm == "ring" and inside.steps == 6
    assert inside.payload_per_step == pytest.approx(2 ** 24 / 4)
    eff = nccl.PROTOCOL_EFFICIENCY[inside.protocol]
    assert inside.wire_bytes_per_step >= inside.payload_per_step / eff
    assert inside.time == pytest.approx(inside.steps * (inside.step_latency + inside.wire_bytes_per_step / 300e9))
    beyond = plan_collective("all_reduce", 2 ** 30, devices, info)  # past the measured sizes: the fitted model
    assert beyond.model == "fitted" and beyond.time > beyond.nccl_time  # the stack reaches less than NCCL's model
    none = system_info(system, devices, rows=())
    raw = plan_collective("all_reduce", 2 ** 30, devices, none)
    assert raw.model == "nccl-model" and raw.time == pytest.approx(raw.nccl_time)
    ag = plan_collective("all_gather", 2 ** 24, devices, none)
    assert (ag.steps, ag.payload_per_step) == (3, 2 ** 24 / 4)
    p2p = plan_collective("send_recv", 2 ** 24, devices[:2], system_info(system, devices[:2], rows=()))
    assert (p2p.pattern, p2p.steps, p2p.payload_per_step) == ("pair", 1, 2 ** 24)
    for bad in (("broadcast", 1e6, devices), ("all_reduce", 1e6, devices[:1]), ("all_reduce", -1.0, devices),
                ("send_recv", 1e6, devices)):
        with pytest.raises(InputError):
            plan_collective(bad[0], bad[1], bad[2], info)


def test_flows_take_the_plans_time_without_contention_and_use_every_rail_across_nodes():
    from marssim.sim import simulate

    system = load_system("dgx-h100-cluster:nodes=2")
    devices = [f"gpu{i}" for i in range(8)]
    info = system_info(system, devices, rows=())
    for kind in ("all_reduce", "all_gather"):
        plan = plan_collective(kind, 2 ** 26, devices, info)
        tg = plan_taskgraph(plan, system, devices)
        result = simulate(tg, system, record=False, setup=False)
        assert result.makespan == pytest.approx(plan.time, rel=1e-6)
        transfers = int(np.count_nonzero(tg.nbytes > 0))
        per_step = plan.ranks if plan.pattern == "ring" else plan.ranks * (plan.ranks - 1)
        assert transfers == plan.steps * per_step
    across = [f"gpu{i}" for i in range(16)]
    plan = plan_collective("all_reduce", 2 ** 30, across, system_info(system, across, rows=()))
    tg = plan_taskgraph(plan, system, across)
    leaves = {node for r in tg.routes for node in r.nodes if node.startswith("leaf")}
    assert len(leaves) == 8  # one ring per channel, each leaving the node on its own rail
    assert simulate(tg, system, record=False, setup=False).makespan == pytest.approx(plan.time, rel=1e-6)


def test_system_info_needs_a_cluster_gpu():
    system = load_system("dgx-h100")
    with pytest.raises(InputError, match="cluster"):
        system_info(system, ["gpu0", "gpu1"])


# ----------------------------------------------------------------------------- the target
def test_median_error_target_on_the_shipped_measurements():
    """Every single-node curve of the shipped systems' nodes, 1 MiB to 1 GiB, each predicted with
    the curve held out of the fit: median |error| <= 10 % (NCCL's own model alone is far off)."""
    every = heldout_check(load_collective_tables(), load_system)
    checks = [c for c in every if c.key[2] in PUBLISHED_STACKS]
    fitted = np.abs(np.concatenate([c.errors["fitted"] for c in checks]))
    raw = np.abs(np.concatenate([c.errors["nccl"] for c in checks]))
    interp = np.abs(np.concatenate([c.errors["interpolated"] for c in checks]))
    assert len(fitted) >= 100 and {c.key[2] for c in checks} == PUBLISHED_STACKS
    assert np.median(fitted) <= 0.10
    assert np.median(interp) <= 0.05
    assert np.median(raw) > 0.15  # what the measurements add to NCCL's model
    assert configurations([r for c in checks for r in c.rows])
    # AIConfigurator's curves (A100, H100, H200, B200, B300, GB200, GB300): inside a curve (what a plan of a
    # measured group size is charged) within 10 % in median on every GPU; held out of the fit,
    # the fitted model beats NCCL's own model on them
    aic = [c for c in every if c.key[2] in AIC_STACKS]
    assert {c.key[1] for c in aic} == {"A100", "H100", "H200", "B200", "B300", "GB200", "GB300"}
    for gpu in ("A100", "H100", "H200", "B200", "B300", "GB200", "GB300"):
        mine = [c for c in aic if c.key[1] == gpu]
        assert np.median(np.abs(np.concatenate([c.errors["interpolated"] for c in mine]))) <= 0.10, gpu
    aic_fitted = np.abs(np.concatenate([c.errors["fitted"] for c in aic]))
    aic_raw = np.abs(np.concatenate([c.errors["nccl"] for c in aic]))
    assert np.median(aic_fitted) < np.median(aic_raw)


# ----------------------------------------------------------------------------- AIConfigurator's collectives
def test_aiconfigurator_collective_rows_are_the_medians_in_bytes_and_seconds():
    pd = pytest.importorskip("pandas")
    from marssim.calibrate.aiconfigurator import collective_rows

    frame = pd.DataFrame([  # two repeats of one point, an int8 row and an alltoall row (both dropped)
        ("half", 8, 1 << 20, "NCCL", "all_reduce", 0.030),
        ("half", 8, 1 << 20, "NCCL", "all_reduce", 0.034),
        ("half", 4, 1 << 10, "NCCL", "all_gather", 0.011),
        ("int8", 8, 1 << 20, "NCCL", "all_reduce", 0.020),
        ("half", 8, 1 << 20, "NCCL", "alltoall", 0.050),
    ], columns=["nccl_dtype", "num_gpus", "message_size", "kernel_source", "op_name", "latency"])
    rows = collective_rows(frame, "b200_sxm", "nccl-2.29.2", "systems/data/b200_sxm/comm/nccl/2.29.2/x.parquet",
                           "0.12.0", "2026-12-07")
    assert [(r.collective, r.ranks, r.ranks_per_node, r.bytes) for r in rows] == [
        ("all_gather", 4, 4, 2048.0), ("all_reduce", 8, 8, 2.0 * (1 << 20))]
    ar = rows[1]
    assert ar.time_s == pytest.approx(0.032e-3) and ar.dtype == "fp16"
    assert (ar.system, ar.gpu, ar.stack, ar.license, ar.commit) == ("hgx-b200", "B200", "nccl-2.29.2", "Apache-2.0",
                                                                    "0.12.0")
    custom = pd.DataFrame([("bfloat16", 2, 128, "all_reduce", 0.0027)],
                          columns=["allreduce_dtype", "num_gpus", "message_size", "op_name", "latency"])
    (row,) = collective_rows(custom, "h100_sxm", "trtllm-1.3.0rc20", "f", "0.12.0", "2026-12-07")
    assert (row.bytes, row.dtype, row.system) == (256.0, "bf16", "hgx-h100")
    with pytest.raises(InputError, match="gpu"):
        collective_rows(frame, "mi300x", "s", "f", "0", "2026-12-07")


def test_blackwell_nccl_constants_give_the_b200_node_channels():
    """NCCL's Blackwell constants (topo.h SM100_NVLINK_BW 40.1 GB/s; search.cc sm100SpeedArrayIntra
    from 90 GB/s): 18 links carry 721.8 GB/s, so the search fits 8 channels of 90 GB/s (720), which
    ncclTopoDupChannels doubles to 16 of 45; NVLS: one channel per GPU, 8 x 90 GB/s."""
    assert nccl.arch_of(10.0) == "blackwell" and nccl.nvlink_bandwidth(10.0) == 40.1
    b200 = dict(compute_capability=10.0, nvlinks=18, nvls=True, nic_bandwidth=50e9, cpu_vendor="intel")
    graphs = channel_graphs(_fabric(b200, 8))
    assert (graphs["ring"].channels, graphs["ring"].bw_intra) == (16, 45.0)
    assert (graphs["nvls"].channels, graphs["nvls"].bw_intra, graphs["nvls"].bw_inter) == (8, 90.0, 90.0)
    bw = bandwidths("all_reduce", _fabric(b200, 8), graphs)
    assert bw[("nvls", "Simple")] == pytest.approx(min(90.0 * 0.74 * 7 / 8 * 2, 90.0) * 8 * 8 / 14)
    assert bw[("ring", "LL128")] == pytest.approx(min(16 * 45.0 * 0.92, 16 * 40.0) * 8 / 14)


@pytest.mark.parametrize("spec", ["dgx-h200-cluster:nodes=2", "dgx-b200-cluster:nodes=2",
                                  "gb200-nvl72:racks=2,gpus_per_rack=8"])
def test_h200_b200_gb200_collectives_are_timed_by_their_measured_curves(spec):
    from marssim.collectives.group import group_plan

    system = load_system(spec)
    info = system_info(system, ["gpu0", "gpu1", "gpu2", "gpu3"])
    gpu = system.designs[system.accelerator("gpu0").designs[0]].gpu.calibration
    assert info.stack == "nccl-2.29.2" and info.gpu_name == gpu
    row = next(r for r in load_collective_tables() if r.stack == "nccl-2.29.2" and r.gpu == gpu
               and r.collective == "all_gather" and r.ranks == 4 and r.bytes == 2 ** 24)
    plan = plan_collective("all_gather", 2 ** 24, 4, info)
    assert plan.model == "measured" and plan.time == pytest.approx(row.time_s, rel=1e-9)
    across = [f"gpu{i}" for i in range(16)]
    far = group_plan(system, across, "all_reduce", 2 ** 26)  # two nodes: NCCL's model of the GPU's generation
    assert far is not None and far.model == "nccl-model" and far.nodes == 2
    cc = system.designs[system.accelerator("gpu0").designs[0]].gpu.compute_capability
    assert far.nccl_time == pytest.approx(choose("all_reduce", 2 ** 26, system_info(system, across).fabric).time)
    assert nccl.arch_of(cc) == ("hopper" if "h200" in spec else "blackwell")


def test_an_unknown_collective_stack_is_refused_naming_the_key():
    system = load_system("dgx-b200-cluster:nodes=1,collective_stack=nccl-9.9")
    with pytest.raises(InputError, match="designs.b200.gpu.collective_stack"):
        system_info(system, ["gpu0", "gpu1"])
    line = system_info(load_system("dgx-h100-cluster:nodes=1,collective_stack=trtllm-1.3.0rc20"), ["gpu0", "gpu1"])
    assert line.stack == "trtllm-1.3.0rc20"  # TensorRT-LLM's own all-reduce on H100


def test_an_unknown_collective_stack_exits_2_from_the_command_line(capsys):
    from marssim.cli import main

    code = main(["estimate", "--system", "dgx-b200-cluster:nodes=1,collective_stack=bogus", "--workload",
                 "llama3-8b:mode=train,batch=1,layers=2", "--parallel", "tp=2,dp=4,micro_batch=1,global_batch=8"])
    assert code == 2
    err = capsys.readouterr().err
    assert "designs.b200.gpu.collective_stack" in err and "nccl-2.29.2" in err and "'bogus'" in err
