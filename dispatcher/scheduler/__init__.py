"""The scheduler: the leader's loop, one cycle, its typed inputs, parking, and rows mapped to policy objects."""
