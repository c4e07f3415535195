"""The weights and the KV pool live on transparent huge pages where Linux gives them."""

from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.huge_pages import HUGE_PAGE, move_to_huge_pages, zeros_on_huge_pages
from engine.layers.linear import Linear

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_huge_pages = pytest.mark.skipif(
    not THP_MODE.exists() or "[never]" in THP_MODE.read_text(), reason="no transparent huge pages here"
)


def huge_bytes_of_mapping(address: int) -> int:
    """AnonHugePages of the memory mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split()[0]
        if not first.endswith(":"):  # a mapping's header: start-end perms offset device inode path
            start, end = (int(bound, 16) for bound in first.split("-"))
            inside = start <= address < end
        elif inside and first == "AnonHugePages:":
            return int(line.split()[1]) * 1024
    raise LookupError(f"no mapping holds {address:#x}")


@needs_huge_pages
def test_zeros_on_huge_pages_start_on_a_huge_page_and_are_zero():
    area = zeros_on_huge_pages(3 * HUGE_PAGE + 5)
    assert area.numel() == 3 * HUGE_PAGE + 5 and area.dtype == torch.uint8
    assert area.data_ptr() % HUGE_PAGE == 0
    assert not area.any()
    assert huge_bytes_of_mapping(area.data_ptr()) >= 3 * HUGE_PAGE


def test_moved_tensors_keep_their_values_shapes_and_dtypes_side_by_side():
    tensors = [torch.randn(1000, 700), torch.arange(3, dtype=torch.int8), torch.randn(5, 7).bfloat16()]
    copies = move_to_huge_pages(tensors)
    for tensor, copy in zip(tensors, copies, strict=True):
        assert copy.dtype == tensor.dtype and copy.shape == tensor.shape and torch.equal(copy, tensor)
        assert copy.data_ptr() % 64 == 0 and copy.data_ptr() != tensor.data_ptr()
    assert copies[1].data_ptr() - copies[0].data_ptr() == tensors[0].nbytes  # one area
    with pytest.raises(ValueError, match="contiguous"):
        move_to_huge_pages([torch.randn(4, 4).t()])


@needs_huge_pages
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_engine_streams_its_weights_and_its_kv_from_huge_pages(smollm2_dir, dtype):
    llm = LLM(str(smollm2_dir), dtype=dtype, num_kv_blocks=64)
    pool = llm.engine.runner.kv_cache.tensor
    assert pool.dtype == getattr(torch, dtype) and pool.shape[2] == 64 and not pool.any()
    assert huge_bytes_of_mapping(pool.data_ptr()) >= pool.nbytes - HUGE_PAGE
    model = llm.engine.runner.model
    read = [m.packed if m.packed is not None else m.weight for m in model.modules() if isinstance(m, Linear)]
    moved = sum(tensor.nbytes for tensor in {id(tensor): tensor for tensor in read}.values())
    assert huge_bytes_of_mapping(read[0].data_ptr()) >= moved - 2 * HUGE_PAGE  # the area's partial ends
    if dtype == "float32":  # lm_head reads the embeddings it is tied to: still one tensor
        assert model.lm_head.weight is model.embed_tokens.weight
    reply = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=4))
    assert "Paris" in reply[0].outputs[0].text
