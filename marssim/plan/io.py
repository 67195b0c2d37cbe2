"""Plan files: a mapping file (``sets`` and ``assign``: a per-op :class:`~marssim.mapping.Mapping`)
or a parallel configuration (``parallel:``: a :class:`~marssim.parallel.ParallelConfig`), each
naming its system and workload::

    system: dgx-h100-cluster:nodes=2
    workload: llama3-8b:mode=train,seq=2048
    parallel: {tp: 8, pp: 2, global_batch: 16, micro_batch: 1, recompute: selective}

A plan is found by path, or by the name of a shipped example (``marssim.data.topologies()``'s
``mappings/``, e.g. ``dgx-h100-cluster-llama3-8b``), so the examples work from any directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from marssim.data import topologies
from marssim.errors import InputError
from marssim.fsutil import atomic_file
from marssim.mapping import mapping_from_dict, mapping_to_dict
from marssim.mapping.io import mapping_inputs
from marssim.mapping.systemref import canonical_system_ref, relative_system_ref
from marssim.parallel import ParallelConfig, parse_parallel
from marssim.schema import read_yaml
from marssim.system import System
from marssim.workload import Graph

from .kinds import KINDS, PlanKind
from .model import Plan, bind_parallel, build_batch, workload_sets_batch

__all__ = ["load_plan", "save_plan", "plan_to_dict", "resolve_plan_file", "example_plans"]

_PARALLEL_KEYS = {"system", "workload", "name", "description", "parallel"}


def example_plans() -> dict[str, Path]:
    """The shipped example plans by name (file stem)."""
    return {p.stem: p for p in sorted((topologies() / "mappings").glob("*.yaml"))}


def resolve_plan_file(name_or_path: str | Path) -> Path:
    """``name_or_path`` as an existing file: a path, or the name of a shipped example (with or
    without ``.yaml``). InputError naming the examples and where they are otherwise."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    examples = example_plans()
    stem = path.name[:-5] if path.name.endswith(".yaml") else path.name
    if stem in examples:
        return examples[stem]
    where = topologies() / "mappings"
    raise InputError(str(name_or_path), "", f"no such file; expected a mapping file or the name of a shipped "
                                            f"example ({', '.join(examples)}; they are in {where})")


def load_plan(name_or_path: str | Path, *, system: System | str | None = None, workload: Graph | str | None = None,
              batch: int | None = None) -> tuple[Plan, Graph, System]:
    """Load a plan file (or a shipped example by name) with the system and workload it names
    (``system``, ``workload``, ``batch`` override them). Returns ``(plan, graph, system)``; the
    graph of a parallel configuration is one micro-batch of it. Raises InputError."""
    path = resolve_plan_file(name_or_path)
    file = str(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise InputError.expected(file, "", "a mapping with keys system, workload and sets/assign or parallel", data)
    if KINDS[PlanKind.PARALLEL].section in data:
        extra = [k for k in data if k not in _PARALLEL_KEYS]
        if extra:
            raise InputError(file, problems=[(str(k), "not with 'parallel:'; a parallel configuration decides sets "
                                                      "and shardings itself") for k in extra])
        raw = data["parallel"]
        config = parse_parallel(raw, file)
        from marssim.parallel.size import check_gpus

        check_gpus(config.gpus, file)  # before the system is built
        spec = workload if isinstance(workload, str) else data.get("workload", "")
        built_at = build_batch(str(spec), batch, config, micro_batch_given="micro_batch" in raw)
        graph, system = mapping_inputs(data, path, system, workload, built_at)  # a graph given is not built
        config, graph = bind_parallel(config, graph, system, file, micro_batch_given="micro_batch" in raw,
                                      order_given="order" in raw,
                                      batch_given=workload_sets_batch(str(spec), batch))
        return config, graph, system
    graph, system = mapping_inputs(data, path, system, workload, batch)
    mapping = mapping_from_dict(data, graph, system, file)
    return mapping.with_(system=canonical_system_ref(system), workload=graph.spec), graph, system


def plan_to_dict(plan: Plan, graph: Graph, system: System) -> dict[str, Any]:
    """The canonical YAML-ready form of ``plan`` (its system and workload included)."""
    if isinstance(plan, ParallelConfig):
        parallel = plan.to_dict()
        if "order" not in parallel:  # written where the file read back would take another default order
            from marssim.parallel.placement import default_order

            if default_order(system, plan) != plan.order:
                parallel["order"] = plan.order
        return {"system": canonical_system_ref(system), "workload": graph.spec, "parallel": parallel}
    return mapping_to_dict(plan, graph)


def save_plan(plan: Plan, graph: Graph, system: System, path: str | Path, header: str = "") -> Path:
    """Write ``plan`` as YAML, atomically (``header``: comment lines put first). A system given by
    absolute path is written relative to the file, so the pair can be moved together."""
    data = plan_to_dict(plan, graph, system)
    data["system"] = relative_system_ref(data["system"], path)
    text = header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110)
    with atomic_file(path) as handle:
        handle.write(text)
    return Path(path)
