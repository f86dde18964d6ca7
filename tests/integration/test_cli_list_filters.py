"""`sluice list` filters by user, cluster and name as the console's jobs table does (Jobs.List)."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.test_cli import base_env
from tests.integration.test_spine import job_doc, wait_final


def test_list_filters_by_user_cluster_and_name(system, tmp_path):
    c = system.client
    ids = c.submit([job_doc(name="Sweep-A", duration="0.2s"), job_doc(name="sweep-b", duration="0.2s"),
                    job_doc(name="other", duration="0.2s", placement={"sites": ["edge-1"]})])
    wait_final(c, ids)
    config = tmp_path / "client.yaml"
    config.write_text(f"address: {system.dispatcher.address}\ntoken: {system.admin_token}\nca: {system.tls.ca}\n")
    env = {**base_env(tmp_path), "SLUICE_CONFIG": str(config)}

    def listed(*args: str) -> list[int]:
        done = subprocess.run([sys.executable, "-m", "sluice", "list", "-o", "json", *args], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return [job["id"] for job in json.loads(done.stdout)]

    assert listed("--name", "SWEEP") == ids[:2]
    assert listed("--cluster", "edge") == [ids[2]]
    assert listed("--user", "admin", "--name", "other") == [ids[2]]
    assert listed("--user", "nobody") == []
