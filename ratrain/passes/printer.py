"""Text form of a Program between passes: options, stages and per-stage task lists."""
from __future__ import annotations

from ratrain.ir.tasks import format_tasks


def format_program(program) -> str:
    o = program.options
    lines = [f"# program: {program.graph.name} pp={o.pp} dp={o.dp} M={o.micro_batches} "
             f"B={o.micro_batch_size} T={o.seq_len} schedule={o.schedule} "
             f"recompute={o.recompute} zero={o.zero} precision={o.precision}"]
    for stage, layers in enumerate(program.stages):
        lines.append(f"stage {stage}: layers {','.join(map(str, layers))}")
    for stage, tasks in sorted(program.tasks.items()):
        lines.append(f"rank {stage}: {format_tasks(tasks)}")
    if program.recompute:
        dropped = " ".join(f"L{l}.mb{m}={mode}" for (l, m), mode in sorted(program.recompute.items()))
        lines.append(f"recompute: {dropped}")
    if program.backward_recovery:  # NOTE [where recovery runs]
        pairs = " ".join(f"{s}.mb{m}" for s, m in sorted(program.backward_recovery))
        lines.append(f"recovered in B: {pairs}")
    return "\n".join(lines)
