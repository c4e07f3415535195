"""Our C++ CPU kernels, compiled on first use (make setup does it ahead) and cached by torch."""

import functools
import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)
SOURCES = sorted(str(path) for path in Path(__file__).parent.glob("*.cpp"))


@functools.cache
def cpu_kernels():
    """The compiled module, or None (with a warning) where no C++ compiler is available."""
    from torch.utils.cpp_extension import load

    # One build per Python environment: it is compiled against that environment's torch, and two
    # environments (or checkouts) sharing torch's default cache folder would rebuild over each other.
    build_directory = Path(sys.prefix) / "kvchat-kernels"
    try:
        build_directory.mkdir(exist_ok=True)
        return load(
            name="kvchat_cpu_kernels",
            sources=SOURCES,
            build_directory=str(build_directory),
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
        )
    except Exception as error:  # no compiler, no headers: the portable torch path still works
        log.warning("CPU kernels unavailable, using the torch path: %s", error)
        return None


if __name__ == "__main__":
    print("compiled" if cpu_kernels() is not None else "unavailable")
