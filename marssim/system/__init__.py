"""Systems: accelerator designs, accelerators, hosts, switches, links; YAML loading; routes."""

from .design import DATAFLOWS, SYSTOLIC_DATAFLOWS, Design, DesignEnergy, GpuSpec
from .load import expand_ids, load_system, resolve_system, shipped_systems, system_from_dict, topologies_dir
from .model import Accelerator, Host, Link, Memory, Route, Switch, System

__all__ = [
    "DATAFLOWS", "SYSTOLIC_DATAFLOWS", "Design", "DesignEnergy", "GpuSpec",
    "expand_ids", "load_system", "resolve_system", "shipped_systems", "system_from_dict", "topologies_dir",
    "Accelerator", "Host", "Link", "Memory", "Route", "Switch", "System",
]
