"""A real Prometheus server, started from the `prometheus` binary (Debian's package of that name), that
scrapes given kube-state-metrics endpoints on loopback and, when given, the dispatcher's own /metrics with
Sluice's alert rules loaded (deploy/monitoring/alerts.yaml): `sluice up --prometheus` and the tests use it."""
from __future__ import annotations

import pathlib
import shutil
import socket
import subprocess
import time
import urllib.request

import yaml


class PrometheusMissing(OSError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusServer:
    def __init__(self, data_dir: pathlib.Path, targets: dict[str, str], *, scrape_interval_s: float = 1.0,
                 port: int = 0, dispatcher: str | None = None, dispatcher_ca: str | None = None,
                 rule_files: tuple[pathlib.Path, ...] = ()):
        """targets: cluster name -> host:port of its metrics endpoint; each gets the label cluster=<name>.
        dispatcher: host:port of the dispatcher's /metrics (over HTTPS verified by dispatcher_ca when given).
        rule_files: Prometheus rule files to evaluate (alerts show at /alerts)."""
        self.data_dir = data_dir
        self.targets = targets
        self.dispatcher, self.dispatcher_ca, self.rule_files = dispatcher, dispatcher_ca, rule_files
        self.scrape_interval_s = scrape_interval_s
        self.port = port
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict:
        interval = f"{self.scrape_interval_s:g}s"
        jobs = [{"job_name": "kube-state-metrics", "static_configs": [
            {"targets": [address], "labels": {"cluster": name}} for name, address in sorted(self.targets.items())]}]
        if self.dispatcher is not None:
            jobs.append({"job_name": "sluice-dispatcher", "static_configs": [{"targets": [self.dispatcher]}],
                         **({"scheme": "https", "tls_config": {"ca_file": str(self.dispatcher_ca)}}
                            if self.dispatcher_ca else {})})
        return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
                "rule_files": [str(path) for path in self.rule_files], "scrape_configs": jobs}

    def start(self, timeout_s: float = 30.0) -> PrometheusServer:
        binary = shutil.which("prometheus")
        if binary is None:
            raise PrometheusMissing("the `prometheus` binary is not installed (Debian: apt-get install prometheus)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self.port = self.port or free_port()
        log = open(self.data_dir / "prometheus.log", "ab")
        self.process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={self.data_dir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1d"],
            stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise OSError(f"prometheus exited with {self.process.returncode}; "
                              f"see {self.data_dir / 'prometheus.log'}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise OSError(f"prometheus did not become ready within {timeout_s:g}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
