"""The scheduler: the leader's loop, one cycle and its typed inputs (cycle.py, with no store) and that cycle on
Postgres (postgres_cycle.py, stored_policy.py), parking, rows mapped to policy objects, and `sluice explain`
(the same policy code, asked why a job waits)."""
