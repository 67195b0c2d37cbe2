"""Read a system from YAML, validate it, and report every problem with its key path.

File layout (every dimensioned value takes its unit: ``"450 GB/s"``, ``"80 GiB"``, ``"0.5 us"``,
``"1.83 GHz"``, ``"1.5 pJ"``; a bare number is refused unless it is 0)::

    name: mars-adaptive-16
    description: ...
    designs:                      # the library of designs, by name
      os32: {dataflow: os, pe_rows: 32, pe_cols: 32, clock: 700 MHz, sram: 1 MiB, sram_bandwidth: 256 GB/s}
    accelerators:                 # "acc[0-15]" expands to acc0..acc15
      - {id: "acc[0-15]", designs: [os32, ws32, rs16], memory: {capacity: 4 GiB, bandwidth: 64 GB/s}}
    hosts:
      - {id: host0, dram: {capacity: 256 GiB, bandwidth: 100 GB/s}}
    switches:
      - {id: sw0, latency: 100 ns, bandwidth: 1 TB/s}     # bandwidth (backplane) optional
    links:
      - {between: [host0, sw0], bandwidth: 32 GB/s, latency: 1 us}
      - {pattern: ring, nodes: "acc[0-7]", bandwidth: 50 GB/s, latency: 500 ns}
      - {pattern: mesh, nodes: "chip[0-15]", rows: 4, cols: 4, bandwidth: 100 GB/s}
      - {pattern: star, hub: sw0, nodes: "acc[0-15]", bandwidth: 25 GB/s, energy_per_byte: 8 pJ/B}

A link's optional ``energy_per_byte`` (``"8 pJ/B"``, ``"1 pJ/bit"``) is what carrying one byte
across it costs; transfers are charged it per link they cross (communication energy).

Link patterns: ``ring`` (closed), ``chain`` (open), ``mesh`` (rows x cols, row-major; ``wrap:
true`` for a torus), ``star`` (every node to ``hub``), ``full`` (every pair).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from marssim.errors import InputError
from marssim.schema import problems_from_validation, read_yaml
from marssim.specs import format_spec, split_spec

from .cluster import ClusterSpec, expand_cluster
from .design import Design
from .model import Accelerator, Host, Link, Memory, Switch, System
from .params import apply_parameters
from .quantities import FILE_CONTEXT, Bandwidth, EnergyPerByte, Seconds

__all__ = ["load_system", "system_from_dict", "expand_ids", "topologies_dir", "shipped_systems", "resolve_system"]

_STRICT = ConfigDict(extra="forbid", frozen=True)
MAX_RANGE = 100_000
"""The most nodes an id range (``acc[0-99]``) or a ``count`` may name."""
_RANGE = re.compile(r"^(?P<pre>[^\[\]]*)\[(?P<lo>\d+)-(?P<hi>\d+)\](?P<post>[^\[\]]*)$")


def expand_ids(spec: str | list[str]) -> list[str]:
    """Expand ``"acc[0-3]"`` to ``["acc0", "acc1", "acc2", "acc3"]``; lists (and comma-separated
    strings, ``"acc[0-3], acc12"``) expand item by item.

    Zero padding follows the lower bound's width (``"c[00-11]"`` gives ``c00 .. c11``).
    Raises ValueError for a malformed range."""
    if isinstance(spec, list):
        out: list[str] = []
        for item in spec:
            out.extend(expand_ids(item))
        return out
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"expected an id or a range like 'acc[0-15]', got {spec!r}")
    if "," in spec:  # "acc[0-3], acc12": a list written as one string
        return expand_ids([part.strip() for part in spec.split(",")])
    spec = spec.strip()
    if any(c.isspace() for c in spec):
        raise ValueError(f"expected an id or a range like 'acc[0-15]' (ids have no spaces; separate several with "
                         f"commas), got {spec!r}")
    if "[" not in spec and "]" not in spec:
        return [spec]
    m = _RANGE.match(spec)
    if not m:
        raise ValueError(f"expected an id or a range like 'acc[0-15]', got {spec!r}")
    lo, hi = int(m["lo"]), int(m["hi"])
    if hi < lo:
        raise ValueError(f"range {spec!r} is empty (upper bound below lower bound)")
    if hi - lo + 1 > MAX_RANGE:
        raise ValueError(f"range {spec!r} names {hi - lo + 1:,} nodes; expected at most {MAX_RANGE:,} (a system that "
                         "large would take hours to lower and simulate)")
    width = len(m["lo"]) if m["lo"].startswith("0") and len(m["lo"]) > 1 else 0
    return [f"{m['pre']}{i:0{width}d}{m['post']}" for i in range(lo, hi + 1)]


# ----------------------------------------------------------------------------- file schema
class _AcceleratorSpec(BaseModel):
    model_config = _STRICT
    id: str | list[str]
    design: str | None = None
    designs: list[str] | None = None
    memory: Memory
    count: int | None = Field(None, gt=0, le=MAX_RANGE)

    @model_validator(mode="after")
    def _one_design_key(self) -> "_AcceleratorSpec":
        if (self.design is None) == (self.designs is None):
            raise ValueError("give exactly one of 'design' (fixed) or 'designs' (the list it may take)")
        if self.designs is not None and not self.designs:
            raise ValueError("'designs' must list at least one design")
        return self


class _HostSpec(BaseModel):
    model_config = _STRICT
    id: str | list[str]
    dram: Memory


class _SwitchSpec(BaseModel):
    model_config = _STRICT
    id: str | list[str]
    latency: Seconds = 0.0
    bandwidth: Bandwidth | None = None


class _LinkSpec(BaseModel):
    model_config = _STRICT
    between: list[str] | None = Field(None, min_length=2, max_length=2)
    pattern: Literal["ring", "chain", "mesh", "star", "full"] | None = None
    nodes: str | list[str] | None = None
    hub: str | None = None
    rows: int | None = Field(None, gt=0)
    cols: int | None = Field(None, gt=0)
    wrap: bool = False
    bandwidth: Bandwidth
    latency: Seconds = 0.0
    duplex: Literal["full", "half"] = "full"
    energy_per_byte: EnergyPerByte | None = None

    @model_validator(mode="after")
    def _form(self) -> "_LinkSpec":
        if (self.between is None) == (self.pattern is None):
            raise ValueError("give either 'between: [a, b]' or 'pattern:' with 'nodes:'")
        if self.pattern is not None:
            if self.nodes is None:
                raise ValueError(f"pattern {self.pattern!r} needs 'nodes'")
            if self.pattern == "star" and self.hub is None:
                raise ValueError("pattern 'star' needs 'hub'")
            if self.pattern == "mesh" and (self.rows is None or self.cols is None):
                raise ValueError("pattern 'mesh' needs 'rows' and 'cols'")
        return self


class _SystemFile(BaseModel):
    model_config = _STRICT
    name: str
    description: str = ""
    source: str | list[str] = ""
    designs: dict[str, dict[str, Any]] = Field(min_length=1)
    cluster: ClusterSpec | None = None
    accelerators: list[_AcceleratorSpec] = Field(default_factory=list)
    hosts: list[_HostSpec] = Field(default_factory=list)
    switches: list[_SwitchSpec] = Field(default_factory=list)
    links: list[_LinkSpec] = Field(default_factory=list)



# ----------------------------------------------------------------------------- expansion
def _pattern_pairs(spec: _LinkSpec, nodes: list[str]) -> list[tuple[str, str]]:
    n = len(nodes)
    if spec.pattern == "ring":
        if n < 2:
            raise ValueError("a ring needs at least 2 nodes")
        return [(nodes[i], nodes[(i + 1) % n]) for i in range(n if n > 2 else 1)]
    if spec.pattern == "chain":
        return [(nodes[i], nodes[i + 1]) for i in range(n - 1)]
    if spec.pattern == "star":
        return [(spec.hub, node) for node in nodes]  # type: ignore[misc]
    if spec.pattern == "full":
        return [(nodes[i], nodes[j]) for i in range(n) for j in range(i + 1, n)]
    rows, cols = spec.rows or 0, spec.cols or 0
    if rows * cols != n:
        raise ValueError(f"mesh {rows}x{cols} needs {rows * cols} nodes, got {n}")
    pairs = []
    for r in range(rows):
        for c in range(cols):
            here = nodes[r * cols + c]
            if c + 1 < cols or (spec.wrap and cols > 2):
                pairs.append((here, nodes[r * cols + (c + 1) % cols]))
            if r + 1 < rows or (spec.wrap and rows > 2):
                pairs.append((here, nodes[((r + 1) % rows) * cols + c]))
    return pairs


def system_from_dict(data: Any, file: str | None = None, spec: str = "", *, require_units: bool = True) -> System:
    """Validate a parsed system file and build the :class:`System`; raises InputError listing
    every problem with its key path (``links[3].bandwidth: expected a bandwidth ...``).

    ``spec``: how the system was named (kept as ``System.spec``). ``require_units``: every
    dimensioned value needs its unit, as in a file (a bare number other than 0 is refused);
    False takes bare numbers as SI, for dicts built by Python code."""
    context = FILE_CONTEXT if require_units else None
    if isinstance(data, dict) and "parameters" in data:
        data, _ = apply_parameters(data, {}, file or "<system>", file or "<system>")
    if not isinstance(data, dict):
        raise InputError.expected(file, "", "a mapping with keys name, designs, accelerators, hosts, links", data)
    try:
        spec_arg = spec
        spec = _SystemFile.model_validate(data, context=context)
    except ValidationError as exc:
        raise InputError(file, problems=problems_from_validation(exc, (), _SystemFile)) from None

    problems: list[tuple[str, str]] = []
    spec_name = spec_arg
    if spec.cluster is None:
        for key in ("accelerators", "hosts", "links"):
            if not getattr(spec, key):
                problems.append((key, "list should have at least 1 item (or give a 'cluster:' section)"))
        if problems:
            raise InputError(file, problems=problems)

    designs: dict[str, Design] = {}
    for name, body in spec.designs.items():
        if not isinstance(body, dict):
            problems.append((f"designs.{name}", f"expected a mapping of design fields, got {body!r}"))
            continue
        if "name" in body:  # the key under designs: is the name; a second one would disagree with it
            problems.append((f"designs.{name}.name", "unknown key; a design's name is its key under 'designs:'"))
            continue
        try:
            designs[name] = Design.model_validate({"name": name, **body}, context=context)
        except ValidationError as exc:
            problems.extend(problems_from_validation(exc, ("designs", name), Design, hidden=("name",)))

    seen: dict[str, str] = {}

    def claim(node_id: str, where: str) -> bool:
        if node_id in seen:
            problems.append((where, f"duplicate id {node_id!r} (already used at {seen[node_id]})"))
            return False
        seen[node_id] = where
        return True

    bad_ids: list[str] = []  # id fields that did not expand; nodes they meant are unknown for that reason

    def ids_of(raw: str | list[str], where: str) -> list[str]:
        try:
            return expand_ids(raw)
        except ValueError as exc:
            problems.append((where, str(exc)))
            bad_ids.append(where)
            return []

    def unknown_node(key: str, node: str) -> None:
        # Reported once per key and node, and not at all after a malformed id declaration: the node
        # is most likely one that declaration meant, and that problem is already reported.
        item = (key, f"unknown node {node!r}; expected an accelerator, host or switch id")
        if not bad_ids and item not in problems:
            problems.append(item)

    accelerators: list[Accelerator] = []
    hosts: list[Host] = []
    switches: list[Switch] = []
    links: list[Link] = []
    router = None
    if spec.cluster is not None:
        for j, group in enumerate(spec.cluster.node_groups):
            if group.design not in spec.designs:
                problems.append((f"cluster.node_groups[{j}].design",
                                 f"unknown design {group.design!r}; expected one of: {', '.join(spec.designs)}"))
        if not problems:
            accelerators, hosts, switches, links, router = expand_cluster(spec.cluster)
            for node in [a.id for a in accelerators] + [h.id for h in hosts] + [s_.id for s_ in switches]:
                seen[node] = "cluster"
    for i, a in enumerate(spec.accelerators):
        allowed = tuple(a.designs if a.designs is not None else [a.design])  # type: ignore[list-item]
        for j, d in enumerate(allowed):
            if d not in spec.designs:
                key = f"accelerators[{i}].designs[{j}]" if a.designs is not None else f"accelerators[{i}].design"
                problems.append((key, f"unknown design {d!r}; expected one of: {', '.join(spec.designs)}"))
        ids = ids_of(a.id, f"accelerators[{i}].id")
        if a.count is not None:
            if len(ids) != 1 or "{i}" not in ids[0]:
                problems.append((f"accelerators[{i}].count", "expected 'count' only with an id template like 'acc{i}'"))
            else:
                ids = [ids[0].replace("{i}", str(k)) for k in range(a.count)]
        for acc_id in ids:
            if claim(acc_id, f"accelerators[{i}].id"):
                accelerators.append(Accelerator(id=acc_id, designs=allowed, memory=a.memory))

    for i, h in enumerate(spec.hosts):
        for host_id in ids_of(h.id, f"hosts[{i}].id"):
            if claim(host_id, f"hosts[{i}].id"):
                hosts.append(Host(id=host_id, dram=h.dram))

    for i, s in enumerate(spec.switches):
        for sw_id in ids_of(s.id, f"switches[{i}].id"):
            if claim(sw_id, f"switches[{i}].id"):
                switches.append(Switch(id=sw_id, latency=s.latency, bandwidth=s.bandwidth))

    pairs_seen: dict[frozenset[str], str] = {frozenset((ln.a, ln.b)): "cluster" for ln in links}
    for i, spec_link in enumerate(spec.links):
        where = f"links[{i}]"
        if spec_link.between is not None:
            ends = []
            for j, raw in enumerate(spec_link.between):
                ends.append(raw)
            pairs = [(ends[0], ends[1])]
            end_keys = [f"{where}.between[0]", f"{where}.between[1]"]
        else:
            n_bad = len(bad_ids)
            nodes = ids_of(spec_link.nodes, f"{where}.nodes")  # type: ignore[arg-type]
            if len(bad_ids) > n_bad:
                continue
            try:
                pairs = _pattern_pairs(spec_link, nodes)
            except ValueError as exc:
                problems.append((f"{where}.pattern", str(exc)))
                pairs = []
            end_keys = [f"{where}.nodes", f"{where}.nodes"]
            if spec_link.hub is not None and spec_link.hub not in seen:
                unknown_node(f"{where}.hub", spec_link.hub)
                continue
        for a_id, b_id in pairs:
            bad = False
            for node, key in ((a_id, end_keys[0]), (b_id, end_keys[1])):
                if node not in seen:
                    unknown_node(key, node)
                    bad = True
            if bad:
                continue
            if a_id == b_id:
                problems.append((where, f"a link needs two different endpoints, got {a_id!r} twice"))
                continue
            pair = frozenset((a_id, b_id))
            if pair in pairs_seen:
                problems.append((where, f"second link between {a_id} and {b_id} (first at {pairs_seen[pair]}); "
                                        "merge them into one link with the summed bandwidth"))
                continue
            pairs_seen[pair] = where
            links.append(Link(a=a_id, b=b_id, bandwidth=spec_link.bandwidth, latency=spec_link.latency,
                              duplex=spec_link.duplex, energy_per_byte=spec_link.energy_per_byte))

    if problems:
        raise InputError(file, problems=problems)

    system = System(spec.name, designs, tuple(accelerators), tuple(hosts), tuple(switches), tuple(links),
                    path=file, description=spec.description, router=router, spec=spec_name or spec.name)
    _check_connected(system, file, spec)
    return system


def _connected_parts(system: System) -> list[set[str]]:
    """The groups of nodes the links connect (union-find over the links: a cluster of thousands
    of nodes is checked without building its link graph, which routing on a cluster never needs)."""
    parent = {n: n for n in system.nodes}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for link in system.links:
        a, b = root(parent.setdefault(link.a, link.a)), root(parent.setdefault(link.b, link.b))
        if a != b:
            parent[a] = b
    parts: dict[str, set[str]] = {}
    for n in parent:
        parts.setdefault(root(n), set()).add(n)
    return list(parts.values())


def _check_connected(system: System, file: str | None, spec: _SystemFile) -> None:
    """One problem per group of nodes cut off from the rest: every node must reach every other
    (the part with the most accelerators, then the first host, is the system; each other
    connected part is reported once, with the key that declares its first node)."""
    from .describe import compress_ids

    parts = _connected_parts(system)
    if len(parts) == 1:
        return
    order = {n: i for i, n in enumerate(system.nodes)}
    first_host = system.hosts[0].id

    def size(part: set) -> tuple:
        return (-sum(system.is_accelerator(n) for n in part), first_host not in part, min(order[n] for n in part))

    main, *rest = sorted(parts, key=size)
    rest = [p for p in rest if any(system.is_accelerator(n) or system.is_host(n) for n in p)]  # a lone switch is unused
    if not rest:
        return
    where: dict[str, str] = {}
    for i, a in enumerate(spec.accelerators):
        for acc_id in (expand_ids(a.id) if a.count is None else []):
            where.setdefault(acc_id, f"accelerators[{i}].id")
    for i, h in enumerate(spec.hosts):
        for host_id in expand_ids(h.id):
            where.setdefault(host_id, f"hosts[{i}].id")
    for i, sw in enumerate(spec.switches):
        for sw_id in expand_ids(sw.id):
            where.setdefault(sw_id, f"switches[{i}].id")
    problems = []
    for part in rest:
        nodes = sorted(part, key=order.__getitem__)
        groups = []
        for label, test in (("accelerator", system.is_accelerator), ("host", system.is_host),
                            ("switch", lambda n: not system.is_accelerator(n) and not system.is_host(n))):
            ids = [n for n in nodes if test(n)]
            if ids:
                plural = label + ("es" if label == "switch" else "s") if len(ids) > 1 else label
                groups.append(f"{plural} {compress_ids(ids)}")
        verb = "is" if len(nodes) == 1 else "are"
        reach = compress_ids(sorted(main, key=order.__getitem__))
        problems.append((where.get(nodes[0], "links"),
                         f"{' and '.join(groups)} {verb} not connected by any link to the rest of the system "
                         f"({reach})"))
    raise InputError(file, problems=problems)


# ----------------------------------------------------------------------------- files and names
def topologies_dir() -> Path:
    """Directory of the shipped system files: ``$MARSSIM_TOPOLOGIES``, else the ``topologies/``
    that ships with marssim (package data; :func:`marssim.data.topologies`)."""
    env = os.environ.get("MARSSIM_TOPOLOGIES")
    if env:
        return Path(env)
    from marssim.data import topologies

    return topologies()


def shipped_systems() -> list[Path]:
    """The system files shipped in ``topologies/``, sorted by name."""
    d = topologies_dir()
    return sorted(d.glob("*.yaml")) if d.is_dir() else []


def resolve_system(name_or_path: str | Path) -> Path:
    """A path as given when it exists, else a shipped system by its file stem (``dgx-h100``)."""
    p = Path(name_or_path)
    if p.exists():
        return p
    for candidate in shipped_systems():
        if candidate.stem == str(name_or_path) or candidate.name == str(name_or_path):
            return candidate
    names = ", ".join(c.stem for c in shipped_systems())
    raise InputError(str(name_or_path), "", f"no such system file; expected a path or one of the shipped systems: {names}")


def load_system(name_or_path: str | Path) -> System:
    """Load and validate a system file (a path, or the stem of a shipped topology), with
    parameters after a colon where the file declares them (``dgx-h100-cluster:nodes=128``)."""
    text = str(name_or_path)
    spec = split_spec(text) if not Path(text).exists() else None
    name, given = (spec.name, spec.params) if spec is not None else (text, {})
    path = resolve_system(name)
    data = read_yaml(path)
    data, changed = apply_parameters(data, given, str(path), text)
    stem = path.stem if any(p.resolve() == path.resolve() for p in shipped_systems()) else str(path)
    return system_from_dict(data, str(path), spec=format_spec(stem, changed))
