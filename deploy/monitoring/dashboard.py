"""Write the Grafana dashboard of a Sluice dispatcher, deploy/monitoring/sluice-dashboard.json, from the panels below.

The JSON is what Grafana imports (Dashboards > New > Import, or a provisioning directory); this script is
its source: edit the panels here, then run

    python deploy/monitoring/dashboard.py

tests/integration/test_dashboard.py checks the JSON is this script's output and runs every panel's query
against a real Prometheus scraping a real dispatcher. The series are those of docs/metrics.md. The store's
gauges are the same on every replica, so they are aggregated with max; what each replica counts (cycles,
submits, streams) is summed.
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field

OUT = pathlib.Path(__file__).resolve().parent / "sluice-dashboard.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24  # Grafana's grid columns


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 8


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def q(expr: str, legend: str) -> Query:
    return Query(expr, legend)


QUEUE, CLUSTER, RESOURCE = 'queue=~"$queue"', 'cluster=~"$cluster"', 'resource="$resource"'
RATE = "$__rate_interval"

ROWS = (
    Row("Queues", (
        Panel("Queued jobs", "Jobs waiting in each queue.",
              (q(f"sum by (queue) (max by (queue, service_class) (sluice_jobs_queued{{{QUEUE}}}))", "{{queue}}"),)),
        Panel("Running jobs", "Jobs dispatched to or running on a cluster, per queue.",
              (q(f"sum by (queue) (max by (queue, cluster) (sluice_jobs_active{{{QUEUE}}}))", "{{queue}}"),)),
        Panel("Oldest queued job", "How long the oldest queued job of each queue has waited.",
              (q(f"max by (queue) (sluice_queue_oldest_queued_age_seconds{{{QUEUE}}})", "{{queue}}"),), unit="s"),
        Panel("Used, guaranteed and max ($resource)",
              "A queue's use (its own jobs' and the queues' below it) against its guarantee and maximum.",
              (q(f"sum by (queue) (max by (queue, cluster) (sluice_queue_used{{{QUEUE}, {RESOURCE}}}))",
                 "{{queue}} used"),
               q(f"max by (queue) (sluice_queue_guaranteed{{{QUEUE}, {RESOURCE}}})", "{{queue}} guaranteed"),
               q(f"max by (queue) (sluice_queue_max{{{QUEUE}, {RESOURCE}}})", "{{queue}} max")), width=12),
        Panel("Dispatched per second", "Jobs the scheduler dispatched from each queue.",
              (q(f"sum by (queue) (rate(sluice_queue_dispatched_total{{{QUEUE}}}[{RATE}]))", "{{queue}}"),),
              unit="ops", width=12),
    )),
    Row("Clusters", (
        Panel("Free capacity ($resource)", "What each cluster has left, as the scheduler sees it, and what it offers.",
              (q(f'max by (cluster) (sluice_cluster_capacity{{{CLUSTER}, {RESOURCE}, kind="free"}})',
                 "{{cluster}} free"),
               q(f'max by (cluster) (sluice_cluster_capacity{{{CLUSTER}, {RESOURCE}, kind="allocatable"}})',
                 "{{cluster}} allocatable")), width=12),
        Panel("Capacity reading age", "Age of the capacity in use, by its source (prometheus, agent, none).",
              (q(f"max by (cluster, source) (sluice_cluster_capacity_age_seconds{{{CLUSTER}}})",
                 "{{cluster}} ({{source}})"),), unit="s", width=12),
        Panel("Reachable", "1 while the dispatcher hears from the cluster's agent.",
              (q(f"max by (cluster) (sluice_cluster_reachable{{{CLUSTER}}})", "{{cluster}}"),), kind="state-timeline",
              width=12),
        Panel("Commands not acked", "Dispatch and cancel commands each cluster's agent has not acked yet.",
              (q(f"max by (cluster) (sluice_outbox_unacked_commands{{{CLUSTER}}})", "{{cluster}}"),), width=12),
    )),
    Row("Scheduler", (
        Panel("Cycle time", "Duration of a scheduling cycle, its commit included.",
              (q(f"histogram_quantile(0.5, sum by (le) (rate(sluice_scheduling_cycle_seconds_bucket[{RATE}])))", "p50"),
               q(f"histogram_quantile(0.99, sum by (le) (rate(sluice_scheduling_cycle_seconds_bucket[{RATE}])))",
                 "p99")), unit="s"),
        Panel("Decisions per second", "Jobs dispatched, attempts preempted, and jobs a cycle left waiting.",
              (q(f"sum by (decision) (rate(sluice_scheduling_decisions_total[{RATE}]))", "{{decision}}"),),
              unit="ops"),
        Panel("Leader", "Which replica holds the scheduling leader lock (1) and runs the cycles.",
              (q("max by (instance) (sluice_scheduler_leader)", "{{instance}}"),), kind="state-timeline"),
    )),
    Row("Burst spend", (
        Panel("Spend today against the daily budget", "Money each burst policy (and queue under it) committed "
              "this UTC day, and its budget per day.",
              (q("max by (policy, queue) (sluice_burst_spend_today)", "{{policy}} {{queue}} spent"),
               q("max by (policy, queue) (sluice_burst_budget_per_day)", "{{policy}} {{queue}} budget")),
              width=12),
        Panel("Spend rate against the hourly budget", "Money per hour of the bursts running now, and the budget "
              "per hour.",
              (q("max by (policy, queue) (sluice_burst_spend_rate_per_hour)", "{{policy}} {{queue}} rate"),
               q("max by (policy, queue) (sluice_burst_budget_per_hour)", "{{policy}} {{queue}} budget")),
              width=12),
    )),
    Row("Submit and dispatch", (
        Panel("Submit to dispatch", "From a job's submit to its first dispatch.",
              tuple(q(f"histogram_quantile({p}, sum by (le) (rate(sluice_dispatch_latency_seconds_bucket"
                      f'{{phase="submit_to_dispatch"}}[{RATE}])))', f"p{round(p * 100)}") for p in (0.5, 0.95, 0.99)),
              unit="s"),
        Panel("Dispatch to running", "From a dispatch to its attempt running on the cluster.",
              tuple(q(f"histogram_quantile({p}, sum by (le) (rate(sluice_dispatch_latency_seconds_bucket"
                      f'{{phase="dispatch_to_running"}}[{RATE}])))', f"p{round(p * 100)}") for p in (0.5, 0.95)),
              unit="s"),
        Panel("Submits per second", "Submits answered, by outcome: accepted, invalid, refused, failed (the "
              "server's own failures).",
              (q(f"sum by (outcome) (rate(sluice_submit_requests_total[{RATE}]))", "{{outcome}}"),), unit="ops"),
        Panel("Open streams", "Watch, submit and agent streams open, over every replica.",
              (q("sum by (kind) (sluice_streams_open)", "{{kind}}"),), width=12),
        Panel("Database reachable", "1 while each replica's scrape could read Postgres.",
              (q("min by (instance) (sluice_database_up)", "{{instance}}"),), kind="state-timeline", width=12),
    )),
)

VARIABLES = (  # name, label, query, default
    ("queue", "Queue", "label_values(sluice_jobs_queued, queue)", "All"),
    ("cluster", "Cluster", "label_values(sluice_cluster_capacity, cluster)", "All"),
    ("resource", "Resource", "label_values(sluice_cluster_capacity, resource)", "cpu"),
)


def panels() -> list[dict]:
    """Grafana's panels, each row's panels laid out left to right below its row header."""
    out, y, next_id = [], 0, 1
    for row in ROWS:
        out.append({"type": "row", "id": next_id, "title": row.title, "collapsed": False,
                    "gridPos": {"h": 1, "w": WIDTH, "x": 0, "y": y}, "panels": []})
        next_id, y, x = next_id + 1, y + 1, 0
        for panel in row.panels:
            if x + panel.width > WIDTH:
                x, y = 0, y + 8
            out.append({
                "type": panel.kind, "id": next_id, "title": panel.title, "description": panel.description,
                "datasource": DATASOURCE, "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
                "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
                "targets": [{"datasource": DATASOURCE, "expr": query.expr, "legendFormat": query.legend,
                             "refId": chr(ord("A") + n)} for n, query in enumerate(panel.queries)]})
            next_id, x = next_id + 1, x + panel.width
        y += 8
    return out


def dashboard() -> dict:
    variables = [{"type": "datasource", "name": "datasource", "label": "Prometheus", "query": "prometheus",
                  "current": {}, "hide": 0}]
    for name, label, query, default in VARIABLES:
        variables.append({
            "type": "query", "name": name, "label": label, "datasource": DATASOURCE,
            "query": {"query": query, "refId": name}, "definition": query, "refresh": 2, "sort": 1,
            "includeAll": default == "All", "multi": default == "All", "allValue": ".*" if default == "All" else None,
            "current": {"text": default, "value": "$__all" if default == "All" else default}, "hide": 0})
    return {"title": "Sluice dispatcher", "uid": "sluice-dispatcher", "tags": ["sluice"], "editable": True,
            "schemaVersion": 39, "version": 1, "refresh": "30s", "time": {"from": "now-6h", "to": "now"},
            "timezone": "browser", "templating": {"list": variables}, "annotations": {"list": []},
            "panels": panels()}


def rendered() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(rendered())
    print(f"wrote {OUT}")
