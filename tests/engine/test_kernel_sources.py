"""Our C++ kernels compile for the CPU kinds besides the one running the tests: each source is checked
(g++ -fsyntax-only) for AVX2 only and for AVX-512 BF16 without AMX; the build itself covers this machine.
Where a kernel fails to build, the engine falls back to the torch path with a warning, so a slip in a code
path this machine does not compile (an AMX-only name used outside its #if) would otherwise go unnoticed
until a machine of that kind runs it."""

import platform
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from torch.utils.cpp_extension import include_paths

from engine.kernels import SOURCES

ARCHITECTURES = ("haswell", "cooperlake")


def syntax_errors(source: str, architecture: str) -> str:
    includes = [f"-I{path}" for path in [*include_paths(), sysconfig.get_paths()["include"]]]
    command = ["g++", "-std=c++17", "-fsyntax-only", f"-march={architecture}", *includes, source]
    found = subprocess.run([*command, "-DTORCH_EXTENSION_NAME=check"], capture_output=True, text=True)
    return "" if found.returncode == 0 else f"{Path(source).name} for {architecture}:\n{found.stderr[-2000:]}"


@pytest.mark.skipif(shutil.which("g++") is None or platform.machine() != "x86_64", reason="needs g++ on x86")
def test_every_kernel_source_compiles_for_avx2_and_for_avx512_bf16_without_amx():
    jobs = [(source, architecture) for source in SOURCES for architecture in ARCHITECTURES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        errors = [error for error in pool.map(lambda job: syntax_errors(*job), jobs) if error]
    assert not errors, "\n".join(errors)
