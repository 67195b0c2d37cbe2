"""A mapping with the name it is reported under: a file stem or a sample id, and its family."""

from __future__ import annotations

from dataclasses import dataclass

from .model import Mapping

__all__ = ["NamedMapping"]


@dataclass(frozen=True)
class NamedMapping:
    """A mapping with the name it is reported under (file stem or sample id) and its family
    (``given`` for a file; see :data:`marssim.search.sample.FAMILIES` for sampled ones)."""

    name: str
    mapping: Mapping
    family: str = "given"
