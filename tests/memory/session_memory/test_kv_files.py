import pytest
import torch

from engine.kv_cache import SlotsKv
from engine.quantization import quantize_int8
from engine.session_kv import EvictionRecord, SessionSnapshot
from memory.session_memory import kv_files


def snapshot(dtype=torch.float32) -> SessionSnapshot:
    """Five slots of KV (2 layers, 3 KV heads, head_dim 8) as a pool of `dtype` stores them."""
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(2, 5, 3, 8, generator=generator)
    if dtype == torch.int8:
        (keys, key_scales), (values, value_scales) = quantize_int8(keys), quantize_int8(keys * 2)
        kv = SlotsKv(keys, values, torch.stack([key_scales, value_scales]), torch.rand(5))
    else:
        kv = SlotsKv(keys.to(dtype), (keys * 2).to(dtype), None, torch.rand(5))
    record = EvictionRecord(1.5, 6, 5, [(0, 2), (3, 6)])
    return SessionSnapshot(
        "abc", [1, 2, 3, 4, 5, 6], [1, 2, 4, 5, 6], [0, 1, 3, 4, 5], kv, evicted_tokens=1, evictions=[record]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_a_saved_snapshot_loads_back_identical(tmp_path, dtype):
    path = kv_files.session_file(tmp_path, "abc")
    original = snapshot(dtype)
    size = kv_files.save(original, path, "model-a")
    assert size == path.stat().st_size > 0
    loaded = kv_files.load(path, "model-a", dtype)
    assert torch.equal(loaded.kv.keys, original.kv.keys) and torch.equal(loaded.kv.values, original.kv.values)
    if dtype == torch.int8:
        assert loaded.kv.keys.dtype == torch.int8 and torch.equal(loaded.kv.scales, original.kv.scales)
    else:
        assert loaded.kv.scales is None
    assert loaded.positions == original.positions and loaded.text_token_ids == original.text_token_ids
    assert loaded.evictions == original.evictions and loaded.evicted_tokens == 1


def test_damaged_or_foreign_files_are_refused(tmp_path):
    path = kv_files.session_file(tmp_path, "abc")
    kv_files.save(snapshot(), path, "model-a")
    with pytest.raises(kv_files.SnapshotError, match="another model, dtype or KV cache dtype"):
        kv_files.load(path, "model-b", torch.float32)
    for other in torch.bfloat16, torch.int8:
        with pytest.raises(kv_files.SnapshotError, match="another model, dtype or KV cache dtype"):
            kv_files.load(path, "model-a", other)
    int8_path = kv_files.session_file(tmp_path, "int8")
    kv_files.save(snapshot(torch.int8), int8_path, "model-a")
    with pytest.raises(kv_files.SnapshotError, match="KV cache dtype"):
        kv_files.load(int8_path, "model-a", torch.float32)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(kv_files.SnapshotError, match="checksum"):
        kv_files.load(path, "model-a", torch.float32)
    path.write_bytes(bytes(data[:200]))
    with pytest.raises(kv_files.SnapshotError, match="unreadable"):
        kv_files.load(path, "model-a", torch.float32)
    with pytest.raises(kv_files.SnapshotError, match="does not exist"):
        kv_files.load(tmp_path / "missing.safetensors", "model-a", torch.float32)


@pytest.mark.parametrize("bad", ["../etc/passwd", "a/b", "", "x" * 200, "dot.dot"])
def test_session_ids_cannot_escape_the_directory(tmp_path, bad):
    with pytest.raises(ValueError, match="may only hold"):
        kv_files.session_file(tmp_path, bad)
