"""Regenerate the committed gRPC stubs in sluice/v1/ from proto/sluice/v1/*.proto.

Run: python scripts/gen_protos.py [--out DIR]. tests/unit/test_stubs.py regenerates into a temporary
directory and fails when the committed stubs differ.
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"


def generate(out: pathlib.Path) -> list[pathlib.Path]:
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "sluice" / "v1").glob("*.proto"))
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{protoc._get_resource_file_name('grpc_tools', '_proto')}",
            f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    written = sorted((out / "sluice" / "v1").glob("*.py*"))
    for path in written:
        text = path.read_text()
        # Generated modules import each other as `sluice.v1.x_pb2`, which is where they live: nothing to fix,
        # but drop the protoc version banner so a tool upgrade alone causes no drift.
        text = re.sub(r"# Protobuf Python Version: .*\n", "", text)
        text = re.sub(r"\n_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)\n", "\n", text)
        text = re.sub(r"GRPC_GENERATED_VERSION = '[^']*'", "GRPC_GENERATED_VERSION = '1.60.0'", text)
        path.write_text(text)
    return written


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, default=ROOT)
    ns = parser.parse_args()
    for path in generate(ns.out):
        print(path.relative_to(ns.out))


if __name__ == "__main__":
    sys.exit(main())
