"""Every alignment is set in passes/layout.py: tensors inside buffers at TENSOR_ALIGN,
buffers in the arena at ARENA_ALIGN (which plan_memory places and checks by)."""
from ratrain.passes import layout, plan_memory


def test_alignments_live_in_layout():
    assert (layout.TENSOR_ALIGN, layout.ARENA_ALIGN) == (16, 64)
    assert plan_memory.ALIGNMENT == layout.ARENA_ALIGN
    assert [layout.align_up(n) for n in (0, 1, 16, 17)] == [0, 16, 16, 32]
    assert [plan_memory.align(n) for n in (1, 64, 65)] == [64, 64, 128]
    assert layout.pack([3, 16, 1]) == ((0, 16, 32), 48)
