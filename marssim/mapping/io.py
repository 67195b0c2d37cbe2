"""Mapping files (YAML): load with precise errors, save in a compact canonical form.

::

    system: ../mars-adaptive-16.yaml     # relative to this file, or a shipped system name
    workload: resnet50:batch=8
    micro_batches: 4
    collective_algorithm: auto           # auto | ring | direct | halving_doubling
    sets:
      - {name: front, devices: "acc[0-7]", design: os32}
      - {name: back, devices: "acc[8-15]", design: ws32}
    assign:                              # every op exactly once; ranges follow graph order
      - {ops: "conv1 .. layer2.3.relu3", set: front, sharding: dp}
      - {ops: "layer3.0.conv1 .. fc", set: back, sharding: [oc, dp]}   # first legal wins
    sharding:                            # per-op overrides (must be legal)
      fc: ic

``ops`` is an op name, a range ``"first .. last"`` (inclusive), ``"*"`` (all ops), ``"model:NAME"``
(every op of one model in a multi-model workload), or a list of these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from marssim.errors import InputError, summarise_names, warn_input
from marssim.fsutil import atomic_file
from marssim.system import System, expand_ids, load_system
from marssim.schema import read_yaml
from marssim.workload import Graph, load_workload

from .model import ALGORITHMS, AcceleratorSet, Mapping, validate_mapping
from .sharding import STRATEGIES, legal_strategies
from .systemref import canonical_system_ref, relative_system_ref, resolve_mapping_system

__all__ = ["mapping_from_dict", "mapping_to_dict", "load_mapping", "save_mapping", "mapping_inputs"]

_TOP_KEYS = {"system", "workload", "micro_batches", "collective_algorithm", "sets", "assign", "sharding", "name",
             "description", "batch"}


def _op_selection(spec: Any, graph: Graph, where: str, problems: list[tuple[str, str]]) -> list[int]:
    """Positions (in compute-op order) selected by an ``ops`` value."""
    order = [graph.ops[i].name for i in graph.compute_ops]
    position = {name: k for k, name in enumerate(order)}
    if isinstance(spec, list):
        out: list[int] = []
        for j, item in enumerate(spec):
            out.extend(_op_selection(item, graph, f"{where}[{j}]", problems))
        return out
    if not isinstance(spec, str) or not spec.strip():
        problems.append((where, f"expected an op name, a range 'first .. last', '*' or 'model:NAME', got {spec!r}"))
        return []
    text = spec.strip()
    if text == "*":
        return list(range(len(order)))
    if text.startswith("model:"):
        model = text[len("model:"):].strip()
        picked = [k for k, gi in enumerate(graph.compute_ops) if graph.ops[gi].model == model]
        if not picked:
            problems.append((where, f"no model {model!r}; expected one of: {', '.join(graph.models)}"))
        return picked
    if ".." in text:
        first, _, last = (part.strip() for part in text.partition(".."))
        bad = [n for n in (first, last) if n not in position]
        for n in bad:
            problems.append((where, f"unknown op {n!r} in range {text!r}"))
        if bad:
            return []
        a, b = position[first], position[last]
        if b < a:
            problems.append((where, f"range {text!r} ends before it starts (graph order)"))
            return []
        return list(range(a, b + 1))
    if text not in position:
        problems.append((where, f"unknown op {text!r}; expected an op of {graph.name}"))
        return []
    return [position[text]]


def _run(items: list[tuple[int, str]]) -> bool:
    """True when the positions of ``items`` are consecutive."""
    return all(b[0] == a[0] + 1 for a, b in zip(items, items[1:]))


def mapping_from_dict(data: Any, graph: Graph, system: System, file: str | None = None) -> Mapping:
    """Build and validate a :class:`Mapping` from a parsed mapping file; raise InputError listing
    every problem with its key path."""
    if not isinstance(data, dict):
        raise InputError.expected(file, "", "a mapping with keys sets and assign", data)
    problems: list[tuple[str, str]] = []
    for key in data:
        if key not in _TOP_KEYS:
            problems.append((str(key), f"unknown key; expected one of: {', '.join(sorted(_TOP_KEYS))}"))

    raw_sets = data.get("sets")
    sets: list[AcceleratorSet] = []
    names: list[str] = []
    if not isinstance(raw_sets, list) or not raw_sets:
        problems.append(("sets", f"expected a non-empty list of {{devices, design}}, got {raw_sets!r}"))
        raw_sets = []
    for i, s in enumerate(raw_sets):
        if not isinstance(s, dict):
            problems.append((f"sets[{i}]", f"expected a mapping with devices and design, got {s!r}"))
            continue
        for key in s:
            if key not in ("devices", "design", "name"):
                problems.append((f"sets[{i}].{key}", "unknown key; expected devices, design or name"))
        try:
            devices = tuple(expand_ids(s.get("devices")))
        except ValueError as exc:
            problems.append((f"sets[{i}].devices", str(exc)))
            devices = ()
        design = s.get("design")
        if not isinstance(design, str):
            problems.append((f"sets[{i}].design", f"expected a design name, got {design!r}"))
            design = ""
        sets.append(AcceleratorSet(devices, design))
        names.append(str(s.get("name", i)))

    def set_index(value: Any, where: str) -> int | None:
        if isinstance(value, bool):
            value = None
        if isinstance(value, int) and 0 <= value < len(sets):
            return value
        if isinstance(value, str) and value in names:
            return names.index(value)
        problems.append((where, f"unknown set {value!r}; expected an index 0..{len(sets) - 1} or a set name"))
        return None

    n = len(graph.compute_ops)
    op_set: list[int | None] = [None] * n
    op_shard: list[str | None] = [None] * n
    assigned_by: list[str | None] = [None] * n
    raw_assign = data.get("assign")
    if not isinstance(raw_assign, list) or not raw_assign:
        problems.append(("assign", f"expected a non-empty list of {{ops, set, sharding}}, got {raw_assign!r}"))
        raw_assign = []
    for i, entry in enumerate(raw_assign):
        where = f"assign[{i}]"
        if not isinstance(entry, dict):
            problems.append((where, f"expected a mapping with ops, set and sharding, got {entry!r}"))
            continue
        for key in entry:
            if key not in ("ops", "set", "sharding"):
                problems.append((f"{where}.{key}", "unknown key; expected ops, set or sharding"))
        if "ops" not in entry:
            problems.append((f"{where}.ops", "missing required key"))
            continue
        positions = _op_selection(entry["ops"], graph, f"{where}.ops", problems)
        s_idx = set_index(entry.get("set"), f"{where}.set")
        prefs = entry.get("sharding", "dp")
        prefs = [prefs] if isinstance(prefs, str) else prefs
        if not isinstance(prefs, list) or not prefs or any(p not in STRATEGIES for p in prefs):
            problems.append((f"{where}.sharding", f"expected a strategy or a list of them from {', '.join(STRATEGIES)}, "
                                                  f"got {entry.get('sharding')!r}"))
            prefs = ["none"]
        twice: list[tuple[int, str]] = []  # (position, entry that assigned it first)
        illegal: list[int] = []  # positions no preference of this entry is legal for
        for k in positions:
            if assigned_by[k] is not None:
                twice.append((k, assigned_by[k]))
                continue
            assigned_by[k] = where
            op_set[k] = s_idx
            legal = legal_strategies(graph.ops[graph.compute_ops[k]])
            chosen = next((p for p in prefs if p in legal), None)
            if chosen is None:
                illegal.append(k)
                chosen = "none"
            op_shard[k] = chosen
        if twice:
            ops = [graph.ops[graph.compute_ops[k]].name for k, _ in twice]
            earlier = ", ".join(dict.fromkeys(by for _, by in twice))
            what = f"op {ops[0]!r} is" if len(ops) == 1 else \
                f"{len(ops)} ops ({summarise_names(ops, contiguous=_run(twice))}) are"
            problems.append((f"{where}.ops", f"{what} already assigned by {earlier}; each op belongs to exactly one set"))
        if illegal and len(prefs) == 1:
            ops = [graph.ops[graph.compute_ops[k]].name for k in illegal]
            legal = legal_strategies(graph.ops[graph.compute_ops[illegal[0]]])
            whose = f"op {ops[0]!r}" if len(ops) == 1 else \
                f"{len(ops)} ops ({summarise_names(ops, contiguous=_run([(k, '') for k in illegal]))})"
            problems.append((f"{where}.sharding", f"sharding {prefs[0]!r} is illegal for {whose}; legal for "
                                                  f"{ops[0]}: {', '.join(legal)} (give a list to fall back)"))
    missing = [graph.ops[graph.compute_ops[k]].name for k in range(n) if assigned_by[k] is None]
    if missing and raw_assign:
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        problems.append(("assign", f"{len(missing)} ops are not assigned to any set: {', '.join(missing[:8])}{more}"))
    if raw_assign and not missing and not problems:
        idle = [f"sets[{i}] ({name})" for i, name in enumerate(names) if i not in op_set]
        if idle:
            warn_input(file or "<mapping>", f"{', '.join(idle)} {'gets' if len(idle) == 1 else 'get'} no ops: "
                                            "its devices stay idle")

    overrides = data.get("sharding") or {}
    if not isinstance(overrides, dict):
        problems.append(("sharding", f"expected a mapping of op name to strategy, got {overrides!r}"))
        overrides = {}
    order = {graph.ops[gi].name: k for k, gi in enumerate(graph.compute_ops)}
    for name, strat in overrides.items():
        if name not in order:
            problems.append((f"sharding.{name}", f"unknown op {name!r}"))
        elif strat not in legal_strategies(graph.ops[graph.compute_ops[order[name]]]):
            problems.append((f"sharding.{name}", f"expected one of {', '.join(legal_strategies(graph.op(name)))}, "
                                                 f"got {strat!r}"))
        else:
            op_shard[order[name]] = strat

    micro = data.get("micro_batches", 1)
    if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
        problems.append(("micro_batches", f"expected a positive integer, got {micro!r}"))
        micro = 1
    algo = data.get("collective_algorithm", "auto")
    if algo not in ALGORITHMS:
        problems.append(("collective_algorithm", f"expected one of {', '.join(ALGORITHMS)}, got {algo!r}"))
        algo = "auto"
    if problems:
        raise InputError(file or "<mapping>", problems=problems)

    mapping = Mapping(sets=tuple(sets), op_set=tuple(op_set), op_sharding=tuple(op_shard),  # type: ignore[arg-type]
                      micro_batches=micro, collective_algorithm=algo, system=str(data.get("system", "")),
                      workload=str(data.get("workload", graph.spec)), set_names=tuple(names))
    return validate_mapping(mapping, graph, system, file)


def mapping_to_dict(mapping: Mapping, graph: Graph) -> dict[str, Any]:
    """The canonical YAML-ready form: runs of ops with the same set and sharding as ranges."""
    names = [graph.ops[gi].name for gi in graph.compute_ops]
    set_names = list(mapping.set_names) if len(mapping.set_names) == len(mapping.sets) else []
    assign = []
    k = 0
    while k < len(names):
        j = k
        while (j + 1 < len(names) and mapping.op_set[j + 1] == mapping.op_set[k]
               and mapping.op_sharding[j + 1] == mapping.op_sharding[k]):
            j += 1
        s = mapping.op_set[k]
        assign.append({"ops": names[k] if j == k else f"{names[k]} .. {names[j]}",
                       "set": set_names[s] if set_names else s, "sharding": mapping.op_sharding[k]})
        k = j + 1
    sets = []
    for i, s in enumerate(mapping.sets):
        entry: dict[str, Any] = {}
        if set_names:
            entry["name"] = set_names[i]
        entry["devices"] = list(s.devices)
        entry["design"] = s.design
        sets.append(entry)
    return {"system": mapping.system, "workload": mapping.workload or graph.spec,
            "micro_batches": mapping.micro_batches, "collective_algorithm": mapping.collective_algorithm,
            "sets": sets, "assign": assign}


def save_mapping(mapping: Mapping, graph: Graph, path: str | Path) -> Path:
    """Write the mapping as YAML (atomically). A system given by absolute path is written
    relative to the mapping file, so the pair can be moved together."""
    data = mapping_to_dict(mapping, graph)
    data["system"] = relative_system_ref(data["system"], path)
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110)
    with atomic_file(path) as handle:
        handle.write(text)
    return Path(path)


def mapping_inputs(data: dict, path: str | Path, system: System | str | None = None,
                   workload: Graph | str | None = None, batch: int | None = None) -> tuple[Graph, System]:
    """The graph and system a mapping file (parsed as ``data``, read from ``path``) names;
    ``system``/``workload``/``batch`` override them. Raises InputError for a missing one."""
    file = str(path)
    if system is None:
        ref = data.get("system")
        if not isinstance(ref, str) or not ref:
            raise InputError(file, "system", "missing; expected the system file the mapping was made for (or pass --system)")
        system = load_system(resolve_mapping_system(ref, path))
    elif isinstance(system, str):
        system = load_system(system)
    if workload is None:
        spec = data.get("workload")
        if not isinstance(spec, str) or not spec:
            raise InputError(file, "workload", "missing; expected a workload spec like 'resnet50:batch=8' (or pass --workload)")
        graph = load_workload(spec, batch=batch)
    elif isinstance(workload, str):
        graph = load_workload(workload, batch=batch)
    else:
        graph = workload
    return graph, system


def load_mapping(path: str | Path, *, system: System | str | None = None, workload: Graph | str | None = None,
                 batch: int | None = None) -> tuple[Mapping, Graph, System]:
    """Load a mapping file with the system and workload it names (``system``/``workload``/
    ``batch`` override them). Returns ``(mapping, graph, system)``; raises InputError. (A file
    with a ``parallel:`` section is a parallel configuration: :func:`marssim.plan.load_plan`.)"""
    file = str(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise InputError.expected(file, "", "a mapping with keys system, workload, sets and assign", data)
    if "parallel" in data:
        raise InputError(file, "parallel", "a parallel configuration is no per-op mapping; load it with "
                                           "marssim.plan.load_plan")
    graph, system = mapping_inputs(data, path, system, workload, batch)
    mapping = mapping_from_dict(data, graph, system, file)
    mapping = mapping.with_(system=canonical_system_ref(system), workload=graph.spec)
    return mapping, graph, system
