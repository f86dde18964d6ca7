"""The committed gRPC stubs in sluice/v1/ are exactly what scripts/gen_protos.py makes from
proto/sluice/v1/*.proto: regenerate into a temporary directory and compare byte for byte."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "sluice" / "v1"
PROTOS = sorted((ROOT / "proto" / "sluice" / "v1").glob("*.proto"))


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, bytes]:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is in the test extra: pip install -e .[test]")
    out = tmp_path_factory.mktemp("stubs")
    written = _load_generator().generate(out)
    assert written, "the generator wrote nothing"
    return {path.name: path.read_bytes() for path in sorted((out / "sluice" / "v1").iterdir()) if path.is_file()}


def test_every_proto_yields_messages_types_and_services(generated):
    assert PROTOS, "no .proto files found"
    for proto in PROTOS:
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            assert proto.stem + suffix in generated


def test_the_committed_stubs_match_the_protos_byte_for_byte(generated):
    stale = []
    for name, text in generated.items():
        committed = COMMITTED / name
        if not committed.is_file() or committed.read_bytes() != text:
            stale.append(name)
    assert not stale, f"sluice/v1/{', '.join(stale)} differ from the protos: run python scripts/gen_protos.py"


def test_no_committed_stub_lacks_a_proto(generated):
    orphans = sorted(p.name for p in COMMITTED.glob("*_pb2*.py*") if p.name not in generated)
    assert not orphans, f"sluice/v1/{', '.join(orphans)} no longer come from any .proto: delete them"
