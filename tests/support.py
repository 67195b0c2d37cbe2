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


def small_gpu_cluster(nodes: int = 4, per_leaf: int = 2, gpus: int = 4, oversubscription: float = 1.0):
    """``nodes`` nodes of ``gpus`` GPUs on NVSwitch (300 TFLOP/s bf16, 80 GiB), one 25 GB/s NIC per GPU
    into leaf switches of ``per_leaf`` nodes, a spine ``oversubscription`` times thinner."""
    from marssim.system import system_from_dict

    return system_from_dict({
        "name": "test-cluster",
        "designs": {"g": {"dataflow": "gpu", "clock": "1 GHz", "sram": "40 MiB", "sram_bandwidth": "5 TB/s",
                          "gpu": {"sms": 100, "peak_flops": {"bf16": "300 TFLOP/s", "fp32": "20 TFLOP/s"}}}},
        "cluster": {"node_groups": [{"nodes": nodes, "gpus_per_node": gpus, "design": "g",
                                     "memory": {"capacity": "80 GiB", "bandwidth": "2 TB/s"},
                                     "nvlink": {"bandwidth": "300 GB/s", "latency": "150 ns"},
                                     "nvswitch_latency": "170 ns",
                                     "nic": {"bandwidth": "25 GB/s", "latency": "1.2 us"},
                                     "pcie": {"bandwidth": "32 GB/s", "latency": "500 ns"},
                                     "host_dram": {"capacity": "1 TiB", "bandwidth": "400 GB/s"},
                                     "nodes_per_leaf": per_leaf}],
                    "fabric": {"leaf_latency": "130 ns", "spine_latency": "130 ns", "uplink_latency": "100 ns",
                               "oversubscription": oversubscription}},
    })


TINY_SERVING_LLAMA = "llama:layers=4,hidden=256,heads=8,kv_heads=4,ffn=768,vocab=2000"
"""A four-block Llama the serving-engine tests serve on :func:`switched_four` (a few hundred KV blocks)."""


def switched_four():
    """Four accelerators of 64 MiB on a switch (50 GB/s, 1 us): a KV cache of a few hundred to a
    thousand blocks for :data:`TINY_SERVING_LLAMA`."""
    return make_system(4, topology="switch", capacity="64 MiB", bandwidth="50 GB/s", latency="1 us")


def alone_in_serve_mode_times(spec: str, prompt: int, output: int, batch: int, cost, system) -> None:
    """Assert that ``batch`` equal requests of ``prompt`` and ``output`` tokens, served alone by one
    GPU with a static batch, take the TTFT and TPOT that
    :func:`marssim.parallel.analytic.serving_times` gives for the ``mode=serve`` graph of ``spec``."""
    import pytest

    from marssim.parallel import parse_parallel
    from marssim.parallel.analytic import serving_times
    from marssim.serve import Deployment, Pool, Requests, load_model
    from marssim.serve.deployment import SchedulerConfig
    from marssim.serve.simulate import simulate_serving
    from marssim.workload import load_workload

    graph = load_workload(f"{spec},mode=serve,prompt={prompt},generate={output - 1},batch={batch}")
    ttft, tpot = serving_times(graph, system, parse_parallel(f"tp=1,micro_batch={batch}"), cost)
    dep = Deployment((Pool(replicas=1, tp=1, scheduler=SchedulerConfig(kind="static", max_num_seqs=batch)),))
    result = simulate_serving(dep, load_model(spec), system, cost,
                              Requests.of([0.0] * batch, [prompt] * batch, [output] * batch))
    pr = result.per_request
    assert pr["first_token_s"] == pytest.approx([ttft] * batch, rel=1e-9)
    assert (pr["finish_s"] - pr["first_token_s"]) / (output - 1) == pytest.approx([tpot] * batch, rel=1e-9)
