"""Sluice benchmarks (issue 7): `python -m bench [NAME ...] [--quick]`. Never part of the test run.

See docs/performance.md for what each benchmark runs and the figures so far.
"""
