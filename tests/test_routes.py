"""Routes over the link graph: latency sums, bottleneck bandwidth, half duplex, switches, meshes."""

from __future__ import annotations

import itertools

import pytest

from marssim.system import System, load_system, system_from_dict

DESIGN = {"dataflow": "os", "pe_rows": 8, "pe_cols": 8, "clock": "1 GHz", "sram": "1 MiB", "sram_bandwidth": "1 TB/s"}


def _system(links: list[dict], *, n: int = 4, switches: list[dict] | None = None, hosts: list[dict] | None = None,
            memory_bandwidth: str = "10 TB/s") -> System:
    """``n`` accelerators acc0.. and host0 (plus ``hosts``), joined by ``links``."""
    return system_from_dict({
        "name": "routes", "designs": {"d": DESIGN},
        "accelerators": [{"id": f"acc[0-{n - 1}]", "design": "d",
                          "memory": {"capacity": "1 GiB", "bandwidth": memory_bandwidth}}],
        "hosts": hosts or [{"id": "host0", "dram": {"capacity": "1 TiB", "bandwidth": "10 TB/s"}}],
        "switches": switches or [],
        "links": links,
    }, "<routes>")


def _chain(latencies: list[str], bandwidths: list[str], **kw) -> System:
    links = [{"between": [f"acc{i}", f"acc{i + 1}"], "bandwidth": bw, "latency": lat}
             for i, (lat, bw) in enumerate(zip(latencies, bandwidths))]
    links.append({"between": ["host0", "acc0"], "bandwidth": "100 GB/s"})
    return _system(links, n=len(latencies) + 1, **kw)


def test_latency_is_the_sum_over_links() -> None:
    s = _chain(["1 us", "2 us", "3 us"], ["50 GB/s"] * 3)
    r = s.route("acc0", "acc3")
    assert r.nodes == ("acc0", "acc1", "acc2", "acc3")
    assert r.latency == pytest.approx(6e-6, rel=1e-12)
    assert s.route("acc3", "acc0").latency == pytest.approx(6e-6, rel=1e-12)
    assert s.route("acc1", "acc2").latency == pytest.approx(2e-6, rel=1e-12)
    same = s.route("acc2", "acc2")
    assert same.nodes == ("acc2",) and same.resources == () and same.latency == 0.0
    assert s.bottleneck_bandwidth("acc2", "acc2") == float("inf")


def test_bottleneck_is_the_tightest_link_or_memory() -> None:
    s = _chain(["1 us"] * 3, ["50 GB/s", "10 GB/s", "30 GB/s"])
    assert s.bottleneck_bandwidth("acc0", "acc3") == 10e9
    assert s.bottleneck_bandwidth("acc2", "acc3") == 30e9
    # a route holds: source memory, each link in its direction, destination memory
    r = s.route("acc0", "acc3")
    names = [s.resource_names[i] for i in r.resources]
    assert names == ["acc0:mem", "acc0->acc1", "acc1->acc2", "acc2->acc3", "acc3:mem"]
    slow_memory = _chain(["1 us"] * 3, ["50 GB/s", "10 GB/s", "30 GB/s"], memory_bandwidth="4 GB/s")
    assert slow_memory.bottleneck_bandwidth("acc0", "acc3") == 4e9


def test_full_duplex_directions_are_separate_resources_half_duplex_share_one() -> None:
    s = _system([
        {"between": ["acc0", "acc1"], "bandwidth": "10 GB/s", "duplex": "full"},
        {"between": ["acc1", "acc2"], "bandwidth": "10 GB/s", "duplex": "half"},
        {"between": ["host0", "acc0"], "bandwidth": "10 GB/s"},
    ], n=3)

    def link_resources(a: str, b: str) -> list[int]:
        return [i for i in s.route(a, b).resources if s.resource_kinds[i] == "link"]

    assert link_resources("acc0", "acc1") != link_resources("acc1", "acc0")
    assert link_resources("acc1", "acc2") == link_resources("acc2", "acc1")
    (half,) = link_resources("acc1", "acc2")
    assert s.resource_names[half] == "acc1<->acc2" and s.resource_capacity[half] == 10e9
    # 3 links: 2 full duplex (2 resources each) + 1 half duplex (1 resource)
    assert sum(1 for k in s.resource_kinds if k == "link") == 5


def test_switch_latency_and_backplane() -> None:
    star = [{"pattern": "star", "hub": "sw0", "nodes": "acc[0-3]", "bandwidth": "50 GB/s", "latency": "1 us"},
            {"between": ["host0", "sw0"], "bandwidth": "50 GB/s", "latency": "1 us"}]
    s = _system(star, switches=[{"id": "sw0", "latency": "100 ns", "bandwidth": "40 GB/s"}])
    r = s.route("acc0", "acc3")
    assert r.nodes == ("acc0", "sw0", "acc3")
    assert r.latency == pytest.approx(2.1e-6, rel=1e-12)  # two links + one switch traversal
    names = [s.resource_names[i] for i in r.resources]
    assert "sw0:backplane" in names
    assert s.bottleneck_bandwidth("acc0", "acc3") == 40e9
    # every route through the switch holds the same backplane resource
    backplane = s.resource_names.index("sw0:backplane")
    assert all(backplane in s.route(f"acc{i}", f"acc{j}").resources for i in range(4) for j in range(4) if i != j)

    open_switch = _system(star, switches=[{"id": "sw0", "latency": "100 ns"}])
    assert "sw0:backplane" not in open_switch.resource_names
    assert open_switch.bottleneck_bandwidth("acc0", "acc3") == 50e9


