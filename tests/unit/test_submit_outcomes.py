"""How a submit's end counts in sluice_submit_requests (docs/metrics.md): only the server's own failures are
`failed`, which the SluiceSubmitErrors alert watches; the callers' mistakes and refusals are not."""
from __future__ import annotations

import grpc
import pytest

from dispatcher import errors
from dispatcher.api.errors import outcome_of


@pytest.mark.parametrize("exc, outcome", [
    (errors.InvalidRequest("spec: bad"), "invalid"),
    (errors.NotFound("spec.queue: queue 'x' not found"), "invalid"),
    (errors.PermissionDenied("not a member"), "refused"),
    (errors.Unauthenticated("no token"), "refused"),
    (errors.ResourceExhausted("too many"), "refused"),
    (errors.Conflict("the key was used for other jobs"), "refused"),
    (errors.StoreUnavailable("database unreachable"), "failed"),
    (errors.SchemaBehind("run the migration"), "failed"),
    (RuntimeError("a bug"), "failed"),
    (grpc.aio.UsageError("the client went away"), None),
])
def test_a_submits_end_counts_by_whose_it_is(exc, outcome):
    assert outcome_of(exc) == outcome
