"""The simulated cluster backend: the cluster (cluster.py) and its kube-state-metrics exporter (metrics.py)."""
