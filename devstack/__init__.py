"""The local development stack: embedded Postgres and `sluice up`, the demo, a local Prometheus; the only
code importing both dispatcher and agent."""
