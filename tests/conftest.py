"""Shared fixtures (helpers live in support.py)."""

from __future__ import annotations

import pytest

from support import RooflineCost


@pytest.fixture
def roofline() -> RooflineCost:
    return RooflineCost()
