"""Build hook: generate the gRPC stubs from proto/ before the Python files are collected.

Everything else about the distribution lives in pyproject.toml.
"""

import runpy
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithProtos(build_py):
    def run(self) -> None:
        gen = runpy.run_path(str(HERE / "scripts" / "gen_proto.py"))
        gen["generate"](HERE / "proto")
        super().run()


setup(cmdclass={"build_py": BuildWithProtos})
