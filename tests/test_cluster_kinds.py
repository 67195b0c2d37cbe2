"""Cluster structures beyond a DGX node: a scale-up mesh of point-to-point links (MI300X's
Infinity Fabric), several hosts per node (GB200's Grace CPUs, one per two GPUs), racks of 72
GPUs in one NVLink domain; routes against a graph search, the exact symmetry folding on them,
and the shipped systems' per-GPU figures against their datasheets' aggregates."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest

from marssim.cost import default_cost_model
from marssim.errors import InputError
from marssim.parallel import lower_parallel, parse_parallel
from marssim.sim import simulate
from marssim.system import load_system, system_from_dict
from marssim.workload import load_workload

COST = default_cost_model()


def _cluster(nodes: int = 4, per_leaf: int = 2, gpus: int = 4, scale_up: str = "switch", per_host: int | None = None,
             oversubscription: float = 1.0):
    group = {"nodes": nodes, "gpus_per_node": gpus, "design": "g", "scale_up": scale_up,
             "memory": {"capacity": "80 GiB", "bandwidth": "2 TB/s"},
             "nvlink": {"bandwidth": "100 GB/s" if scale_up == "mesh" else "300 GB/s", "latency": "150 ns"},
             "nic": {"bandwidth": "25 GB/s", "latency": "1.2 us"},
             "host_link": {"bandwidth": "32 GB/s", "latency": "500 ns"},
             "host_dram": {"capacity": "1 TiB", "bandwidth": "400 GB/s"}, "nodes_per_leaf": per_leaf}
    if scale_up == "switch":
        group["nvswitch_latency"] = "170 ns"
    if per_host is not None:
        group["gpus_per_host"] = per_host
    return system_from_dict({
        "name": "test-cluster",
        "designs": {"g": {"dataflow": "gpu", "sram": "40 MiB",
                          "gpu": {"sms": 100, "peak_flops": {"bf16": "300 TFLOP/s", "fp32": "20 TFLOP/s"}}}},
        "cluster": {"node_groups": [group],
                    "fabric": {"leaf_latency": "130 ns", "spine_latency": "130 ns", "uplink_latency": "100 ns",
                               "oversubscription": oversubscription}},
    })


def _latency_search(system):
    def weight(u, v, data):
        sw = system._switch.get(v)
        return data["link"].latency + (sw.latency if sw is not None else 0.0)

    return weight


@pytest.mark.parametrize("kind", [dict(scale_up="mesh"), dict(per_host=2), dict(scale_up="mesh", per_host=1)],
                         ids=["mesh", "two-gpus-per-host", "mesh-one-gpu-per-host"])
def test_routes_are_shortest_paths_of_existing_links(kind) -> None:
    system = _cluster(nodes=4, per_leaf=2, gpus=4, **kind)
    graph, weight = system.graph, _latency_search(system)
    ends = list(system.accelerator_ids) + [h.id for h in system.hosts]
    for a, b in itertools.permutations(ends, 2):
        route = system.route(a, b)
        assert all(graph.has_edge(u, v) for u, v in zip(route.nodes, route.nodes[1:]))
        best = nx.shortest_path_length(graph, a, b, weight=weight)
        assert route.latency == pytest.approx(best, rel=1e-12, abs=1e-15), (a, b, route.nodes)


def test_a_mesh_has_a_link_per_pair_and_no_switch_inside_a_node() -> None:
    system = _cluster(nodes=2, per_leaf=2, gpus=4, scale_up="mesh")
    assert not any(s.id.startswith("nvswitch") for s in system.switches)
    node0 = [f"gpu{k}" for k in range(4)]
    for a, b in itertools.combinations(node0, 2):
        assert system.route(a, b).nodes == (a, b)
    # a GPU of the mesh has gpus - 1 scale-up links, one NIC link and one host link
    assert system.graph.degree("gpu0") == 3 + 1 + 1


def test_hosts_serve_their_own_gpus() -> None:
    system = _cluster(nodes=2, per_leaf=2, gpus=4, per_host=2)
    assert len(system.hosts) == 4
    assert [system.nearest_host(f"gpu{k}") for k in range(8)] == ["host0", "host0", "host1", "host1",
                                                                  "host2", "host2", "host3", "host3"]
    for h in system.hosts:
        assert sum(1 for n in system.graph.neighbors(h.id)) == 2


@pytest.mark.parametrize("bad,words", [
    (dict(per_host=3), "must divide gpus_per_node"),
])
def test_bad_host_split_is_one_error(bad, words) -> None:
    with pytest.raises(InputError) as info:
        _cluster(nodes=2, gpus=4, **bad)
    assert words in str(info.value)


FOLD = [
    ("mesh", dict(nodes=4, per_leaf=2, gpus=4, scale_up="mesh"),
     "gpt:layers=2,hidden=256,heads=4,vocab=1000,seq=64,mode=train,max_positions=64", "tp=4,pp=2,dp=2,global_batch=8"),
    ("grace-hosts", dict(nodes=2, per_leaf=2, gpus=8, per_host=2, oversubscription=2.0),
     "llama:layers=2,hidden=256,heads=8,kv_heads=4,ffn=512,vocab=1000,seq=64,mode=train",
     "tp=4,pp=1,dp=4,sp=true,global_batch=8"),
]


@pytest.mark.parametrize("name,cluster,spec,config", FOLD, ids=[c[0] for c in FOLD])
def test_folded_simulation_equals_the_full_one(name, cluster, spec, config) -> None:
    """Symmetric positions get symmetric routes: folding identical GPUs is exact on these too."""
    system = _cluster(**cluster)
    graph = load_workload(spec)
    cfg = parse_parallel(config)
    folded = lower_parallel(graph, system, cfg, COST, folding=True)
    full = lower_parallel(graph, system, cfg, COST, folding=False)
    assert folded.meta["fold_classes"] < full.meta["fold_classes"] == cfg.gpus
    a, b = simulate(folded, system), simulate(full, system)
    assert a.makespan == pytest.approx(b.makespan, rel=1e-9)


# ---------------------------------------------------------------- the shipped systems against their datasheets

def _per_direction_out(system, gpu: str, prefix: str) -> float:
    return sum(ln.bandwidth for ln in system.links if gpu in (ln.a, ln.b) and
               (ln.a if ln.b == gpu else ln.b).startswith(prefix))


def test_gb200_nvl72_rack_matches_its_datasheet_aggregates() -> None:
    system = load_system("gb200-nvl72:racks=2")
    gpus = system.accelerator_ids
    assert len(gpus) == 144 and len(system.hosts) == 72  # 72 GPUs and 36 Grace CPUs per rack
    rack = gpus[:72]
    # 130 TB/s of NVLink per rack, both directions together; 576 TB/s of HBM3e; 13.4 TB of HBM3e
    nvlink = sum(_per_direction_out(system, g, "nvswitch") for g in rack)
    assert 2 * nvlink == pytest.approx(130e12, rel=0.01)
    assert sum(system.accelerator(g).memory.bandwidth for g in rack) == pytest.approx(576e12)
    assert sum(system.accelerator(g).memory.capacity for g in rack) == pytest.approx(13.4e12, rel=0.001)
    # every GPU of a rack reaches every other through the rack's NVLink switch, one hop
    assert system.route(rack[0], rack[71]).nodes == (rack[0], "nvswitch0", rack[71])
    # a Grace CPU per two GPUs; its NVLink-C2C (900 GB/s both directions) shared by the two
    assert system.route("host0", rack[1]).nodes == ("host0", rack[1])
    assert 2 * _per_direction_out(system, rack[0], "host") * 2 == pytest.approx(900e9)
    assert system.fabric_kind == "infiniband"
    assert load_system("gb200-nvl72:fabric=ethernet").fabric_kind == "ethernet"


def test_a_run_on_part_of_each_nvl72_rack_keeps_the_rack_s_links_and_refuses_more_than_72() -> None:
    whole, part = load_system("gb200-nvl72:racks=4"), load_system("gb200-nvl72:racks=4,gpus_per_rack=64")
    assert len(whole.accelerator_ids) == 4 * 72 and len(part.accelerator_ids) == 4 * 64
    assert len(part.hosts) == 4 * 32  # a Grace CPU per two GPUs
    g = part.accelerator_ids[0]
    assert _per_direction_out(part, g, "nvswitch") == _per_direction_out(whole, whole.accelerator_ids[0], "nvswitch")
    assert part.route(part.accelerator_ids[0], part.accelerator_ids[63]).nodes[1] == "nvswitch0"  # one domain
    assert part.route(part.accelerator_ids[0], part.accelerator_ids[64]).nodes[1] != "nvswitch0"  # the next rack
    assert load_system("gb200-nvl72:gpus_per_rack=72").spec == load_system("gb200-nvl72").spec  # the default
    with pytest.raises(InputError, match="gpus_per_rack: expected an integer from 2 to 72"):
        load_system("gb200-nvl72:gpus_per_rack=80")
    with pytest.raises(InputError, match="gpus_per_host .2. must divide gpus_per_node .7."):
        load_system("gb200-nvl72:gpus_per_rack=7")


def test_dgx_b200_and_mi300x_nodes_match_their_datasheet_aggregates() -> None:
    b200 = load_system("dgx-b200-cluster:nodes=2")
    node = b200.accelerator_ids[:8]
    # 14.4 TB/s aggregate NVLink (both directions), 1,440 GB and 64 TB/s of HBM3e per DGX B200
    assert 2 * sum(_per_direction_out(b200, g, "nvswitch") for g in node) == pytest.approx(14.4e12)
    assert sum(b200.accelerator(g).memory.capacity for g in node) == pytest.approx(1440e9)
    assert sum(b200.accelerator(g).memory.bandwidth for g in node) == pytest.approx(64e12)
    # 400 Gb/s per GPU by default, 800 Gb/s adapters on request
    assert _per_direction_out(b200, node[0], "leaf") == pytest.approx(50e9)
    fast = load_system("dgx-b200-cluster:nodes=2,nic_gbps=800")
    assert _per_direction_out(fast, node[0], "leaf") == pytest.approx(100e9)

    mi = load_system("mi300x-cluster:nodes=2")
    gpu = mi.accelerator_ids[0]
    peers = [n for n in mi.graph.neighbors(gpu) if mi.is_accelerator(n)]
    assert len(peers) == 7  # seven Infinity Fabric links, no switch
    # 896 GB/s aggregate peer-to-peer bandwidth (both directions) = 7 links x 128 GB/s
    assert 2 * _per_direction_out(mi, gpu, "gpu") == pytest.approx(896e9)


def test_every_new_design_lists_fp8_at_twice_bf16_and_fp4_only_where_published() -> None:
    for spec, fp4 in (("dgx-h200-cluster:nodes=1", False), ("dgx-b200-cluster:nodes=1", True),
                      ("gb200-nvl72:racks=1", True), ("mi300x-cluster:nodes=1", False)):
        design = next(iter(load_system(spec).designs.values()))
        peaks = design.gpu.peak_flops
        assert peaks["fp8"] == pytest.approx(2 * peaks["bf16"], rel=1e-3), spec
        assert ("fp4" in peaks) == fp4, spec
        if fp4:
            assert peaks["fp4"] == pytest.approx(2 * peaks["fp8"]), spec


def test_show_and_systems_name_the_new_systems(capsys) -> None:
    from marssim.cli import main

    assert main(["systems"]) == 0
    listed = capsys.readouterr().out
    for name in ("dgx-h200-cluster", "dgx-b200-cluster", "gb200-nvl72", "mi300x-cluster"):
        assert name in listed
    assert main(["show", "gb200-nvl72:racks=1"]) == 0  # a parameterised system, not taken for a workload
    out = capsys.readouterr().out
    assert out.startswith("System gb200-nvl72") and "72 accelerators" in out and "36 hosts" in out


def test_unchecked_models_are_the_validated_ones():
    """made_unchecked builds what validation builds, every field in place, and is refused by
    models it cannot stand for (it falls back to pydantic's model_construct)."""
    from pydantic import BaseModel, ConfigDict

    from marssim.system.model import Accelerator, Host, Link, Memory, Switch, made_unchecked

    mem = Memory(capacity=80 * 2**30, bandwidth=3.35e12)
    cases = [(Link, dict(a="gpu0", b="leaf0.0", bandwidth=50e9, latency=1e-6, duplex="full", energy_per_byte=None)),
             (Accelerator, dict(id="gpu0", designs=("h100",), memory=mem)),
             (Host, dict(id="host0", dram=mem)),
             (Switch, dict(id="nvswitch0", latency=2e-7, bandwidth=None))]
    for cls, values in cases:
        made = made_unchecked(cls, **values)
        checked = cls(**values)
        assert type(made) is cls and made == checked and hash(made) == hash(checked)
        assert made.model_dump() == checked.model_dump()
        with pytest.raises(Exception):  # frozen as the validated one
            made.id = "other"  # type: ignore[misc]

    class Loose(BaseModel):
        model_config = ConfigDict(extra="allow", frozen=True)
        x: int

    loose = made_unchecked(Loose, x=1, y=2)  # not a model the shortcut stands for: model_construct's
    assert loose.model_extra == {"y": 2}
    partial = made_unchecked(Link, a="a", b="b", bandwidth=1.0)  # a field missing: the defaults filled in
    assert partial.latency == 0.0 and partial.duplex == "full"


def test_a_declared_parameter_range_bounds_the_value_and_a_malformed_one_is_refused() -> None:
    from marssim.system.params import apply_parameters

    data = {"parameters": {"n": {"default": 4, "low": 2, "high": 8}, "m": 3}, "a": "{n}", "b": "{m}"}
    body, changed = apply_parameters(data, {"n": "8"}, "f.yaml", "s:n=8")
    assert body == {"a": 8, "b": 3} and changed == {"n": 8}
    assert apply_parameters(data, {}, "f.yaml", "s")[0] == {"a": 4, "b": 3}
    for value in ("1", "9"):
        with pytest.raises(InputError, match="n: expected an integer from 2 to 8"):
            apply_parameters(data, {"n": value}, "f.yaml", f"s:n={value}")
    with pytest.raises(InputError, match="parameters.n: expected a default value or"):
        apply_parameters({"parameters": {"n": {"low": 2}}}, {}, "f.yaml", "s")
