"""NOTE [parts a cache line off 1 MiB] (passes/layout.py): the parts of a layer's opt.L
(m, v) and undo.L (master, m, v copies) never start a multiple of 1 MiB apart, so AdamW
does not stream them at the stride that runs several times slower; other sizes keep their
aligned layout."""

from ratrain import models
from ratrain.compiler import compile_graph, resolve_options, trace_for
from ratrain.hw.profiles import load_profile
from ratrain.passes.lower_state import state_slots, undo_slots
from ratrain.passes.layout import align_up, part_stride


def test_a_part_of_a_multiple_of_1_mib_starts_a_cache_line_further():
    assert part_stride(4 << 20) == (4 << 20) + 64
    assert part_stride(4 * 791040) == align_up(4 * 791040) == 4 * 791040
    assert part_stride(4 * 1000 + 2) == align_up(4 * 1000 + 2)


def _program(vocab: int):
    config = dict(models.get_config("tiny"), vocab_size=vocab)
    profile = load_profile("cpu")
    options = resolve_options(config, profile, micro_batches=2, micro_batch_size=1, seq_len=16,
                              update_rule="commit", clip=1.0)  # clip: a NORM, so undo.L
    return compile_graph(trace_for(config, "tiny", options), options, profile=profile)[0]


def test_no_layer_streams_parts_1_mib_apart():
    """An embedding of 4096 x 256 = 2^20 parameters: its m and v, and its undo copies,
    were exactly 4 MiB apart; now no two parts of a buffer are a multiple of 1 MiB apart,
    and the memory plan holds the longer buffers."""
    program = _program(4096)
    offsets = program.memory.stages[0].offsets
    for layer in range(len(program.graph.layers)):
        _, m, v, _, shard = state_slots(program, layer)
        parts = [(m.buffer, m.offset), (v.buffer, v.offset)] + \
            [(s.buffer, s.offset) for s in undo_slots(program, layer)]
        for buffer in {b for b, _ in parts}:
            starts = [offsets[buffer][0] + o for b, o in parts if b == buffer]
            assert all((a - b) % (1 << 20) for a in starts for b in starts if a != b), layer
            assert offsets[buffer][1] >= max(starts) - offsets[buffer][0] + 4 * shard
