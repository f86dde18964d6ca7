"""The web console: pages and a JSON API served on the dispatcher's HTTP port beside /metrics.

The JSON API is a gateway to the dispatcher's own gRPC API (gateway.py): every rule (who is calling, who may
see or cancel what, what a valid request is) stays in the gRPC services alone.
"""
