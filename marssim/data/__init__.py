"""Files that ship with marssim, found from any working directory.

* :func:`topologies`: the system files (``*.yaml``) and example mappings (``mappings/*.yaml``):
  the repository's top-level ``topologies/``;
* :func:`calibration`: the measured kernel tables (``*.csv``): the repository's
  ``traces/calibration/``;
* :func:`collectives`: the measured collective tables (``*.csv``): ``traces/collectives/``;
* :func:`host_overheads`: the measured host overheads (``*.csv``): ``traces/host-overheads/``;
* :func:`requests`: the request traces of serving simulations (``*.csv``, with their
  ``README.md`` of source and license): ``traces/requests/``;
* :func:`published`: tables of published measured runs (``*.csv``, their sources in the
  files), the checks of ``marssim validate --published``: ``traces/published/``;
* :func:`attention_kernels`: published forward and backward rates of training stacks' fused
  attention kernels (``*.csv``, their sources in the files; :mod:`marssim.cost.attention_kernels`):
  ``traces/attention-kernels/``;
* :func:`moe_kernels`: measured fused mixture-of-experts kernels of serving engines (``*.csv``,
  every row its source; :mod:`marssim.cost.moe_kernels`): ``traces/moe-kernels/``.

The directories stay where the repository keeps them. The build (``setup.py``) maps the
packages ``marssim.data.topologies``, ``marssim.data.calibration``, ``marssim.data.collectives``,
``marssim.data.host_overheads``, ``marssim.data.requests``, ``marssim.data.published``,
``marssim.data.attention_kernels`` and ``marssim.data.moe_kernels`` onto them, so a wheel
carries them as package data beside this module, where :mod:`importlib.resources` finds them.
In a checkout (an editable install, or the source tree on ``PYTHONPATH``) this package lives in
the repository and the directories are the repository's own.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

__all__ = ["topologies", "calibration", "collectives", "host_overheads", "requests", "published", "attention_kernels",
           "DATA_PACKAGES"]

DATA_PACKAGES = {"marssim.data.topologies": "topologies", "marssim.data.calibration": "traces/calibration",
                 "marssim.data.collectives": "traces/collectives", "marssim.data.host_overheads": "traces/host-overheads",
                 "marssim.data.requests": "traces/requests", "marssim.data.published": "traces/published",
                 "marssim.data.attention_kernels": "traces/attention-kernels",
                 "marssim.data.moe_kernels": "traces/moe-kernels"}
"""Each data package and the repository directory it is built from."""


def _directory(name: str) -> Path:
    """Data directory ``name`` (``topologies``, ``calibration``, ...): package data of an installed
    wheel, else the repository directory it is built from."""
    packaged = importlib.resources.files(__name__).joinpath(name)
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / DATA_PACKAGES[f"{__name__}.{name}"]


def topologies() -> Path:
    """The shipped system files (``*.yaml``) and example mappings (``mappings/*.yaml``)."""
    return _directory("topologies")


def calibration() -> Path:
    """The shipped calibration tables (``*.csv``; see :mod:`marssim.cost.calibrated`)."""
    return _directory("calibration")


def collectives() -> Path:
    """The shipped measured-collective tables (``*.csv``; see :mod:`marssim.collectives.measured`)."""
    return _directory("collectives")


def host_overheads() -> Path:
    """The shipped host-overhead tables (``*.csv``; see :mod:`marssim.cost.host_overheads`)."""
    return _directory("host_overheads")


def requests() -> Path:
    """The shipped request traces (``*.csv``: ``arrival_s,prompt_tokens,output_tokens``; see
    :mod:`marssim.serve.traces`) and their ``README.md``."""
    return _directory("requests")


def published() -> Path:
    """The shipped tables of published measured runs (``*.csv``; see
    :mod:`marssim.validate.published`)."""
    return _directory("published")


def attention_kernels() -> Path:
    """The shipped fused attention kernel sets (``*.csv``; see :mod:`marssim.cost.attention_kernels`)."""
    return _directory("attention_kernels")


def moe_kernels() -> Path:
    """The shipped measured fused mixture-of-experts kernels (``*.csv``; see :mod:`marssim.cost.moe_kernels`)."""
    return _directory("moe_kernels")
