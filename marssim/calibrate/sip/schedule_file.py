"""The tuned-schedule file: a small JSON document that re-applies a schedule to the same cubin.

It names the cubin by SHA-256, the kernel, the architecture and the instruction count, and holds
the swaps (slot positions, applied in turn from the original order, each legal when applied),
the resulting permutation and the legality options the swaps were checked under (``legality``;
absent in files written before the options existed, which are replayed under the model they
were tuned with, ``latency="table-only"``). ``provenance`` records
how it was found: tool versions, device, seeds, steps, annealing parameters, measured times and
the number of samples verified.

:func:`apply_schedule` checks the hash, the kernel and every swap's legality before writing the
patched cubin atomically.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marssim.errors import InputError
from marssim.fsutil import atomic_file

from .cubin import Cubin, read_cubin
from .deps import Legality, LegalityOptions
from .perturb import patch_for, replay
from .sass import disassemble

__all__ = ["ScheduleFile", "load_schedule", "save_schedule", "apply_schedule", "FORMAT"]

FORMAT = "marssim-sip-schedule"
VERSION = 1


@dataclass(frozen=True)
class ScheduleFile:
    """A tuned schedule for one kernel of one cubin."""

    cubin_sha256: str
    kernel: str
    arch: str
    instructions: int
    swaps: tuple[int, ...]
    order: tuple[int, ...]
    provenance: Mapping[str, Any] = field(default_factory=dict)
    legality: LegalityOptions = LegalityOptions()

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "cubin_sha256": self.cubin_sha256, "kernel": self.kernel,
                "arch": self.arch, "instructions": self.instructions, "swaps": list(self.swaps),
                "order": list(self.order), "legality": self.legality.to_json(), "provenance": dict(self.provenance)}

    def moved(self) -> int:
        """How many instructions are not in their original slot."""
        return sum(1 for slot, idx in enumerate(self.order) if slot != idx)


def save_schedule(schedule: ScheduleFile, path: str | Path) -> None:
    """Write ``schedule`` as JSON, atomically."""
    with atomic_file(path) as fh:
        json.dump(schedule.to_json(), fh, indent=1, sort_keys=False)
        fh.write("\n")


def _expect(doc: Mapping[str, Any], key: str, kind: type, path: str) -> Any:
    if key not in doc:
        raise InputError(path, key, "missing")
    value = doc[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InputError.expected(path, key, kind.__name__, value)
    return value


def load_schedule(path: str | Path) -> ScheduleFile:
    """Read and validate a schedule file (:class:`InputError` naming the key on any problem)."""
    p = str(path)
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as err:
        raise InputError(p, "", f"cannot read: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise InputError(p, "", f"expected JSON: {err}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(p, "format", f"expected {FORMAT!r}")
    if doc.get("version") != VERSION:
        raise InputError.expected(p, "version", str(VERSION), doc.get("version"))
    n = _expect(doc, "instructions", int, p)
    swaps = _expect(doc, "swaps", list, p)
    order = _expect(doc, "order", list, p)
    for i, s in enumerate(swaps):
        if not isinstance(s, int) or isinstance(s, bool) or not 0 <= s < n - 1:
            raise InputError.expected(p, ("swaps", i), f"a slot in 0..{n - 2}", s)
    if sorted(order) != list(range(n)) or not all(isinstance(x, int) for x in order):
        raise InputError(p, "order", f"expected a permutation of 0..{n - 1}")
    legality = doc.get("legality", {"latency": "table-only"})
    try:
        options = LegalityOptions(**legality) if isinstance(legality, dict) else None
    except (TypeError, ValueError) as err:
        raise InputError(p, "legality", f"expected latency, reuse and commit_group options: {err}") from None
    if options is None:
        raise InputError.expected(p, "legality", "an object", legality)
    return ScheduleFile(_expect(doc, "cubin_sha256", str, p), _expect(doc, "kernel", str, p),
                        _expect(doc, "arch", str, p), n, tuple(swaps), tuple(order),
                        dict(doc.get("provenance") or {}), options)


def check_against(schedule: ScheduleFile, cubin: Cubin, schedule_path: str = "") -> None:
    """Raise :class:`InputError` unless ``schedule`` was made for ``cubin``."""
    if cubin.sha256 != schedule.cubin_sha256:
        raise InputError(cubin.path, "", f"sha256 {cubin.sha256[:16]}... differs from the schedule's "
                                         f"{schedule.cubin_sha256[:16]}... ({schedule_path}): not the cubin it was tuned on")
    kernel = cubin.kernel(schedule.kernel)
    if kernel.count != schedule.instructions:
        raise InputError(schedule_path, "instructions", f"the cubin's {schedule.kernel} has {kernel.count}")


def apply_schedule(schedule: ScheduleFile, cubin: Cubin, out: str | Path | None = None,
                   schedule_path: str = "") -> bytes:
    """Replay the schedule's swaps on ``cubin`` (each checked for legality), confirm they reach
    the stored order, and return the patched bytes (also written atomically to ``out``)."""
    check_against(schedule, cubin, schedule_path)
    listing = disassemble(cubin, schedule.kernel)[schedule.kernel]
    legality = Legality(listing, schedule.legality)
    try:
        order = replay(legality, schedule.swaps)
    except ValueError as err:
        raise InputError(schedule_path, "swaps", str(err)) from None
    if order != schedule.order:
        raise InputError(schedule_path, "order", "the swaps do not lead to the stored order")
    data = patch_for(legality, cubin, order)
    if out is not None:
        with atomic_file(out, "wb") as fh:
            fh.write(data)
    return data


def apply_file(schedule_path: str | Path, cubin_path: str | Path, out: str | Path) -> ScheduleFile:
    """Read both files, apply, write ``out``; returns the schedule."""
    schedule = load_schedule(schedule_path)
    apply_schedule(schedule, read_cubin(cubin_path), out, str(schedule_path))
    return schedule


def new_schedule(cubin: Cubin, kernel: str, swaps: Sequence[int], order: Sequence[int],
                 provenance: Mapping[str, Any], legality: LegalityOptions = LegalityOptions()) -> ScheduleFile:
    """A :class:`ScheduleFile` for ``kernel`` of ``cubin``."""
    return ScheduleFile(cubin.sha256, kernel, cubin.arch, cubin.kernel(kernel).count, tuple(swaps), tuple(order),
                        dict(provenance), legality)
