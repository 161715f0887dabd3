"""Build hook of the stoker package: generates the protobuf and gRPC stubs
(stoker/v1/*_pb2.py, *_pb2_grpc.py, *.pyi) from the repository's proto/
folder with grpcio-tools before the package is built. The stubs are build
output, never committed. STOKER_PROTO_DIR names another proto/ folder (for a
build from a copy of this folder alone)."""

import os
import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent


def proto_dir() -> pathlib.Path:
    d = pathlib.Path(os.environ.get("STOKER_PROTO_DIR", HERE.parent.parent / "proto"))
    if not (d / "stoker" / "v1" / "common.proto").is_file():
        raise SystemExit(f"stoker: no stoker/v1/*.proto under {d} (set STOKER_PROTO_DIR)")
    return d


def generate_stubs() -> None:
    from grpc_tools import protoc  # a build requirement

    src = proto_dir()
    protos = sorted(str(p.relative_to(src)) for p in (src / "stoker" / "v1").glob("*.proto"))
    args = [
        "protoc",
        f"-I{src}",
        f"--python_out={HERE}",
        f"--pyi_out={HERE}",
        f"--grpc_python_out={HERE}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("stoker: protoc failed on " + " ".join(protos))
    init = HERE / "stoker" / "v1" / "__init__.py"
    init.write_text('"""Generated from proto/stoker/v1 at build time."""\n')


class BuildWithStubs(build_py):
    def run(self) -> None:
        generate_stubs()
        super().run()


# Metadata generation already lists the stoker.v1 package, so the stubs are
# made before setup() runs, and again by build_py (a no-op when unchanged).
generate_stubs()
setup(cmdclass={"build_py": BuildWithStubs})
