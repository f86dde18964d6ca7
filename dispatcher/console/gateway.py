"""The JSON API's calls, each made on the dispatcher's own gRPC server with the caller's bearer token.

The console holds no rule of its own: the gRPC services authenticate the token, scope what it may see or
cancel and validate the request, and their status becomes the HTTP status (HTTP_STATUS), their details the
error. Replies are the dicts the Python client and the CLI's JSON output give (sluice.client).
"""
from __future__ import annotations

import grpc

from sluice import client
from sluice.v1 import jobs_pb2, jobs_pb2_grpc

CALL_TIMEOUT_S = 30.0
HTTP_STATUS = {
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
}


class ApiError(Exception):
    """A request the JSON API answers with `status` and {"error": message}."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class Gateway:
    """One gRPC channel to the dispatcher's private socket (`target`, e.g. unix:/path), shared by every request."""

    def __init__(self, target: str):
        self._channel = grpc.insecure_channel(target)
        self._jobs = jobs_pb2_grpc.JobsStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def _call(self, method, request, authorization: str):
        """The call's reply, made with the HTTP request's Authorization header as the gRPC metadata."""
        metadata = [("authorization", authorization)] if authorization else []
        try:
            return method(request, metadata=metadata, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise _failed(exc) from None

    def jobs(self, authorization: str, *, queue: str = "", state: str = "", user: str = "", cluster: str = "",
             name: str = "", limit: int = 0, page: str = "") -> dict:
        reply = self._call(self._jobs.List, jobs_pb2.ListJobsRequest(
            queue=queue, state=state, user=user, cluster=cluster, name=name, limit=limit, page_token=page),
            authorization)
        return {"jobs": [client.job_dict(j) for j in reply.jobs], "nextPageToken": reply.next_page_token or None}

    def describe(self, authorization: str, job_id: int) -> dict:
        return client.describe_dict(self._call(self._jobs.Describe, jobs_pb2.GetJobRequest(id=job_id), authorization))

    def explain(self, authorization: str, job_id: int) -> dict:
        return client.explain_dict(self._call(self._jobs.Explain, jobs_pb2.GetJobRequest(id=job_id), authorization))

    def cancel(self, authorization: str, job_id: int) -> dict:
        reply = self._call(self._jobs.Cancel, jobs_pb2.CancelRequest(ids=[job_id]), authorization)
        return {"jobs": [client.job_dict(j) for j in reply.jobs]}

    def queues(self, authorization: str) -> dict:
        return {"queues": client.queue_dicts(self._call(self._jobs.ListQueues, jobs_pb2.ListQueuesRequest(),
                                                        authorization))}

    def clusters(self, authorization: str) -> dict:
        return {"clusters": client.cluster_dicts(self._call(self._jobs.ListClusters, jobs_pb2.ListClustersRequest(),
                                                            authorization))}

    def logs(self, authorization: str, job_id: int, *, tail: int, pod: str = "", pod_set: str = "",
             attempt: int = 0) -> dict:
        """A job's pod logs as Logs streams them (never followed: the page asks again), gathered in one answer."""
        request = jobs_pb2.LogsRequest(id=job_id, tail_lines=tail, pod=pod, pod_set=pod_set, attempt=attempt)
        metadata = [("authorization", authorization)] if authorization else []
        lines, shown = [], {"attempt": attempt or None, "cluster": None}
        try:
            for reply in self._jobs.Logs(request, metadata=metadata, timeout=CALL_TIMEOUT_S):
                shown = {"attempt": reply.attempt, "cluster": reply.cluster}
                lines.extend({"pod": line.pod, "line": line.line} for line in reply.lines)
        except grpc.RpcError as exc:
            raise _failed(exc) from None
        return {**shown, "lines": lines}

    def usage(self, authorization: str, *, by: str = "", since_s: float = 0.0) -> dict:
        reply = self._call(self._jobs.Usage, jobs_pb2.UsageRequest(by=by, since_seconds=since_s), authorization)
        return client.usage_dict(reply, by or "queue")


def _failed(exc: grpc.RpcError) -> ApiError:
    """A failed call as the JSON API answers it: its status as HTTP's, its details as the error."""
    code = exc.code()
    return ApiError(HTTP_STATUS.get(code, 500), exc.details() or code.name)
