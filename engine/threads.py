"""Threads that run torch beside the engine, and how many threads torch gives each of them.

torch's CPU builds run parallel ops on OpenMP (GNU libgomp), which gives every thread that runs one its
own team of worker threads, kept for as long as that thread lives.  libgomp's manual: once it manages
more threads than there are CPUs, idle workers spin only ~100 times before they sleep.  The engine's step
runs hundreds of short parallel regions, so then each one waits for sleeping workers to wake.  Measured
(python -m bench.omp_threads, 2 cores, two runs): streamed decode fell from 38-47 to 22-25 tokens/s once
another live thread had run one parallel matrix product, and stayed at 38-46 when that thread had ended
or ran with one intra-op thread.  So torch work off the engine thread runs on a passing thread or
single-threaded.

torch.set_num_threads sets the calling thread's count and also the count that threads started later
begin with: a helper that went single-threaded before the engine's thread started left the engine with
one thread.  So each of our threads sets its own count when it starts.
"""

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")
DEFAULT_THREADS = torch.get_num_threads()  # torch's choice for this machine, read before our threads run


def use_default_threads() -> None:
    torch.set_num_threads(DEFAULT_THREADS)


def single_threaded_torch() -> None:
    """For threads that live on (writers, the query encoder): they never own an OpenMP team."""
    torch.set_num_threads(1)


def run_in_passing_thread(work: Callable[..., T], *args) -> T:
    """work(*args) with all cores, on a new thread that ends with the call, taking its team with it."""
    with ThreadPoolExecutor(1, thread_name_prefix="torch-passing", initializer=use_default_threads) as thread:
        return thread.submit(work, *args).result()


async def to_passing_thread(work: Callable[..., T], *args) -> T:
    """asyncio.to_thread for torch work: the executor's threads live on, so the work gets its own."""
    return await asyncio.to_thread(run_in_passing_thread, work, *args)
