"""docs/python-client.md runs as written: its ```python blocks, in order, in one namespace, against a real
dispatcher (the `system` fixture), found the way the doc says, through this user's default client config,
which the test writes with a context for it."""
from __future__ import annotations

import pathlib
import re

import pytest

from sluice import config

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python-client.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks() -> list[str]:
    return BLOCK.findall(DOC.read_text())


def test_the_doc_shows_each_step():
    code = "\n".join(blocks())
    for step in ("from sluice import Client, ClientError", "Client.from_config(", ".submit(", ".wait(", ".list(",
                 ".watch(", ".cancel(", "except ClientError", ".close()"):
        assert step in code, step


@pytest.fixture
def user_config(system, tmp_path, monkeypatch) -> pathlib.Path:
    """This user's default client config: a context `local` for the system's dispatcher, current, beside
    one that leads nowhere."""
    for name in ("SLUICE_CONFIG", "SLUICE_CONTEXT", "SLUICE_ADDRESS", "SLUICE_TOKEN", "SLUICE_CA", "SLUICE_INSECURE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home-config"))
    path = config.default_path()
    settings = system.client_settings()
    config.set_context(path, "local", address=settings.address, token=settings.token, ca=settings.ca,
                       insecure=settings.insecure)
    config.set_context(path, "elsewhere", address="127.0.0.1:1", token="sl_nothing")
    assert config.read(path).current == "local"
    return path


def test_the_walk_through_runs_against_a_real_dispatcher(user_config, capsys):
    namespace: dict = {"__name__": "python_client_doc"}
    for number, block in enumerate(blocks(), 1):
        try:
            exec(compile(block, f"{DOC.name} block {number}", "exec"), namespace)
        except Exception as exc:  # which block, with what, beside pytest's own report
            pytest.fail(f"block {number} of {DOC.name} raised {type(exc).__name__}: {exc}\n{block}")
    out = capsys.readouterr().out
    assert namespace["done"]["state"] == "SUCCEEDED", namespace["done"]
    assert namespace["cancelled"]["state"] == "CANCELLED", namespace["cancelled"]
    assert "'onprem'" in out and f"submitted job {namespace['job_id']}" in out, out
    assert f"\n{namespace['job_id']} hello SUCCEEDED " in out, out  # listed
    assert re.search(rf"^{namespace['sleepy']}\b.*\bCANCELLED\b", out, re.MULTILINE), out
    assert "None -> QUEUED" in out, out  # the watch showed the sleepy job's first event
    errors = [line for line in out.splitlines() if re.match(r"^[A-Z_]+ - ", line)]
    assert [line.split(" - ")[0] for line in errors] == ["NOT_FOUND", "INVALID_ARGUMENT", "INVALID_ARGUMENT"], out
    assert "spec.podSets[0].count" in errors[1], errors
    assert f"no context 'nowhere' in {user_config}; contexts: local, elsewhere" in errors[2], errors
    assert out.rstrip().endswith("queues"), out
