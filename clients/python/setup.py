"""Builds the tokenselect_client package; the protobuf/gRPC stubs are generated at build time
into tokenselect_client/_generated (never committed). Needs grpcio and protobuf at run time
(Debian: python3-grpcio, python3-protobuf) and protoc + grpc_python_plugin or grpc_tools at
build time."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        import build_stubs

        build_stubs.build(os.path.join(self.build_lib, "tokenselect_client", "_generated"))


setup(
    name="tokenselect-client",
    version="0.1.0",
    packages=["tokenselect_client"],
    py_modules=["build_stubs"],
    install_requires=["grpcio", "protobuf"],
    cmdclass={"build_py": BuildWithStubs},
)
