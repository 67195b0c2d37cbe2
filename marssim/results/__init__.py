"""One results layer for both evaluators: what a schedule of a TaskGraph on a System (start and
end of every task) amounts to, whether a simulation or an analytical estimate produced it.

* :mod:`.aggregate`: bytes per resource and energy (compute and communication), added up once;
* :mod:`.summary`: makespan, steady-state throughput and energy (what searches rank);
* :mod:`.schedule`: a critical path, busy time per device;
* :mod:`.groups`: layer groups (transformer blocks, ResNet blocks or stages) from op names;
* :mod:`.report`: per op and per layer group: critical-path latency and its share of the
  makespan, busy time per device, bytes moved, compute and communication energy, the cost model;
* :mod:`.timelines`: memory occupancy and link usage of a contention-free schedule;
* :mod:`.build`: the :class:`Result` (interval log, per-resource tables, the report).
"""

from .aggregate import communication_energy, compute_energy, resource_bytes, transfer_energy
from .build import Spill, build_result
from .groups import layer_groups
from .report import GROUP_COLUMNS, OP_COLUMNS, format_layers, group_table, op_device_table, op_table
from .result import INTERVAL_COLUMNS, Result
from .schedule import busy_time, critical_path
from .summary import Summary, steady_throughput, summarise, total_energy
from .timelines import buffer_timeline, flow_timeline

__all__ = ["Result", "INTERVAL_COLUMNS", "Spill", "build_result", "Summary", "summarise", "steady_throughput",
           "total_energy", "resource_bytes", "compute_energy", "communication_energy", "transfer_energy",
           "critical_path", "busy_time", "layer_groups", "op_table", "group_table", "op_device_table", "format_layers",
           "OP_COLUMNS", "GROUP_COLUMNS", "buffer_timeline", "flow_timeline"]