def test_lowest_latency_wins_and_ties_take_fewer_hops() -> None:
    slow_direct = _system([
        {"between": ["acc0", "acc1"], "bandwidth": "100 GB/s", "latency": "10 us"},
        {"between": ["acc0", "acc2"], "bandwidth": "10 GB/s", "latency": "1 us"},
        {"between": ["acc2", "acc1"], "bandwidth": "10 GB/s", "latency": "1 us"},
        {"between": ["host0", "acc0"], "bandwidth": "10 GB/s"},
    ], n=3)
    assert slow_direct.route("acc0", "acc1").nodes == ("acc0", "acc2", "acc1")
    tie = _system([
        {"between": ["acc0", "acc1"], "bandwidth": "10 GB/s", "latency": "2 us"},
        {"between": ["acc0", "acc2"], "bandwidth": "10 GB/s", "latency": "1 us"},
        {"between": ["acc2", "acc1"], "bandwidth": "10 GB/s", "latency": "1 us"},
        {"between": ["host0", "acc0"], "bandwidth": "10 GB/s"},
    ], n=3)
    assert tie.route("acc0", "acc1").nodes == ("acc0", "acc1")


def _mesh(rows: int, cols: int, wrap: bool = False, latency: str = "20 ns") -> System:
    n = rows * cols
    return _system([
        {"pattern": "mesh", "nodes": f"acc[0-{n - 1}]", "rows": rows, "cols": cols, "wrap": wrap,
         "bandwidth": "10 GB/s", "latency": latency},
        {"between": ["host0", "acc0"], "bandwidth": "10 GB/s", "latency": "1 us"},
    ], n=n)


@pytest.mark.parametrize("rows,cols,latency", [(4, 4, "20 ns"), (3, 5, "0 s"), (1, 6, "5 ns")])
def test_mesh_routes_are_manhattan_shortest_and_deterministic(rows: int, cols: int, latency: str) -> None:
    a, b = _mesh(rows, cols, latency=latency), _mesh(rows, cols, latency=latency)
    assert len(a.links) - 1 == 2 * rows * cols - rows - cols
    for i, j in itertools.product(range(rows * cols), repeat=2):
        manhattan = abs(i // cols - j // cols) + abs(i % cols - j % cols)
        r = a.route(f"acc{i}", f"acc{j}")
        assert len(r.nodes) - 1 == manhattan
        assert r.nodes == b.route(f"acc{i}", f"acc{j}").nodes  # same input, same path
        for u, v in zip(r.nodes, r.nodes[1:]):
            assert a.graph.has_edge(u, v)


def test_torus_wraps_around() -> None:
    t = _mesh(4, 4, wrap=True)
    assert len(t.links) - 1 == 2 * 16
    for i, j in itertools.product(range(16), repeat=2):
        dr, dc = abs(i // 4 - j // 4), abs(i % 4 - j % 4)
        assert len(t.route(f"acc{i}", f"acc{j}").nodes) - 1 == min(dr, 4 - dr) + min(dc, 4 - dc)


@pytest.mark.parametrize("pattern,n,expected", [("ring", 8, 8), ("ring", 2, 1), ("chain", 4, 3), ("full", 5, 10)])
def test_pattern_link_counts(pattern: str, n: int, expected: int) -> None:
    s = _system([{"pattern": pattern, "nodes": f"acc[0-{n - 1}]", "bandwidth": "1 GB/s"},
                 {"between": ["host0", "acc0"], "bandwidth": "1 GB/s"}], n=n)
    assert len(s.links) - 1 == expected


def test_ring_routes_take_the_shorter_way_round() -> None:
    s = _system([{"pattern": "ring", "nodes": "acc[0-7]", "bandwidth": "50 GB/s", "latency": "1 us"},
                 {"between": ["host0", "acc0"], "bandwidth": "1 GB/s", "latency": "1 ms"}], n=8)
    for j in range(1, 8):
        assert len(s.route("acc0", f"acc{j}").nodes) - 1 == min(j, 8 - j)
        assert s.route("acc0", f"acc{j}").latency == pytest.approx(min(j, 8 - j) * 1e-6)


def test_nearest_host_is_the_lowest_latency_one() -> None:
    s = _system([
        {"pattern": "chain", "nodes": "acc[0-3]", "bandwidth": "10 GB/s", "latency": "1 us"},
        {"between": ["host0", "acc0"], "bandwidth": "10 GB/s", "latency": "1 us"},
        {"between": ["host1", "acc3"], "bandwidth": "10 GB/s", "latency": "1 us"},
    ], hosts=[{"id": "host0", "dram": {"capacity": "1 TiB", "bandwidth": "1 TB/s"}},
              {"id": "host1", "dram": {"capacity": "1 TiB", "bandwidth": "1 TB/s"}}])
    assert [s.nearest_host(f"acc{i}") for i in range(4)] == ["host0", "host0", "host1", "host1"]


def test_shipped_mesh_and_nvswitch_routes() -> None:
    mesh = load_system("chiplet-mesh-4x4")
    for i, j in itertools.product(range(16), repeat=2):
        r = mesh.route(f"chip{i}", f"chip{j}")
        hops = abs(i // 4 - j // 4) + abs(i % 4 - j % 4)
        assert len(r.nodes) - 1 == hops
        assert r.latency == pytest.approx(hops * 20e-9, abs=1e-18)
    dgx = load_system("dgx-h100")
    r = dgx.route("gpu0", "gpu5")
    assert r.latency == pytest.approx(0.15e-6 + 0.17e-6 + 0.15e-6)  # link + NVSwitch + link
