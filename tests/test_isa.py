"""The instruction set a test pass runs under is the one `./zoo test` says it is (ZOO_TEST_ISA: unset is the
CPU's own set, `avx2` the capped pass of docs/development.md): llama.cpp's build and torch's kernels report
it, so a pass said to be AVX2 cannot silently compute with AVX-512."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.numerics

CPU_FLAGS = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
CAPPED = os.environ.get("ZOO_TEST_ISA") == "avx2"


def test_llama_cpp_computes_with_the_pass_instruction_set() -> None:
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is built by ./zoo setup")
    info = llama_cpp.llama_print_system_info().decode()
    assert "AVX2 = 1" in info, info
    assert ("/isa/avx2/" in llama_cpp.__file__) == CAPPED, llama_cpp.__file__  # the pass's own build
    assert ("AVX512 = 1" in info) == ("avx512f" in CPU_FLAGS and not CAPPED), info


def test_torch_computes_with_the_pass_instruction_set() -> None:
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    if CAPPED or "avx512f" not in CPU_FLAGS:
        assert capability == "AVX2"
    else:
        assert capability.startswith("AVX512")


def test_numpy_dispatches_to_the_pass_instruction_set() -> None:
    from numpy._core._multiarray_umath import __cpu_features__ as features

    x86_v4 = {"avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq"} <= CPU_FLAGS
    assert features["AVX2"]
    assert features["X86_V4"] == (x86_v4 and not CAPPED)
