"""`sluice submit --array/--start-after/--depends-on`, `list --array`, `cancel --array`, `describe`'s dependency
graph and `sluice attach`, as a user runs them against `sluice up` (tests/integration/test_cli.py's)."""
from __future__ import annotations

import json
import time

from tests.integration.test_cli import job_yaml, ok, one_error_line, sluice, up  # noqa: F401 (the fixture)


def _wait(up, job_id: int, states: tuple[str, ...], timeout: float = 30) -> dict:  # noqa: F811
    deadline = time.monotonic() + timeout
    while True:
        job = up.client().get(job_id)
        if job["state"] in states or time.monotonic() > deadline:
            return job
        time.sleep(0.2)


def test_an_array_from_the_command_line_is_listed_and_cancelled_as_one(up):  # noqa: F811
    ids = [int(i) for i in ok(sluice(up, "submit", "-f", "-", "--array", "3-8%2",
                                     input=job_yaml("sweep", duration="60s"))).split()]
    assert len(ids) == 6
    listed = json.loads(ok(sluice(up, "list", "--array", str(ids[0]), "-o", "json")))
    assert [j["arrayIndex"] for j in listed] == [3, 4, 5, 6, 7, 8] and {j["arrayId"] for j in listed} == {ids[0]}
    assert sorted(j["state"] for j in listed).count("WAITING") == 4
    cancelled = json.loads(ok(sluice(up, "cancel", "--array", str(ids[0]), "-o", "json")))
    assert sorted(j["id"] for j in cancelled) == ids
    assert _wait(up, ids[-1], ("CANCELLED",))["state"] == "CANCELLED"


def test_dependencies_from_the_command_line_and_the_graph_in_describe(up):  # noqa: F811
    [first] = [int(i) for i in ok(sluice(up, "submit", "-f", "-", input=job_yaml("first", duration="1s"))).split()]
    [then] = [int(i) for i in ok(sluice(up, "submit", "-f", "-", "--depends-on", f"{first}:finished",
                                        input=job_yaml("then", duration="1s"))).split()]
    shown = ok(sluice(up, "describe", str(then)))
    assert "waits for:" in shown and "finished" in shown
    described = json.loads(ok(sluice(up, "describe", str(first), "-o", "json")))
    assert [(d["jobId"], d["condition"]) for d in described["dependants"]] == [(then, "finished")]
    assert _wait(up, then, ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"


def test_bad_when_options_get_one_line_and_submit_nothing(up):  # noqa: F811
    before = len(json.loads(ok(sluice(up, "list", "--limit", "0", "-o", "json"))))
    for args, message in ((("--array", "9-3"), "error: submit -: --array: '9-3': the last index comes before"),
                          (("--array", "x"), "error: submit -: --array: 'x' is not an array"),
                          (("--depends-on", "12:ok"), "error: submit -: --depends-on: '12:ok': write JOB or JOB:"),
                          (("--start-after", "2026-01-01T00:00"), "error: submit -: --start-after: '2026-01-01T00:00' "
                                                                  "has no time zone offset"),
                          (("--depends-on", "999999"), "error: submit -: job: spec.dependsOn[0].job: job 999999 "
                                                       "not found")):
        assert one_error_line(sluice(up, "submit", "-f", "-", *args, input=job_yaml("bad"))).startswith(message)
    assert len(json.loads(ok(sluice(up, "list", "--limit", "0", "-o", "json")))) == before


def test_attach_says_where_a_session_is_and_an_idle_one_ends(up):  # noqa: F811
    # The idle timeout leaves room for the CLI calls before the first attach on a loaded machine (two test
    # workers): 4 s was seen to end the session before `attach` ran.
    doc = job_yaml("notebook", duration="1h").replace("  queue: default\n",
                                                      "  queue: default\n  interactive: true\n  idleTimeout: 10s\n")
    [job_id] = [int(i) for i in ok(sluice(up, "submit", "-f", "-", input=doc)).split()]
    assert json.loads(ok(sluice(up, "get", str(job_id), "-o", "json")))["interactive"] is True
    assert _wait(up, job_id, ("RUNNING",))["state"] == "RUNNING"
    attached = ok(sluice(up, "attach", str(job_id), "--once"))
    assert attached.startswith(f"job {job_id} RUNNING: ") and ".sim" in attached
    job = _wait(up, job_id, ("CANCELLED",), timeout=30)
    assert job["state"] == "CANCELLED" and job["reason"] == "ended: nobody attached for 10s (spec.idleTimeout)"
    [batch] = [int(i) for i in ok(sluice(up, "submit", "-f", "-", input=job_yaml("batch", duration="1s"))).split()]
    assert "not an interactive session" in one_error_line(sluice(up, "attach", str(batch), "--once"))
