"""`sluice up`: an embedded PostgreSQL, a dispatcher and one in-process sim agent per simulated cluster.

Everything lives under one data directory (postgres/, client.yaml, agent tokens, sim ledgers), so a
restart on the same directory resumes where the last run stopped, even after kill -9.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import pathlib
import time
from dataclasses import dataclass, replace

import yaml

from agent.backends.sim.cluster import SimCluster, SimConfig
from agent.connection import Agent, AgentSettings
from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.services import administering
from dispatcher.store import clusters as cluster_store
from dispatcher.store import tokens
from dispatcher.store.database import DatabaseSettings
from sluice import certs
from sluice import config as client_config
from sluice.objects import default_objects, load_objects, object_from_document
from sluice.serving import ServerTls, refuse_plaintext_off_loopback
from sluice.transport import Tls

log = logging.getLogger(__name__)
# Sluice's alert rules, which the embedded Prometheus evaluates when run from a checkout (deploy/ is not installed).
ALERT_RULES = pathlib.Path(__file__).resolve().parents[1] / "deploy" / "monitoring" / "alerts.yaml"


@dataclass(frozen=True)
class UpSettings:
    data_dir: pathlib.Path
    listen: str = "127.0.0.1:7070"
    make_default: bool = True  # point this user's default client config at this data dir
    throwaway: bool = False  # delete the embedded database when stopped (demo runs in a temp dir)
    sim_time_scale: float = 1.0  # multiplies every simulated pod duration
    database_url: str | None = None  # None: the embedded PostgreSQL under data_dir
    prometheus: bool = False  # run a real Prometheus scraping the sims; clusters read capacity from it
    insecure: bool = False  # plaintext instead of TLS with the data dir's own CA (loopback only)


def local_tls(certs_dir: pathlib.Path, listen: str) -> ServerTls:
    """The data dir's own CA and the dispatcher's certificate, made on first start (as `cockroach cert` or
    kind do). The certificate names localhost and the loopback addresses, plus the --listen host; it is
    issued again when the host it must name changes, or when it is within 30 days of expiring."""
    ca_cert, ca_key = certs_dir / "ca.crt", certs_dir / "ca.key"
    cert, key = certs_dir / "dispatcher.crt", certs_dir / "dispatcher.key"
    if not (ca_cert.exists() and ca_key.exists()):
        certs.make_ca("Sluice local CA").write(ca_cert, ca_key)
    host = listen.rsplit(":", 1)[0].strip("[]")
    hosts = certs.local_hosts() + ([host] if host and host not in certs.local_hosts() + ["0.0.0.0", "::"] else [])
    if not (cert.exists() and key.exists()) or not certs.names_and_lasts(cert.read_bytes(), hosts, days=30):
        certs.make_server(certs.load(ca_cert, ca_key), hosts).write(cert, key)
    return ServerTls(cert, key)


def _secret(path: pathlib.Path, create) -> str:
    """A token kept in a file under the data dir, created (and stored) the first time."""
    if path.exists():
        return path.read_text().strip()
    secret = create()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return secret


def objects_digest(objects: list) -> str:
    """What identifies a set of objects: their canonical documents (comments and layout aside), in order."""
    canonical = json.dumps([obj.to_document() for obj in objects], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class Embedded:
    def __init__(self, settings: UpSettings, objects: list | None):
        """objects (`--config`): applied (validated and audited like `sluice admin apply`) on the first start
        of a data dir, and again only when they differ from those last applied there, so what admins
        changed since survives a restart; `config_note` says which. None applies the default objects on
        the first start of a data dir only."""
        self.settings = settings
        self.objects = objects
        self.config_note: str | None = None  # what became of `objects` at this start (the summary shows it)
        self.dispatcher: Dispatcher | None = None
        self.agents: dict[str, Agent] = {}
        self.sims: dict[str, SimCluster] = {}
        self.admin_token = ""
        self.exporters: dict = {}  # cluster -> SimMetricsServer, with --prometheus
        self.prometheus = None  # the PrometheusServer, with --prometheus

    @property
    def client_config_path(self) -> pathlib.Path:
        return self.settings.data_dir / "client.yaml"

    def start(self) -> Embedded:
        if self.settings.insecure:
            refuse_plaintext_off_loopback(self.settings.listen)  # before anything starts
        data = self.settings.data_dir.resolve()
        data.mkdir(parents=True, exist_ok=True)
        # One `sluice up` per data dir: a second one would run a second set of agents for the same clusters.
        # The kernel drops the lock when the process dies, kill -9 included.
        self._lock = open(data / "up.lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise OSError(f"another `sluice up` is running on {data}") from None
        tls = None if self.settings.insecure else local_tls(data / "certs", self.settings.listen)
        # What the in-process agents and the client config trust: the local CA (or plaintext, loopback only).
        self.tls = Tls(insecure=True) if tls is None else Tls(ca=str(data / "certs" / "ca.crt"))
        self.dispatcher = d = Dispatcher(ServerSettings(
            listen=self.settings.listen, tls=tls, database=DatabaseSettings(
                url=self.settings.database_url, data_dir=data,
                embedded_cleanup="delete" if self.settings.throwaway else "stop"))).start()
        record = data / "config-applied.json"  # the digest of what --config last applied, and the database
        # The database by a digest of its URL: the file must not hold a password.
        applied = {"digest": objects_digest(self.objects) if self.objects is not None else None,
                   "database": hashlib.sha256((self.settings.database_url or "embedded").encode()).hexdigest()}
        try:
            last = json.loads(record.read_text()) if record.exists() else None
        except ValueError:  # unreadable: as if never applied
            last = None
        if not isinstance(last, dict):
            last = None
        try:
            with d.sessions.begin() as session:
                # A database with no objects at all is new (or was emptied), whatever the record says.
                apply = self.objects is not None and (last != applied or not administering.get(session, ""))
                if apply:
                    administering.apply(session, "sluice up", self.objects)
                elif self.objects is None and not cluster_store.list_clusters(session):
                    administering.apply(session, "sluice up", default_objects())
                clusters = [object_from_document(doc) for doc in administering.get(session, "Cluster")]
        except Exception:
            self.stop()
            raise
        if apply:
            record.write_text(json.dumps(applied) + "\n")
            edited = last is not None and last.get("database") == applied["database"] and last != applied
            self.config_note = "applied" + (" (changed since it was last applied here)" if edited else "")
        elif self.objects is not None:
            self.config_note = ("not applied: unchanged since it was last applied here, so changes made since "
                                "(sluice admin) are kept; edit the file to apply it again")

        def new_token(role: str, subject: str, cluster: str | None = None):
            def create() -> str:
                with d.sessions.begin() as session:
                    return tokens.create(session, role, subject, cluster)
            return create

        self.admin_token = _secret(data / "tokens" / "admin", new_token("admin", "admin"))
        try:
            client_config.write(self.client_config_path, self.client_settings())
            if self.settings.make_default:
                client_config.make_default(self.client_config_path)
        except client_config.ConfigError as exc:
            self.stop()
            raise OSError(str(exc)) from None  # `sluice up` prints it as one line
        for obj in clusters:  # the stored clusters: a restart without --config runs the same ones
            if obj.simulated is not None:
                token = _secret(data / "tokens" / f"agent-{obj.name}",
                                new_token("agent", f"agent-{obj.name}", obj.name))
                sim = self.sims[obj.name] = sim_cluster(obj, data, self.settings.sim_time_scale)
                self.agents[obj.name] = Agent(AgentSettings(obj.name, d.address, token, tls=self.tls), sim).start()
        if self.settings.prometheus:
            try:
                self._start_prometheus(data, clusters)
            except Exception:
                self.stop()
                raise
        return self

    def _start_prometheus(self, data: pathlib.Path, clusters: list) -> None:
        """Serve each sim's kube-state-metrics series, scrape them and the dispatcher with a real Prometheus
        every second, with Sluice's alert rules (in a checkout), and point each simulated cluster at it (with a
        cluster="<name>" selector)."""
        from agent.backends.sim.metrics import SimMetricsServer
        from devstack.prometheus import PrometheusServer
        from dispatcher.capacity.prometheus import PrometheusError, PrometheusSettings, read

        for name, sim in self.sims.items():
            self.exporters[name] = SimMetricsServer(sim)
            self.exporters[name].start()
        port = self.dispatcher.metrics_port
        self.prometheus = PrometheusServer(
            data / "prometheus", {name: f"127.0.0.1:{exporter.port}" for name, exporter in self.exporters.items()},
            dispatcher=f"127.0.0.1:{port}" if port else None, dispatcher_ca=self.tls.ca,
            rule_files=(ALERT_RULES,) if ALERT_RULES.is_file() else ()).start()
        pointed = [replace(obj, prometheus={"url": self.prometheus.url, "selector": f'{{cluster="{obj.name}"}}'})
                   for obj in clusters if obj.name in self.sims]
        deadline = time.monotonic() + 30  # until its first scrapes are in, it would only say "no series"
        for obj in pointed:
            while True:
                try:
                    read(PrometheusSettings.from_document(obj.prometheus))
                    break
                except PrometheusError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        with self.dispatcher.sessions.begin() as session:
            administering.apply(session, "sluice up", pointed)

    def client_settings(self, token: str | None = None, timeout_s: float = 30.0) -> client_config.ClientConfig:
        """How a client reaches this dispatcher (as the admin unless given another token)."""
        return client_config.ClientConfig(self.dispatcher.address, token or self.admin_token, timeout_s,
                                          ca=self.tls.ca, insecure=self.tls.insecure)

    def wait_connected(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        for name, agent in self.agents.items():
            if not agent.connected.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"the sim agent of cluster {name} did not connect within {timeout_s:g}s")

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop()
        if self.dispatcher:
            self.dispatcher.stop()
        for exporter in self.exporters.values():
            exporter.stop()
        if self.prometheus is not None:
            self.prometheus.stop()
        self._lock.close()


def sim_cluster(obj, data: pathlib.Path, time_scale: float = 1.0) -> SimCluster:
    """The simulated cluster of a Cluster object with `simulated` set; its ledger under data/sim/."""
    elastic = obj.elastic or {}
    (data / "sim").mkdir(parents=True, exist_ok=True)
    return SimCluster(SimConfig(nodes=obj.simulated.nodes, node=dict(obj.simulated.node),
                                ledger_path=data / "sim" / f"{obj.name}.ledger", time_scale=time_scale,
                                max_nodes=elastic.get("maxNodes"),
                                provisioning_delay=elastic.get("provisioningDelay", 0.0),
                                scale_down_after=elastic.get("scaleDownAfter", 600.0),
                                # the timeout the cluster's kubernetes agent would give a gang
                                gang_start_timeout=obj.kubernetes["gangStartTimeout"], name=obj.name))


def load_config(path: pathlib.Path | None) -> list | None:
    return None if path is None else load_objects(path.read_text(), source=str(path))


def summary_line(embedded: Embedded) -> str:
    shown = {"address": embedded.dispatcher.address, "clusters": sorted(embedded.agents),
             "clientConfig": str(embedded.client_config_path)}
    if embedded.dispatcher.metrics_server is not None:
        server = embedded.dispatcher.metrics_server
        shown["metrics"] = server.url
        if embedded.dispatcher.settings.console:
            shown["console"] = server.root_url  # log in with the admin token in the data directory
    if embedded.tls.ca:
        shown["ca"] = embedded.tls.ca
    if embedded.prometheus is not None:
        shown["prometheus"] = embedded.prometheus.url
    if embedded.config_note is not None:
        shown["config"] = embedded.config_note
    return yaml.safe_dump(shown, sort_keys=False)
