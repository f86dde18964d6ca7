"""`sluice simulate`: replay a public workload trace in virtual time through Sluice's scheduling cycle.

traces.py reads the traces (Standard Workload Format, the Philly CSV, Sluice job files); report.py turns
what happened to each job into decision-quality figures and a table; plots.py draws them.
"""

POLICIES = ("sluice", "fifo", "easy-backfill")  # what a replay can run (engine.py): named here, read without the engine
