"""Shared fixtures (helpers live in support.py)."""

from __future__ import annotations

import pytest

from marssim.cost import default_cost_model
from marssim.system import load_system
from support import RooflineCost


@pytest.fixture
def roofline() -> RooflineCost:
    return RooflineCost()


@pytest.fixture(scope="session")
def cost():
    """The default cost model (the shipped measured tables), fitted once for the session."""
    return default_cost_model()


@pytest.fixture(scope="session")
def dgx():
    """One DGX H100 node."""
    return load_system("dgx-h100")
