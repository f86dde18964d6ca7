"""The scheduler: the leader's loop, one cycle and its typed inputs, parking, rows mapped to policy objects,
and `sluice explain` (the same policy code, asked why a job waits)."""
