"""Collectives as NCCL runs them: the measured data and the model.

* :mod:`~marssim.collectives.measured`: the measured-collective tables of ``traces/collectives/``
  (converters from published data, interpolation, the achieved efficiency fitted to them);
* :mod:`~marssim.collectives.nccl`: NCCL's own tuning model as pure functions (algorithm and
  protocol choice, bandwidths, latencies, predicted time);
* :mod:`~marssim.collectives.plan`: :func:`plan_collective`, the function a lowering calls: the
  algorithm, protocol, steps, wire bytes per step and step latency of a collective on a group of a
  system (:func:`system_info`), timed from measurements where they exist;
* :mod:`~marssim.collectives.flows`: a plan as point-to-point flows in a TaskGraph.
"""

from .measured import CollectiveRow, load_collective_tables, load_collectives
from .nccl import NcclFabric, choose
from .plan import CollectivePlan, SystemInfo, plan_collective, system_info

__all__ = ["CollectivePlan", "SystemInfo", "plan_collective", "system_info", "NcclFabric", "choose", "CollectiveRow",
           "load_collectives", "load_collective_tables"]
