"""A module imported on first use: ``pd = lazy_module("pandas")`` at the top of a module keeps a
heavy library out of the processes that never touch it (an estimate or a lowering does not read a
DataFrame), while ``pd.DataFrame`` works as after ``import pandas as pd``."""

from __future__ import annotations

import importlib
import types
from typing import Any

__all__ = ["lazy_module"]


class _LazyModule(types.ModuleType):
    """Stands for the module ``__name__``; imports it when an attribute is first read."""

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self.__name__)
        value = getattr(module, attr)
        setattr(self, attr, value)  # later reads skip the lookup
        return value


def lazy_module(name: str) -> types.ModuleType:
    """A stand-in for module ``name`` that imports it (once, through ``importlib``) when one of
    its attributes is first read."""
    return _LazyModule(name)
