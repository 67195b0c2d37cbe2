"""Helpers shared by tests: small systems built in memory and a transparent cost model."""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from marssim.cost.base import OpCost
from marssim.system import System, system_from_dict


class RooflineCost:
    """A transparent cost model for tests of mapping and simulation logic: time = max(MACs /
    peak MAC/s, bytes / sram bandwidth). Independent of ``marssim.cost``'s calibrated models."""

    def op_cost(self, op, design) -> OpCost:
        compute = op.macs / design.peak_macs_per_s if op.macs else op.flops / design.peak_macs_per_s
        memory = op.bytes_moved / design.sram_bandwidth
        t = max(compute, memory)
        return OpCost(t, float("nan"), compute, memory, 0.0, 0.0, "test-roofline")

    def op_time(self, op, design) -> float:
        return self.op_cost(op, design).time

    def op_times(self, ops, designs):
        import numpy as np

        return np.array([self.op_time(o, d) for o, d in zip(ops, designs)])


DESIGN = {"dataflow": "os", "pe_rows": 16, "pe_cols": 16, "clock": "1 GHz", "sram": "4 MiB",
          "sram_bandwidth": "200 GB/s"}


def make_system(n: int = 4, *, topology: str = "ring", bandwidth: str = "50 GB/s", latency: str = "1 us",
                memory_bandwidth: str = "10 TB/s", capacity: str = "16 GiB", host_bandwidth: str = "32 GB/s",
                switch_latency: str = "0 s", backplane: str | None = None, designs: dict | None = None) -> System:
    """A system of ``n`` accelerators ``acc0..`` on a ring, chain, switch or full mesh, one host."""
    designs = designs or {"os16": DESIGN}
    names = list(designs)
    links: list[dict] = []
    switches: list[dict] = []
    accs = f"acc[0-{n - 1}]"
    if topology in ("ring", "chain", "full"):
        if n > 1:
            links.append({"pattern": topology, "nodes": accs, "bandwidth": bandwidth, "latency": latency})
        links.append({"between": ["host0", "acc0"], "bandwidth": host_bandwidth, "latency": latency})
    elif topology == "switch":
        sw: dict = {"id": "sw0", "latency": switch_latency}
        if backplane:
            sw["bandwidth"] = backplane
        switches.append(sw)
        links.append({"pattern": "star", "hub": "sw0", "nodes": accs, "bandwidth": bandwidth, "latency": latency})
        links.append({"between": ["host0", "sw0"], "bandwidth": host_bandwidth, "latency": latency})
    else:
        raise ValueError(topology)
    return system_from_dict({
        "name": f"test-{topology}-{n}", "designs": designs,
        "accelerators": [{"id": accs, "designs": names, "memory": {"capacity": capacity, "bandwidth": memory_bandwidth}}],
        "hosts": [{"id": "host0", "dram": {"capacity": "1 TiB", "bandwidth": "1 TB/s"}}],
        "switches": switches, "links": links,
    }, f"<test-{topology}-{n}>")


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)


def write_switch_system(directory: Path, accelerators: int = 4) -> str:
    """A system file of ``accelerators`` small GPUs (``acc0`` ..., design ``g8``) and a host on
    one switch, written into ``directory`` as ``quad.yaml``; its path. The design names no
    calibration table: the roofline times it (microseconds per op, no table to fit), so
    command-line tests run fast."""
    nodes = f"acc[0-{accelerators - 1}]"
    path = Path(directory) / "quad.yaml"
    path.write_text(yaml.safe_dump({
        "name": "quad",
        "designs": {"g8": {"dataflow": "gpu", "clock": "1 GHz", "sram": "8 MiB", "sram_bandwidth": "400 GB/s",
                           "gpu": {"sms": 8, "peak_flops": {"fp16": "50 TFLOP/s", "bf16": "50 TFLOP/s",
                                                            "fp32": "5 TFLOP/s"}}}},
        "accelerators": [{"id": nodes, "designs": ["g8"], "memory": {"capacity": "4 GiB", "bandwidth": "1 TB/s"}}],
        "hosts": [{"id": "host0", "dram": {"capacity": "1 TiB", "bandwidth": "200 GB/s"}}],
        "switches": [{"id": "sw0", "latency": "0.5 us"}],
        "links": [{"pattern": "star", "hub": "sw0", "nodes": nodes, "bandwidth": "50 GB/s", "latency": "1 us"},
                  {"between": ["host0", "sw0"], "bandwidth": "32 GB/s", "latency": "1 us"}],
    }))
    return str(path)


def small_moe_serving_search(model_spec: str):
    """The deployment search of a small mixture-of-experts model on four switched accelerators
    (roofline cost, fewest GPUs under TTFT P99 <= 50 ms and TBT P99 <= 10 ms, 100 Poisson
    requests): the SearchResult, for tests of its expert-parallel layouts."""
    from marssim.search.serve import ServeSearchSettings, mars_serve
    from marssim.serve import Arrivals, Lengths, RequestSpec, load_model
    from marssim.serve.case import ServeCase
    from marssim.serve.slo import parse_constraints

    system = make_system(4, topology="switch", capacity="64 MiB", bandwidth="50 GB/s", latency="1 us")
    spec = RequestSpec(Arrivals("poisson", rate=200.0), Lengths("uniform", low=20, high=300),
                       Lengths("uniform", low=2, high=60), 100)
    case = ServeCase(load_model(model_spec), spec, 0, parse_constraints("ttft_p99=50ms,tbt_p99=10ms"), (),
                     goodput=False)
    settings = ServeSearchSettings(objective="gpus", generations=2, max_simulations=4, population=4, max_pp=1,
                                   schedulers=("chunked",), max_num_seqs=(64,), max_batched_tokens=(512,),
                                   block_sizes=(16,), seed_with_grid=False)
    return mars_serve(case, system, RooflineCost(), settings)
