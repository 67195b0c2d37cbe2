"""Figures of a simulation result (placeholder replaced below)."""
