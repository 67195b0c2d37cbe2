"""The mappings a validation evaluates when read from a directory (sampled ones come from
:func:`marssim.search.sample.sample_mappings`) and a user's own estimates (CSV, per mapping or per
layer), checked with precise errors."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path


from marssim.errors import InputError
from marssim.system import System
from marssim.workload import Graph

from .records import NamedMapping, UserEstimates, resolve_name

__all__ = ["load_mapping_dir", "read_estimates", "check_estimates"]


def load_mapping_dir(directory: str | Path, graph: Graph, system: System) -> list[NamedMapping]:
    """Every ``*.yaml``/``*.yml`` mapping in ``directory`` (sorted by name), loaded for ``graph``
    on ``system`` and named by its file stem. Raises InputError for an empty or missing
    directory or a bad file."""
    from marssim.mapping import load_mapping

    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(str(directory), "--mappings", "expected a directory of mapping YAML files")
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    if not files:
        raise InputError(str(directory), "--mappings", "no *.yaml mapping files in the directory")
    out = []
    for path in files:
        mapping, _, _ = load_mapping(path, system=system, workload=graph)
        out.append(NamedMapping(path.stem, mapping, "given"))
    return out


def read_estimates(path: str | Path) -> UserEstimates:
    """Read a user's estimates CSV: columns ``mapping`` and ``makespan_s`` (one row per mapping,
    named by file stem, sample name or key prefix), or ``op`` and ``time_s`` (one row per layer,
    with an optional ``mapping`` column; without it a row applies to every mapping). Raises
    InputError naming the file, the row and the column for a missing column, an empty or
    repeated name, or a value that is not a non-negative number of seconds."""
    file = str(path)
    from marssim.limits import MAX_CSV_BYTES, check_file_size

    check_file_size(path, MAX_CSV_BYTES, "an estimates table")
    try:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            header = [h.strip() for h in (reader.fieldnames or [])]
            records = list(reader)
    except FileNotFoundError:
        raise InputError(file, "--estimates", "no such file") from None
    except (UnicodeDecodeError, csv.Error) as err:
        raise InputError(file, "--estimates", f"not a readable CSV file ({err})") from None
    cols = set(header)
    if {"op", "time_s"} <= cols:
        kind, name_col, value_col = "layer", "op", "time_s"
    elif {"mapping", "makespan_s"} <= cols:
        kind, name_col, value_col = "mapping", "mapping", "makespan_s"
    else:
        raise InputError(file, "header", "expected columns 'mapping,makespan_s' (per mapping) or 'op,time_s' "
                                         f"(per layer, optional 'mapping'); got {', '.join(header) or 'none'}")
    makespan: dict[str, float] = {}
    layers: list[tuple[str, str, float, int]] = []
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(records, start=1):
        row = {(k or "").strip(): (v or "").strip() if isinstance(v, str) else "" for k, v in raw.items()}
        name = row.get(name_col, "")
        if not name:
            raise InputError(file, f"row {i}.{name_col}", f"expected a{'n op' if kind == 'layer' else ' mapping'} name, "
                                                          "got an empty cell")
        text = row.get(value_col, "")
        try:
            value = float(text)
        except ValueError:
            raise InputError(file, f"row {i}.{value_col}", f"expected a number of seconds, got {text!r}") from None
        if not math.isfinite(value) or value < 0:
            raise InputError(file, f"row {i}.{value_col}", f"expected a non-negative number of seconds, got {text!r}")
        if kind == "mapping":
            if name in makespan:
                raise InputError(file, f"row {i}.mapping", f"mapping {name!r} appears twice")
            makespan[name] = value
        else:
            ref = row.get("mapping", "")
            if (ref, name) in seen:
                raise InputError(file, f"row {i}.op", f"op {name!r} appears twice" + (f" for {ref!r}" if ref else ""))
            seen.add((ref, name))
            layers.append((ref, name, value, i))
    if not makespan and not layers:
        raise InputError(file, "rows", "no estimates in the file")
    return UserEstimates(file, kind, makespan, tuple(layers))


def check_estimates(estimates: UserEstimates, mappings: Sequence[NamedMapping], graph: Graph) -> None:
    names = [m.name for m in mappings]
    by_key = {m.mapping.key: m.name for m in mappings}

    def known(ref: str) -> bool:
        return resolve_name(ref, names, by_key) is not None

    sample = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
    if estimates.kind == "mapping":
        for i, ref in enumerate(estimates.makespan, start=1):
            if not known(ref):
                raise InputError(estimates.file, f"row {i}.mapping",
                                 f"unknown mapping {ref!r}; expected a mapping name ({sample}) or key prefix")
        return
    ops = {graph.ops[i].name for i in graph.compute_ops}
    for ref, op, _, row in estimates.layers:
        if ref and not known(ref):
            raise InputError(estimates.file, f"row {row}.mapping",
                             f"unknown mapping {ref!r}; expected a mapping name ({sample}) or key prefix")
        if op not in ops:
            raise InputError(estimates.file, f"row {row}.op", f"unknown op {op!r}; expected an op of {graph.name}")
