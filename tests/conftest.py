import os
from pathlib import Path

import pytest

from engine.default_model import DEFAULT_CACHE_DIR, default_model_dir
from engine.testing.tiny_models import TINY_CONFIGS, build_tiny_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return default_model_dir(Path(os.environ.get("KVCHAT_MODEL_CACHE_DIR", DEFAULT_CACHE_DIR)))


@pytest.fixture(scope="session")
def tiny_model_dirs(smollm2_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    return {family: build_tiny_model(family, smollm2_dir, root / family) for family in TINY_CONFIGS}
