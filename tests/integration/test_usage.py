"""`sluice usage` against a real dispatcher: attempts made through the real agent protocol (a scripted
agent drives RUNNING, FAILED, SUCCEEDED and a cancel), then given exact run times in the database, so
every total can be checked against the sum over attempts worked out by hand from durations and prices.
"""
from __future__ import annotations

import csv
import io
import json
import os
import pathlib
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.store import tokens
from dispatcher.store.database import DatabaseSettings
from dispatcher.store.models import Attempt
from sluice.admin_client import AdminClient
from sluice.client import Client, ClientError
from sluice.config import ClientConfig
from sluice.objects import load_objects
from sluice.quantity import parse_resources
from sluice.v1 import agents_pb2, jobs_pb2
from tests.integration.test_agent_link import ScriptedAgent

ROOT = pathlib.Path(__file__).resolve().parents[2]

# alice and bob belong to both queues: each sees every job's usage (a user sees only the jobs they may see).
# alpha: cpu 0.5 per core-hour, memory 0.01 per GiB-hour. beta: cpu 0.2, GPUs 3.0, memory unpriced.
# premium doubles every price. Jobs pinned to beta (a cloud) burst there at once: nothing else could run them.
OBJECTS = """
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec: {priority: 500, burst: {allowed: true}}
---
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: premium}
spec: {priority: 600, priceMultiplier: 2, burst: {allowed: true}}
---
apiVersion: sluice.io/v1
kind: BurstPolicy
metadata: {name: beta}
spec: {clusterSelector: {tier: cloud}}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: vision}
spec: {serviceClasses: [standard, premium], members: [alice, bob]}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: nlp}
spec: {serviceClasses: [standard, premium], members: [alice, bob]}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: alpha, labels: {pool: alpha}}
spec: {tier: onprem, site: dc-1, leaseDuration: 1h, price: {cpu: 0.5, memory: 0.01}}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: beta, labels: {pool: beta}}
spec: {tier: cloud, site: cloud-1, leaseDuration: 1h, price: {cpu: 0.2, nvidia.com/gpu: 3.0}}
"""
BIG = parse_resources({"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "8"})

# Every attempt the test makes, worked out by hand: (job, attempt, queue, class, cluster, user,
# started hours ago, finished hours ago (None: still running), base units held, cost per hour).
ATTEMPTS = [
    ("j1", 1, "vision", "premium", "alpha", "alice", 12, 10, {"cpu": 4, "memory": 8}, (4 * 0.5 + 8 * 0.01) * 2),
    ("j2", 1, "vision", "standard", "beta", "bob", 3, 0.5, {"cpu": 8, "nvidia.com/gpu": 2}, 8 * 0.2 + 2 * 3.0),
    ("j3", 1, "nlp", "standard", "alpha", "alice", 5, 4.5, {"cpu": 1, "memory": 2}, 1 * 0.5 + 2 * 0.01),
    ("j3", 2, "nlp", "standard", "beta", "alice", 4, 3, {"cpu": 1, "memory": 2}, 1 * 0.2),  # memory unpriced
    ("j4", 1, "nlp", "premium", "alpha", "bob", 1, None, {"cpu": 2, "memory": 1}, (2 * 0.5 + 1 * 0.01) * 2),
    ("j6", 1, "vision", "standard", "alpha", "alice", 40 * 24, 39 * 24, {"cpu": 1}, 1 * 0.5),
]
# j5 (nlp, standard, beta, bob) is cancelled before it starts: it used nothing and is never counted.
COLUMN = {"queue": 2, "class": 3, "cluster": 4, "user": 5}


def expected(by: str, since_h: float | None) -> dict[str, dict]:
    """Per group: cost, attempts and resource-hours, summed over ATTEMPTS inside the window (the last
    `since_h` hours; None: all time). A running attempt counts up to the hour 0 of the table."""
    out: dict[str, dict] = {}
    for row in ATTEMPTS:
        start, end, held, per_hour = row[6], row[7], row[8], row[9]
        end = 0.0 if end is None else end
        if since_h is not None:
            if end > since_h:
                continue
            start = min(start, since_h)
        hours = start - end
        group = out.setdefault(row[COLUMN[by]], {"cost": 0.0, "attempts": 0, "resourceHours": {}})
        group["cost"] += hours * per_hour
        group["attempts"] += 1
        for resource, amount in held.items():
            group["resourceHours"][resource] = group["resourceHours"].get(resource, 0.0) + amount * hours
    return out


def job(queue: str, cls: str, pool: str | None, count: int = 1, **requests: str) -> dict:
    requests = {("nvidia.com/gpu" if k == "gpu" else k): v for k, v in requests.items()}
    spec: dict = {"queue": queue, "serviceClass": cls, "podSets": [{"name": "w", "count": count, "template": {
        "spec": {"containers": [{"name": "m", "image": "x", "resources": {"requests": requests}}]}}}]}
    if pool:
        spec["placement"] = {"clusterSelector": {"pool": pool}}
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": "u"}, "spec": spec}


class RoomyAgent(ScriptedAgent):
    """A scripted agent whose cluster has room for every job of the test."""

    def __init__(self, address: str, token: str, cluster: str):
        self.seq = 0
        super().__init__(address, token, cluster, capacity=BIG)

    @staticmethod
    def capacity(free, applied_through=0):
        return agents_pb2.Capacity(allocatable=jobs_pb2.Resources(milli=BIG), free=jobs_pb2.Resources(milli=free),
                                   largest_free_node=jobs_pb2.Resources(milli=free), applied_through=applied_through)

    def take_dispatch(self, job_id: int) -> int:
        """Ack commands until this job's dispatch comes; returns its attempt."""
        while True:
            command = self.next("command")
            self.send(ack=agents_pb2.CommandAck(command_ids=[command.id]))
            if command.WhichOneof("kind") == "dispatch" and command.dispatch.job_id == job_id:
                return command.dispatch.attempt

    def report(self, job_id: int, attempt: int, *states: str) -> None:
        for state in states:
            self.seq += 1
            self.status(self.seq, job_id, attempt, state)


@pytest.fixture
def recorded(db_url):
    """A dispatcher holding the attempts of ATTEMPTS (and j5's), made for real, with exact run times."""
    from dispatcher.store import clusters as cluster_store
    settings = ServerSettings(listen="127.0.0.1:0", database=DatabaseSettings(url=db_url),
                              scheduler=SchedulerSettings(unreachable_after_s=600.0))
    d = Dispatcher(settings).start()
    with d.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(OBJECTS))
        d.tokens = {who: tokens.create(session, "user", who) for who in ("alice", "bob")}
        d.tokens["admin"] = tokens.create(session, "admin", "admin")
        d.tokens["agent"] = tokens.create(session, "agent", "agent-alpha", "alpha")
        beta_token = tokens.create(session, "agent", "agent-beta", "beta")
    clients = {who: Client(ClientConfig(d.address, token, timeout_s=10, insecure=True))
               for who, token in d.tokens.items()}
    admin = AdminClient(ClientConfig(d.address, d.tokens["admin"], timeout_s=10, insecure=True))
    alpha = RoomyAgent(d.address, d.tokens["agent"], "alpha")
    beta = RoomyAgent(d.address, beta_token, "beta")
    ids: dict[str, int] = {}
    try:
        def run(name, who, agent, spec, *states):
            [ids[name]] = clients[who].submit([spec])
            agent.report(ids[name], agent.take_dispatch(ids[name]), *states)

        run("j1", "alice", alpha, job("vision", "premium", "alpha", count=2, cpu="2", memory="4Gi"),
            "RUNNING", "SUCCEEDED")
        run("j2", "bob", beta, job("vision", "standard", "beta", cpu="8", gpu="2"), "RUNNING", "SUCCEEDED")
        run("j4", "bob", alpha, job("nlp", "premium", "alpha", cpu="2", memory="1Gi"), "RUNNING")
        run("j6", "alice", alpha, job("vision", "standard", "alpha", cpu="1"), "RUNNING", "SUCCEEDED")
        run("j5", "bob", beta, job("nlp", "standard", "beta", cpu="1"))
        clients["admin"].cancel([ids["j5"]])  # dispatched, never started
        # j3 may run anywhere: its first attempt fails on alpha, its second succeeds on beta.
        admin.set_cluster_state("beta", "cordoned")
        run("j3", "alice", alpha, job("nlp", "standard", None, cpu="1", memory="2Gi"), "RUNNING")
        admin.set_cluster_state("beta", "active")
        admin.set_cluster_state("alpha", "cordoned")
        alpha.report(ids["j3"], 1, "FAILED")
        beta.report(ids["j3"], beta.take_dispatch(ids["j3"]), "RUNNING", "SUCCEEDED")

        now = datetime.now(UTC)
        with d.sessions.begin() as session:
            for name, attempt, *_, started_h, finished_h, _held, _price in ATTEMPTS:
                session.execute(update(Attempt).where(Attempt.job_id == ids[name], Attempt.attempt == attempt).values(
                    started_at=now - timedelta(hours=started_h),
                    finished_at=None if finished_h is None else now - timedelta(hours=finished_h)))
        d.base_now, d.clients, d.ids = now, clients, ids
        yield d
    finally:
        for agent in (alpha, beta):
            agent.close()
        for c in (*clients.values(), admin):
            c.close()
        d.stop()


def hours_since(base: datetime, at: datetime) -> float:
    return (at - base).total_seconds() / 3600.0


def check(found: dict, by: str, base: datetime, before: datetime, after: datetime, since_h: float | None) -> None:
    """The report lies between the hand-worked totals at the instants just before and after the call
    (the dispatcher reads its clock in between; only a running or clipped attempt moves with it)."""
    # The ATTEMPTS offsets count back from `base`: a window reaching `since_h` back from a later instant
    # reaches that much less far back from `base` ...
    lo_run, hi_run = hours_since(base, before), hours_since(base, after)
    lo = expected(by, since_h=None if since_h is None else since_h - lo_run)
    hi = expected(by, since_h=None if since_h is None else since_h - hi_run)
    # ... and a still-running attempt has run that much longer.
    for table, extra in ((lo, lo_run), (hi, hi_run)):
        for row in ATTEMPTS:
            if row[7] is None and row[COLUMN[by]] in table:
                table[row[COLUMN[by]]]["cost"] += extra * row[9]
                for resource, amount in row[8].items():
                    table[row[COLUMN[by]]]["resourceHours"][resource] += amount * extra
    groups = {g["group"]: g for g in found["groups"]}
    assert set(groups) == set(lo) == set(hi), (by, groups)
    tolerance = 1e-9
    for name, group in groups.items():
        assert group["attempts"] == lo[name]["attempts"], (by, name)
        a, b = sorted((lo[name]["cost"], hi[name]["cost"]))
        assert a - tolerance <= group["cost"] <= b + tolerance, (by, name, group["cost"], a, b)
        assert set(group["resourceHours"]) == set(lo[name]["resourceHours"]), (by, name)
        for resource, hours in group["resourceHours"].items():
            a, b = sorted((lo[name]["resourceHours"][resource], hi[name]["resourceHours"][resource]))
            assert a - tolerance <= hours <= b + tolerance, (by, name, resource, hours, a, b)
    assert found["total"]["cost"] == pytest.approx(sum(g["cost"] for g in groups.values()))
    assert found["total"]["attempts"] == sum(g["attempts"] for g in groups.values())


@pytest.mark.parametrize("by", ["queue", "class", "cluster", "user"])
def test_all_time_totals_are_the_sum_over_attempts(recorded, by):
    before = datetime.now(UTC)
    found = recorded.clients["alice"].usage(since_s=0, by=by)
    after = datetime.now(UTC)
    assert found["by"] == by and found["currency"] == "USD" and found["since"] is None and found["until"]
    check(found, by, recorded.base_now, before, after, since_h=None)
    costs = [g["cost"] for g in found["groups"]]
    assert costs == sorted(costs, reverse=True)


def test_worked_numbers_by_queue(recorded):
    # The same, spelled out: vision = j1 2h × 4.16 + j2 2.5h × 7.6 + j6 24h × 0.5; nlp = j3's two
    # attempts 0.5h × 0.52 + 1h × 0.2, and j4 running for about an hour × 2.02 (j5 never started).
    found = {g["group"]: g for g in recorded.clients["bob"].usage(by="queue")["groups"]}
    assert found["vision"]["cost"] == pytest.approx(8.32 + 19.0 + 12.0)
    assert found["vision"]["attempts"] == 3
    assert found["vision"]["resourceHours"] == pytest.approx({"cpu": 8 + 20 + 24, "memory": 16, "nvidia.com/gpu": 5})
    assert found["nlp"]["attempts"] == 3
    assert found["nlp"]["cost"] == pytest.approx(0.26 + 0.2 + 2.02, abs=0.01)


@pytest.mark.parametrize("by", ["queue", "class", "cluster", "user"])
def test_a_window_clips_attempts_and_leaves_older_ones_out(recorded, by):
    # 11 hours back: j1 (12h..10h ago) counts for one hour only, j6 (40 days ago) not at all.
    before = datetime.now(UTC)
    found = recorded.clients["alice"].usage(since_s=11 * 3600, by=by)
    after = datetime.now(UTC)
    assert found["since"] is not None
    check(found, by, recorded.base_now, before, after, since_h=11)


def test_usage_is_refused_to_agents_and_bad_requests(recorded):
    agent = Client(ClientConfig(recorded.address, recorded.tokens["agent"], timeout_s=10, insecure=True))
    try:
        with pytest.raises(ClientError) as denied:
            agent.usage()
        assert denied.value.code == "PERMISSION_DENIED"
    finally:
        agent.close()
    with pytest.raises(ClientError) as bad:
        recorded.clients["alice"].usage(by="team")
    assert bad.value.code == "INVALID_ARGUMENT" and "team" in bad.value.message
    with pytest.raises(ClientError) as bad:
        recorded.clients["alice"].usage(since_s=-1)
    assert bad.value.code == "INVALID_ARGUMENT"


def sluice(*args: str, token: str | None = None, address: str = "127.0.0.1:1") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(SLUICE_ADDRESS=address, SLUICE_TOKEN=token or "x", SLUICE_INSECURE="1")
    return subprocess.run([sys.executable, "-m", "sluice", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def test_cli_json_and_csv(recorded):
    token = recorded.tokens["alice"]
    done = sluice("usage", "--since", "all", "--by", "cluster", "-o", "json", token=token, address=recorded.address)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report) == {"by", "since", "until", "currency", "groups", "total", "burst"}
    assert report["by"] == "cluster" and report["currency"] == "USD" and report["since"] is None
    # Every beta attempt burst under policy beta: its spend is beta's cost (no budgets set, none running).
    burst = {b["queue"]: b for b in report["burst"]}
    assert set(burst) == {None, "vision", "nlp"} and {b["policy"] for b in burst.values()} == {"beta"}
    assert burst[None]["spentInWindow"] == pytest.approx(19.2) and burst[None]["attempts"] == 2
    assert (burst["vision"]["spentInWindow"] == pytest.approx(19.0)
            and burst["nlp"]["spentInWindow"] == pytest.approx(0.2))
    assert (burst[None]["budgetPerDay"], burst[None]["budgetPerHour"], burst[None]["ratePerHour"]) == (None, None, 0)
    clusters = {g["group"]: g for g in report["groups"]}
    # alpha: j1 8.32 + j3 0.26 + j6 12 + j4 running about an hour × 2.02; beta: j2 19 + j3 0.2.
    assert clusters["beta"]["cost"] == pytest.approx(19.2) and clusters["beta"]["attempts"] == 2
    assert clusters["alpha"]["cost"] == pytest.approx(8.32 + 0.26 + 12 + 2.02, abs=0.01)
    assert clusters["alpha"]["attempts"] == 4
    assert set(clusters["alpha"]) == {"group", "resourceHours", "cost", "attempts"}

    done = sluice("usage", "--by", "user", "-o", "csv", token=token, address=recorded.address)  # default: 30d
    assert done.returncode == 0, done.stderr
    rows = list(csv.reader(io.StringIO(done.stdout)))
    assert rows[0] == ["group", "cost", "attempts", "cpu", "memory", "nvidia.com/gpu"]
    users = {r[0]: r for r in rows[1:]}
    assert set(users) == {"alice", "bob"}
    # alice in the last 30 days: j1 8.32 + j3 0.26 + 0.2 (j6 is older); bob: j2 19 + j4 about 2.02.
    assert float(users["alice"][1]) == pytest.approx(8.78) and users["alice"][2] == "3"
    assert [float(x) for x in users["alice"][3:]] == pytest.approx([8 + 0.5 + 1, 16 + 1 + 2, 0])
    assert float(users["bob"][1]) == pytest.approx(21.02, abs=0.01) and users["bob"][2] == "2"

    done = sluice("usage", "--since", "all", token=token, address=recorded.address)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("usage by queue, all time until ")
    assert lines[1].split() == ["QUEUE", "ATTEMPTS", "CPU", "(core-h)", "MEMORY", "(GiB-h)", "NVIDIA.COM/GPU",
                                "(GPU-h)", "COST", "(USD)"]
    assert lines[2].split()[:2] == ["vision", "3"] and lines[2].split()[-1] == "39.32"
    blank = lines.index("")
    assert lines[blank - 1].split()[0] == "TOTAL"
    assert lines[blank + 1] == "burst spend against budgets (USD; the budget day is the UTC day)"
    assert lines[blank + 2].split()[:5] == ["POLICY", "QUEUE", "ATTEMPTS", "SPENT", "IN"]
    # Today's spend counts the bursts dispatched today (the test dispatched them all today) that had not
    # finished before the UTC day began: the fixture moved their run times back, so in the first hours of a
    # day they finished yesterday (j2 half an hour before the base time, j3's second attempt three hours).
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    ended = {(row[0], row[1]): row[7] for row in ATTEMPTS}
    vision, nlp = (cost if recorded.base_now - timedelta(hours=ended[attempt]) >= day else 0.0
                   for cost, attempt in ((19.0, ("j2", 1)), (0.2, ("j3", 2))))
    assert [line.split()[:7] for line in lines[blank + 3:]] == [
        ["beta", "(all)", "2", "19.20", f"{vision + nlp:.2f}", "/", "-"],
        ["beta", "nlp", "1", "0.20", f"{nlp:.2f}", "/", "-"],
        ["beta", "vision", "1", "19.00", f"{vision:.2f}", "/", "-"]]


@pytest.mark.parametrize("args, why", [
    (["--since", "forever"], "Invalid value for '--since': 'forever' is not a duration"),
    (["--since", "0s"], "Invalid value for '--since': '0s' is an empty window"),
    (["--by", "team"], "Invalid value for '--by': 'team' is not one of queue, class, cluster, user"),
    (["-o", "xml"], "Invalid value for '--output'"),
])
def test_cli_usage_errors_exit_2_with_one_line(args, why):
    done = sluice("usage", *args)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: sluice usage: {why}"), done.stderr
    assert done.stdout == ""


def test_cli_refusal_exits_1_with_one_line(recorded):
    done = sluice("usage", token=recorded.tokens["agent"], address=recorded.address)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: usage: "), done.stderr
