"""A fake Kubernetes API server (the real REST wire format over HTTP on loopback) for the agent's tests."""
from tests.fakekube.server import EXIT_CODE_ANNOTATION, RUN_SECONDS_ANNOTATION, ApiError, FakeKube

__all__ = ["EXIT_CODE_ANNOTATION", "RUN_SECONDS_ANNOTATION", "ApiError", "FakeKube"]
