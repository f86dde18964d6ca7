"""Cluster backends: what an agent drives to turn an attempt into pods (sim, kubernetes)."""
