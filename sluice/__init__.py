"""Sluice's client side. `from sluice import Client, ClientError` is the Python client (docs/python-client.md).

They load on first use: `import sluice` imports no grpc, so an entry point can still tune the process
before grpc loads (sluice.process).
"""
from __future__ import annotations

import importlib

__all__ = ["Client", "ClientConfig", "ClientError", "ConfigError"]
_HOMES = {"Client": "sluice.client", "ClientError": "sluice.client", "ClientConfig": "sluice.config",
          "ConfigError": "sluice.config"}


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'sluice' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
