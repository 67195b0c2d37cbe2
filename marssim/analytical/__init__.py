"""Analytical evaluation of a TaskGraph: a contention-free list schedule, exact where no two flows
share a resource, with a proven lower bound beside it. See :mod:`marssim.analytical.estimate`."""

from .estimate import Estimate, critical_path, estimate, resource_bytes, transfer_durations
from .schedule import BACKENDS, earliest_schedule, have_numba, list_schedule

__all__ = ["Estimate", "estimate", "critical_path", "transfer_durations", "resource_bytes", "list_schedule", "earliest_schedule",
           "BACKENDS", "have_numba"]
