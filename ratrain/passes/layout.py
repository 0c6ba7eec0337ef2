"""Layouts inside buffers and of the arena: where each tensor of a buffer sits, in bytes
from its start, and the alignments both keep (the one place they are set).

buffers.py and layer_buffers.py size buffers from these layouts and lower.py addresses
tensors through them, so the memory plan and the lowered calls agree byte for byte.
Tensors are packed in a fixed order at TENSOR_ALIGN-byte boundaries; a layer's workspace
places its intermediates by first fit over their live ranges inside the graph;
plan_memory places whole buffers in a stage's arena at ARENA_ALIGN-byte offsets.
"""
from __future__ import annotations

from functools import lru_cache

from ratrain.ir.graph import LayerGraph, Literal

TENSOR_ALIGN = 16  # bytes between tensors inside a buffer: every tensor aligned for its
                   # dtype and for 128-bit loads
ARENA_ALIGN = 64   # bytes; every buffer's arena offset is a multiple of it (plan_memory):
                   # a buffer starts on a cache line of its own


def align_up(nbytes: int, to: int = TENSOR_ALIGN) -> int:
    """The least multiple of `to` that holds `nbytes`."""
    return -(-nbytes // to) * to


# NOTE [parts a cache line off 1 MiB]: AdamW streams a layer's master, m, v and gradient
# together, and a speculative one also its undo copies. Where the parts of one buffer (m
# and v of opt.L, the three copies of undo.L) sit a multiple of 1 MiB apart, the stream
# runs several times slower on the CPUs measured here (see NOTE [no power-of-two strides],
# calibrate/rt_cases.py): the tiny model with a 4096-row embedding (2^20 parameters, m
# and v 4 MiB apart) took 33.9 ms for that layer's UPD where its 791,040-parameter decoder
# layers took 5.6 ms. Such a part then starts one cache line further on.
STRIDE_GUARD = 1 << 20


def part_stride(nbytes: int) -> int:
    """Bytes from one of a buffer's equal parts of `nbytes` to the next: aligned, and a
    cache line more where that would be a multiple of 1 MiB (NOTE [parts a cache line off
    1 MiB])."""
    step = align_up(nbytes)
    return step + ARENA_ALIGN if step % STRIDE_GUARD == 0 else step


def arena_align(nbytes: int) -> int:
    """The least multiple of ARENA_ALIGN that holds `nbytes`: where the next buffer of
    the arena may start."""
    return align_up(nbytes, ARENA_ALIGN)


def pack(sizes) -> tuple[tuple[int, ...], int]:
    """Offsets of tensors of `sizes` bytes placed one after another; total bytes."""
    offsets, at = [], 0
    for size in sizes:
        offsets.append(at)
        at += align_up(size)
    return tuple(offsets), at


def _live_ranges(graph: LayerGraph, pinned: frozenset) -> dict[int, tuple[int, int, int]]:
    """var id -> (first node, last node, bytes) for every node output not pinned."""
    ranges, end = {}, len(graph.nodes)
    for i, node in enumerate(graph.nodes):
        for o in node.outputs:
            if o.id not in pinned:
                ranges[o.id] = (i, i, o.nbytes)
        for x in node.inputs:
            if not isinstance(x, Literal) and x.id in ranges:
                first, _, size = ranges[x.id]
                ranges[x.id] = (first, i, size)
    for x in graph.outputs:  # results are read after the graph: live to its end
        if not isinstance(x, Literal) and x.id in ranges:
            ranges[x.id] = (ranges[x.id][0], end, ranges[x.id][2])
    return ranges


@lru_cache(maxsize=512)
def graph_workspace(graph: LayerGraph, pinned: frozenset) -> tuple[dict, int]:
    """Offsets of the graph's unpinned intermediates in a workspace, and its size.

    First fit, largest first: each value at the lowest aligned offset clear of every
    value whose live range intersects its own.
    """
    ranges = _live_ranges(graph, pinned)
    placed, offsets = [], {}
    for var_id, (first, last, size) in sorted(ranges.items(), key=lambda kv: (-kv[1][2], kv[0])):
        at = 0
        for lo, hi in sorted((lo, hi) for lo, hi, f, l in placed if f <= last and first <= l):
            if at + size <= lo:
                break
            at = max(at, align_up(hi))
        offsets[var_id] = at
        placed.append((at, at + size, first, last))
    return offsets, max((hi for _, hi, _, _ in placed), default=0)
