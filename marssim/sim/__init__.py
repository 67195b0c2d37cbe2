"""The SimPy discrete-event engine: accelerators, max-min fair links, memories."""

from marssim.results.summary import Summary, summarise

from .engine import Schedule, setup_time, simulate, simulate_schedule, simulate_summary
from .memory import POLICIES, MemoryPool
from .network import FairShareNetwork, max_min_rates
from marssim.results.result import INTERVAL_COLUMNS, Result

__all__ = ["simulate", "simulate_summary", "simulate_schedule", "Schedule", "summarise", "Summary", "setup_time", "POLICIES", "MemoryPool",
           "FairShareNetwork", "max_min_rates", "INTERVAL_COLUMNS", "Result"]
