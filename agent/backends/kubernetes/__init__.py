"""The backend for a real Kubernetes cluster: backend.py drives it through the official client (api.py)."""
