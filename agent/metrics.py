"""The agent's own metrics (served at /metrics by sluice.serving.MetricsServer).

Each Agent has its own private CollectorRegistry: `sluice up` runs several agents in one process, and
the process-wide default registry would mix them (and refuse the second agent's metric names). Every
series carries `cluster`, so one Prometheus can scrape all agents into one table.

Series (prometheus_client also exposes a `_created` timestamp beside each `_total` counter):

    sluice_agent_connected{cluster}                      gauge: 1 while the stream to the dispatcher
                                                         is open and welcomed, else 0
    sluice_agent_attempts_created_total{cluster}         attempts whose objects the backend created
                                                         (a repeated dispatch of an existing one: no)
    sluice_agent_attempts_deleted_total{cluster}         cancel commands whose delete call returned
                                                         (the attempt may already have been gone)
    sluice_agent_commands_applied_total{cluster, kind}   commands applied, kind = dispatch | cancel
    sluice_agent_status_reports_unacked{cluster}         gauge: status reports the dispatcher has not
                                                         acked yet (read when scraped)
    sluice_agent_reconnects_total{cluster}               times the agent dialled the dispatcher again
                                                         after a connection ended or failed to open
    sluice_agent_backend_errors_total{cluster}           backend calls that raised (create, delete,
                                                         inventory, capacity)

`sluice agent run` serves them on loopback in plaintext, or on any address over HTTPS: metrics name
clusters and job counts.
"""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics

COMMAND_KINDS = ("dispatch", "cancel")


class AgentMetrics:
    """The metrics of one agent, in their own registry; attributes are the `cluster` children."""

    def __init__(self, cluster: str, *, unacked: Callable[[], int]) -> None:
        """unacked: called at every scrape, returns how many status reports await an ack."""
        # No `<name>_created` series (sluice_agent_attempts_created_created); process-wide in
        # prometheus_client, so set where the metrics are made, not on import.
        disable_created_metrics()
        self.registry = CollectorRegistry()
        labels = {"cluster": cluster}
        self.connected = Gauge(
            "sluice_agent_connected", "1 while the stream to the dispatcher is open and welcomed, else 0",
            ["cluster"], registry=self.registry).labels(**labels)
        self.attempts_created = Counter(
            "sluice_agent_attempts_created_total", "Attempts whose objects the backend created",
            ["cluster"], registry=self.registry).labels(**labels)
        self.attempts_deleted = Counter(
            "sluice_agent_attempts_deleted_total", "Cancel commands whose delete call returned",
            ["cluster"], registry=self.registry).labels(**labels)
        self._commands_applied = Counter(
            "sluice_agent_commands_applied_total", "Commands from the dispatcher applied, by kind",
            ["cluster", "kind"], registry=self.registry)
        self.status_reports_unacked = Gauge(
            "sluice_agent_status_reports_unacked", "Status reports the dispatcher has not acked yet",
            ["cluster"], registry=self.registry).labels(**labels)
        self.reconnects = Counter(
            "sluice_agent_reconnects_total",
            "Times the agent dialled the dispatcher again after a connection ended or failed to open",
            ["cluster"], registry=self.registry).labels(**labels)
        self.backend_errors = Counter(
            "sluice_agent_backend_errors_total", "Backend calls that raised",
            ["cluster"], registry=self.registry).labels(**labels)
        self._cluster = cluster
        self.status_reports_unacked.set_function(unacked)
        for kind in COMMAND_KINDS:  # every series exists from the start, at 0
            self.command_applied(kind)

    def command_applied(self, kind: str | None) -> Counter:
        """The commands-applied counter of one command kind ("unknown" when the message has none)."""
        return self._commands_applied.labels(cluster=self._cluster, kind=kind or "unknown")
