"""Fixtures of the integration tests."""
from __future__ import annotations

import pytest

from tests.integration.scenarios import TIME_SCALE, wait_for


@pytest.fixture
def sluice(db_url, tmp_path):
    """start(objects_yaml) -> a running Embedded with a `client`, on this test's database."""
    from devstack.embedded import Embedded, UpSettings
    from sluice.client import Client
    from sluice.objects import load_objects

    started = []

    def start(objects_yaml: str):
        objects = load_objects(objects_yaml, source="test_policy_scenarios")
        embedded = Embedded(UpSettings(data_dir=tmp_path / "data", listen="127.0.0.1:0", make_default=False,
                                       database_url=db_url, sim_time_scale=TIME_SCALE), objects).start()
        started.append(embedded)
        embedded.wait_connected()
        embedded.client = Client(embedded.client_settings(timeout_s=30))
        wait_for(lambda: all(c["state"] == "active" and c["allocatable"] for c in embedded.client.clusters()),
                 10, "every cluster active with capacity")
        return embedded

    yield start
    for embedded in started:
        embedded.client.close()
        embedded.stop()
