"""Our C++ CPU kernels, compiled on first use (make setup does it ahead) and cached by torch."""

import functools
import logging
from pathlib import Path

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("paged_attention_cpu.cpp")


@functools.cache
def cpu_kernels():
    """The compiled module, or None (with a warning) where no C++ compiler is available."""
    from torch.utils.cpp_extension import load

    try:
        return load(
            name="kvchat_paged_attention",
            sources=[str(SOURCE)],
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
        )
    except Exception as error:  # no compiler, no headers: the portable torch path still works
        log.warning("CPU attention kernels unavailable, using the torch path: %s", error)
        return None


if __name__ == "__main__":
    print("compiled" if cpu_kernels() is not None else "unavailable")
