"""Session KV on disk: one safetensors file per session, checked before it is trusted.

The KV is kept in the form the pool stores it (int8 with its scales, or the compute dtype).  The metadata
carries the model fingerprint (weights, quantization, compute dtype), the KV's stored dtype and a SHA-256
over every tensor's bytes; a missing, truncated, corrupted or mismatched file raises SnapshotError, and the
caller recomputes instead.  Files are written to a temporary name and renamed, so a crash never leaves
half a file.
"""

import hashlib
import json
import re
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from engine.kv_cache import SlotsKv
from engine.session_kv import EvictionRecord, SessionSnapshot

FORMAT = "kvchat-session-kv-2"  # 2: importance summed; no per-slot observation counts
SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
TENSOR_NAMES = ("keys", "values", "importance", "token_ids", "positions", "text_token_ids")
SCALED_TENSOR_NAMES = (*TENSOR_NAMES, "scales")  # an int8 KV cache's


class SnapshotError(ValueError):
    """A session KV file that cannot be used; the message says why."""


def session_file(directory: Path, session_id: str) -> Path:
    if not SESSION_ID.match(session_id):
        raise ValueError(f"session id {session_id!r} may only hold letters, digits, '-' and '_'")
    return directory / f"{session_id}.safetensors"


def save(snapshot: SessionSnapshot, path: Path, fingerprint: str) -> int:
    """Write the snapshot; returns the file size in bytes."""
    tensors = tensors_of(snapshot)
    metadata = {
        "format": FORMAT,
        "session_id": snapshot.session_id,
        "fingerprint": fingerprint,
        "dtype": str(snapshot.kv.keys.dtype),
        "evicted_tokens": str(snapshot.evicted_tokens),
        "evictions": json.dumps([asdict(record) for record in snapshot.evictions]),
        "sha256": checksum(tensors),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    save_file(tensors, partial, metadata=metadata)
    partial.replace(path)
    return path.stat().st_size


def load(path: Path, fingerprint: str, dtype: torch.dtype) -> SessionSnapshot:
    """`dtype`: the KV dtype the pool stores, which the file's must equal."""
    if not path.is_file():
        raise SnapshotError(f"{path.name} does not exist")
    try:
        tensors = load_file(path)
        with safe_open(path, framework="pt") as file:
            metadata = file.metadata() or {}
    except (SafetensorError, OSError, ValueError) as error:
        raise SnapshotError(f"{path.name} is unreadable ({error})") from None
    check(metadata, tensors, fingerprint, dtype, path.name)
    return SessionSnapshot(
        session_id=metadata["session_id"],
        text_token_ids=tensors["text_token_ids"].tolist(),
        token_ids=tensors["token_ids"].tolist(),
        positions=tensors["positions"].tolist(),
        kv=SlotsKv(tensors["keys"], tensors["values"], tensors.get("scales"), tensors["importance"]),
        evicted_tokens=int(metadata["evicted_tokens"]),
        evictions=[eviction_record(record) for record in json.loads(metadata["evictions"])],
    )


def eviction_record(fields: dict) -> EvictionRecord:
    spans = [(start, end) for start, end in fields.pop("kept_spans")]
    return EvictionRecord(**fields, kept_spans=spans)


def check(metadata: dict, tensors: dict, fingerprint: str, dtype: torch.dtype, name: str) -> None:
    if metadata.get("format") != FORMAT:
        raise SnapshotError(f"{name} is not a session KV file of this version")
    if metadata.get("fingerprint") != fingerprint or metadata.get("dtype") != str(dtype):
        raise SnapshotError(f"{name} was computed by another model, dtype or KV cache dtype")
    expected = SCALED_TENSOR_NAMES if dtype == torch.int8 else TENSOR_NAMES
    if set(tensors) != set(expected) or metadata.get("sha256") != checksum(tensors):
        raise SnapshotError(f"{name} is corrupted (checksum mismatch)")


def tensors_of(snapshot: SessionSnapshot) -> dict[str, torch.Tensor]:
    kv = snapshot.kv
    tensors = {
        "keys": kv.keys.contiguous(),
        "values": kv.values.contiguous(),
        "importance": kv.importance.float().contiguous(),
        "token_ids": torch.tensor(snapshot.token_ids, dtype=torch.long),
        "positions": torch.tensor(snapshot.positions, dtype=torch.long),
        "text_token_ids": torch.tensor(snapshot.text_token_ids, dtype=torch.long),
    }
    if kv.scales is not None:
        tensors["scales"] = kv.scales.contiguous()
    return tensors


def checksum(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in SCALED_TENSOR_NAMES if "scales" in tensors else TENSOR_NAMES:
        tensor = tensors[name]
        digest.update(name.encode())
        digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
