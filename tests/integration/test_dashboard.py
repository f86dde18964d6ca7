"""The Grafana dashboard (deploy/monitoring/sluice-dashboard.json) and the alert rules against a real Prometheus
scraping a real dispatcher (`sluice up --prometheus`'s): every panel's query parses and returns series, every
variable has values, and Prometheus evaluates every alert rule without an error."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import shutil
import sys
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from tests.integration.scenarios import cluster, job, queue, wait_for
from tests.integration.test_burst import CLASSES, policy

MONITORING = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
_spec = importlib.util.spec_from_file_location("sluice_dashboard", MONITORING / "dashboard.py")
dashboard = sys.modules["sluice_dashboard"] = importlib.util.module_from_spec(_spec)  # its dataclasses look it up
_spec.loader.exec_module(dashboard)

OBJECTS = (CLASSES.replace("after: 3s", "after: 0s")
           + queue("org", guaranteed={"cpu": "4"}, max={"cpu": "12"}) + queue("team", parent="org")
           + cluster("onprem", 4) + cluster("cloud", 8, tier="cloud", site="cloud-1", price={"cpu": 0.05})
           + policy(after="0s", budget={"perDay": 10.0, "perHour": 2.0}))
# The dashboard's variables as a user leaves them, and Grafana's rate window at a 1 s scrape interval.
VARIABLES = {"$queue": ".*", "$cluster": ".*", "$resource": "cpu", "$__rate_interval": "1m"}


def test_the_dashboard_json_is_what_its_script_writes():
    assert (MONITORING / "sluice-dashboard.json").read_text() == dashboard.rendered(), \
        "run `python deploy/monitoring/dashboard.py`"
    shown = json.loads(dashboard.rendered())
    queries = [t["expr"] for p in shown["panels"] for t in p.get("targets", [])]
    used = {v for expr in queries for v in re.findall(r"\$\w+", expr)}
    assert used <= set(VARIABLES), used - set(VARIABLES)
    assert {v["name"] for v in shown["templating"]["list"]} == {"datasource", "queue", "cluster", "resource"}


def query(url: str, expr: str) -> list:
    """An instant query's result; a query Prometheus cannot parse or run fails with its error."""
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=10) as r:
        reply = json.load(r)
    assert reply["status"] == "success", (expr, reply)
    return reply["data"]["result"]


@pytest.fixture
def watched(db_url, tmp_path):
    """A dispatcher with sim clusters, scraped every second by a real Prometheus that loads the alert rules."""
    if shutil.which("prometheus") is None:
        pytest.skip("needs the prometheus binary (Debian: apt-get install prometheus)")
    from devstack.embedded import Embedded, UpSettings
    from sluice.client import Client
    from sluice.objects import load_objects

    embedded = Embedded(UpSettings(data_dir=tmp_path / "data", listen="127.0.0.1:0", make_default=False,
                                   database_url=db_url, sim_time_scale=0.05, prometheus=True),
                        load_objects(OBJECTS, source="test_dashboard")).start()
    try:
        embedded.wait_connected()
        embedded.client = Client(embedded.client_settings(timeout_s=30))
        yield embedded
        embedded.client.close()
    finally:
        embedded.stop()


def test_every_panel_returns_series_and_every_alert_rule_evaluates(watched):
    c, url = watched.client, watched.prometheus.url
    wait_for(lambda: query(url, 'up{job="sluice-dispatcher"} == 1'), 30, "Prometheus scraping the dispatcher")
    # Work for every panel: jobs running, one waiting, a burst to the paid cluster, finished ones, a refused submit.
    done = c.submit([job("team", "1", "1s", name="short") for _ in range(2)])
    fillers = c.submit([job("team", "1", "600s", name="filler") for _ in range(4)])
    wait_for(lambda: all(c.get(i)["state"] == "RUNNING" for i in fillers), 30, "on-prem full")
    [burst] = c.submit([job("team", "2", "600s", name="burst", maxRuntime="1h")])
    wait_for(lambda: c.get(burst)["state"] == "RUNNING", 30, "the burst running on the cloud")
    waiting = c.submit([job("team", "8", "1s", name="waits", serviceClass="batch")])
    try:
        c.submit([job("no-such-queue", "1", "1s")])
    except Exception:
        pass
    wait_for(lambda: all(c.get(i)["state"] == "SUCCEEDED" for i in done), 30, "the short jobs done")
    time.sleep(3)  # a few more scrapes after all of it

    panels = [p for p in json.loads(dashboard.rendered())["panels"] if p["type"] != "row"]
    empty = []
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            if not query(url, expr):
                empty.append(f"{panel['title']}: {expr}")
    assert not empty, "panels with no series:\n" + "\n".join(empty)
    for variable in json.loads(dashboard.rendered())["templating"]["list"][1:]:
        metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["definition"]).groups()
        assert {s["metric"].get(label) for s in query(url, metric)} - {None}, variable["name"]

    with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=10) as r:
        groups = json.load(r)["data"]["groups"]
    rules = [rule for g in groups for rule in g["rules"]]
    written = yaml.safe_load((MONITORING / "alerts.yaml").read_text())["groups"]
    assert sorted(r["name"] for r in rules) == sorted(r["alert"] for g in written for r in g["rules"])
    wait_for(lambda: all(r.get("lastEvaluation", "").startswith("20") for r in rules_now(url)), 15,
             "every rule evaluated")
    assert [r["name"] for r in rules_now(url) if r["health"] != "ok"] == []
    c.cancel(fillers + [burst] + waiting)


def rules_now(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=10) as r:
        return [rule for g in json.load(r)["data"]["groups"] for rule in g["rules"]]
