"""Client.wait, the one wait for jobs to end (the Python client's, and `sluice submit --wait`'s): every job
as it ended, in the order asked, and a timeout that names the jobs still going."""
from __future__ import annotations

import time

import pytest

from sluice import ClientError


def job(name: str, runs_for: str) -> dict:
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"queue": "default", "podSets": [{"name": "w", "count": 1, "template": {
                "metadata": {"annotations": {"sluice.io/sim-duration": runs_for}},
                "spec": {"containers": [{"name": "m", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}}]}}


def test_wait_returns_every_job_as_it_ended_in_the_order_asked(system):
    client = system.client
    ids = client.submit([job("a", "1s"), job("b", "2s"), job("c", "1s")])
    done = client.wait([ids[2], ids[0], ids[1], ids[0]], timeout_s=60)
    assert [j["id"] for j in done] == [ids[2], ids[0], ids[1], ids[0]]
    assert {j["state"] for j in done} == {"SUCCEEDED"}
    assert client.wait(ids[:1], timeout_s=0) == [client.get(ids[0])]  # ended already: no watch needed


def test_wait_past_its_timeout_names_the_jobs_still_going(system):
    client = system.client
    [quick, slow] = client.submit([job("quick", "0.1s"), job("slow", "1h")])
    started = time.monotonic()
    with pytest.raises(ClientError) as caught:
        client.wait([quick, slow], timeout_s=2)
    assert 2 <= time.monotonic() - started < 10
    assert caught.value.code == "DEADLINE_EXCEEDED"
    assert caught.value.message == f"wait: after 2s, not ended yet: job {slow}"
    client.cancel([slow])
    assert client.wait([slow], timeout_s=10)[0]["state"] == "CANCELLED"
