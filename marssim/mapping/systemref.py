"""How a plan file names its system: a shipped system by its name, any other by its path
(written relative to the file, so the pair can be moved together), and the name read back as a
loadable path. Shared by the :class:`~.model.Mapping` builders and the mapping files (:mod:`.io`)."""

from __future__ import annotations

import os
from pathlib import Path

from marssim.system import System, shipped_systems

__all__ = ["canonical_system_ref", "relative_system_ref", "resolve_mapping_system"]


def canonical_system_ref(system: System) -> str:
    """How a mapping names its system: a shipped system by its stem, any other by absolute path."""
    if not system.path:
        return system.name
    path = Path(system.path).resolve()
    for shipped in shipped_systems():
        if shipped.resolve() == path:
            return system.spec if system.spec.split(":")[0] == shipped.stem else shipped.stem
    return str(path)


def relative_system_ref(ref: str, path: str | Path) -> str:
    """A system reference as a file at ``path`` writes it: an absolute path relative to the file
    (so the pair can be moved together), anything else as it is."""
    if ref and Path(ref).is_absolute():
        return os.path.relpath(ref, Path(path).resolve().parent)
    return ref


def resolve_mapping_system(system_ref: str, mapping_file: str | Path | None) -> str:
    """A mapping's ``system:`` value as a loadable path: relative to the mapping file if such a
    file exists, else as given (a path from the working directory or a shipped name)."""
    if mapping_file is not None and system_ref:
        candidate = Path(mapping_file).parent / system_ref
        if candidate.exists():
            return str(candidate)
    return system_ref
