"""Memory on transparent huge pages for the weights, which a decode step streams through.

A batch-1 step reads every weight once and is bound by memory bandwidth; on 4 KiB pages each page of a
stream costs a TLB miss and the hardware prefetchers stop at its boundary.  On 2 MiB pages SmolLM2's
products at one row took 7.4-8.8 ms in bf16 against 9.7-11.2 on ordinary pages (2-core AVX-512 BF16
kind, four interleaved swaps in one process: 1.21x-1.50x).  Linux backs an area with huge pages when asked
(madvise) if its transparent huge pages are in "always" or "madvise" mode; elsewhere the same memory
comes on ordinary pages and nothing else changes.
"""

import mmap

import torch

HUGE_PAGE = 2 << 20
ALIGNMENT = 64  # bytes: a cache line, as torch aligns its own allocations


def zeros_on_huge_pages(nbytes: int) -> torch.Tensor:
    """A zeroed uint8 tensor of `nbytes` on the CPU, on huge pages where the OS gives them."""
    if not hasattr(mmap, "MADV_HUGEPAGE") or nbytes < HUGE_PAGE:
        return torch.zeros(nbytes, dtype=torch.uint8)
    area = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    area.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(area, dtype=torch.uint8)  # keeps `area` alive as long as any view of it
    start = -whole.data_ptr() % HUGE_PAGE  # a 2 MiB boundary, so the first huge page is a whole one
    # Touched now, as torch.zeros would: the pages are made at start-up, not inside the first steps.
    return whole[start : start + nbytes].zero_()


def move_to_huge_pages(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of contiguous CPU tensors, side by side in one area on huge pages (most tensors are smaller
    than a huge page)."""
    offsets, end = [], 0
    for tensor in tensors:
        if not tensor.is_contiguous():
            raise ValueError("only contiguous tensors can move to huge pages")
        offsets.append(end)
        end += -(-tensor.nbytes // ALIGNMENT) * ALIGNMENT
    area = zeros_on_huge_pages(end)
    copies = []
    for tensor, offset in zip(tensors, offsets, strict=True):
        copy = area[offset : offset + tensor.nbytes].view(tensor.dtype).view(tensor.shape)
        copies.append(copy.copy_(tensor))
    return copies
