"""Our C++ kernels compile for the CPU kinds besides the one running the tests: each source is checked
(g++ -fsyntax-only) for AVX2 only and for AVX-512 BF16 without AMX; the build itself covers this machine.
Where a kernel fails to build, the engine falls back to the torch path with a warning, so a slip in a code
path this machine does not compile (an AMX-only name used outside its #if) would otherwise go unnoticed
until a machine of that kind runs it.

torch's headers are parsed once per architecture into a precompiled header: parsing them for each of the
18 checks took 244 s of a 30-minute `make test` on the AVX2 kind's 2 cores."""

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


def compiler(architecture: str) -> list[str]:
    includes = [f"-I{path}" for path in [*include_paths(), sysconfig.get_paths()["include"]]]
    return ["g++", "-std=c++17", f"-march={architecture}", "-DTORCH_EXTENSION_NAME=check", *includes]


def precompiled_torch(directory: Path, architecture: str) -> Path:
    """A header including torch/extension.h, beside its precompiled form for `architecture`."""
    header = directory / architecture / "torch_first.h"
    header.parent.mkdir()
    header.write_text("#include <torch/extension.h>\n")
    command = [*compiler(architecture), "-x", "c++-header", str(header), "-o", f"{header}.gch"]
    subprocess.run(command, check=True, capture_output=True)
    return header


def syntax_errors(source: str, architecture: str, header: Path) -> str:
    # A precompiled header that cannot be used (flags differ) is an error, not a silent full parse.
    command = [
        *compiler(architecture),
        "-Werror=invalid-pch",
        "-fsyntax-only",
        "-include",
        str(header),
        source,
    ]
    found = subprocess.run(command, capture_output=True, text=True)
    return "" if found.returncode == 0 else f"{Path(source).name} for {architecture}:\n{found.stderr[-2000:]}"


@pytest.mark.skipif(shutil.which("g++") is None or platform.machine() != "x86_64", reason="needs g++ on x86")
def test_every_kernel_source_compiles_for_avx2_and_for_avx512_bf16_without_amx(tmp_path):
    with ThreadPoolExecutor(max_workers=2) as pool:
        made = pool.map(lambda architecture: precompiled_torch(tmp_path, architecture), ARCHITECTURES)
        headers = dict(zip(ARCHITECTURES, made, strict=True))
        jobs = [
            (source, architecture, header) for source in SOURCES for architecture, header in headers.items()
        ]
        errors = [error for error in pool.map(lambda job: syntax_errors(*job), jobs) if error]
    assert not errors, "\n".join(errors)
