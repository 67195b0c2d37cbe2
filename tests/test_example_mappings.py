"""The hand-written example mappings in topologies/mappings/: one per shipped topology, named
<topology>-<workload>.yaml, each valid, complete and simulated without overflow."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from marssim.cost import default_cost_model
from marssim.mapping import Mapping, mapping_from_dict, mapping_to_dict
from marssim.parallel import ParallelConfig, parse_parallel
from marssim.plan import load_plan, plan_to_dict, run
from marssim.system import shipped_systems, topologies_dir
from marssim.workload import parse_spec

EXAMPLES = sorted((topologies_dir() / "mappings").glob("*.yaml"))


def test_every_shipped_topology_has_an_example_mapping() -> None:
    topologies = {p.stem for p in shipped_systems()}
    covered = {yaml.safe_load(p.read_text())["system"].split(":")[0] for p in EXAMPLES}  # parameters after ':'
    assert topologies <= covered, f"no example mapping for {sorted(topologies - covered)}"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_is_named_after_its_system_and_workload(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    model, _ = parse_spec(data["workload"])
    assert path.stem == f"{data['system'].split(':')[0]}-{model}"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_loads_round_trips_and_simulates(path: Path) -> None:
    plan, graph, system = load_plan(path)
    if isinstance(plan, Mapping):
        again = mapping_from_dict(mapping_to_dict(plan, graph), graph, system, str(path))
        assert again.key == plan.key
        used = {d for s in plan.sets for d in s.devices}
        assert used <= set(system.accelerator_ids)
    else:
        assert isinstance(plan, ParallelConfig)
        data = plan_to_dict(plan, graph, system)
        assert data["workload"] == graph.spec and parse_parallel(data["parallel"]) == plan
    done = run(plan, graph, system, default_cost_model())
    result, tg = done.result, done.taskgraph
    if isinstance(plan, ParallelConfig):
        # every GEMM-class FLOP of every micro-batch of every replica is computed once: the folded
        # run's representatives times the GPUs each stands for
        from marssim.parallel import prepare_graph

        one = prepare_graph(graph, plan)
        kinds = tg.meta["op_kind"]
        per_class = {rep: 0 for rep in tg.meta["fold"].values()}
        for rep in tg.meta["fold"].values():
            per_class[rep] += 1
        iv = result.intervals[result.intervals["kind"] == "compute"]
        gemm = iv[iv["op"].map(lambda o: kinds.get(o) in ("gemm", "matmul"))]
        executed = sum(f * per_class[r] for r, f in gemm.groupby("resource")["flops"].sum().items())
        assert executed == pytest.approx(sum(op.flops for op in one.ops if op.is_gemm_like)
                                         * plan.micro_batches * plan.dp, rel=1e-12)
    else:
        # every FLOP of the workload is computed once, whatever the sharding and pipelining
        assert result.intervals["flops"].sum() == pytest.approx(graph.flops, rel=1e-12)
    assert result.makespan > 0
    assert (result.memories["peak_bytes"] <= result.memories["capacity_bytes"]).all()
