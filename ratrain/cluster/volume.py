"""Planned communication volume: the bytes each rank of a compiled program puts on its
link per training step, read from the per-stage rows the runtime walks (code/
stage<N>.tasks.json, a periodic program's expanded): pipeline SENDs and the DP collectives
with the algorithm's bytes per member. The cluster's traffic test compares it with what
the link's qdisc counted.
"""
from __future__ import annotations

from pathlib import Path

from ratrain.program_format.call_ops import CallOp, linked_ops, registered
from ratrain.program_format.codec import read_runtime, read_stage_rows
from ratrain.program_format.table import PythonStep, expanded_rows
from ratrain.sim.collectives import collective_cost
from ratrain.sim.costs import gather_bytes, scatter_bytes


# NOTE [collective bytes]: what one member of an n-member group sends, for S bytes of
# input (reduce-scatter, all-reduce) or output (all-gather): ring all-reduce 2(n-1)/n S,
# reduce-scatter and all-gather (n-1)/n S each. For n = 2 every algorithm MPICH picks
# (ring, recursive doubling or halving, Rabenseifner) sends exactly these bytes: the
# two members swap either the whole buffer or its halves. Larger groups need the
# library's choice per size; the cluster tests and bench use two ranks.
# The bytes are the ring's of sim/collectives.py, whatever the profile's algorithm.


def collective_bytes(op: str, members: int, nbytes: float) -> float:
    """Bytes one member sends (NOTE [collective bytes])."""
    return collective_cost(op, members, nbytes, 0.0, 1.0, "ring").nbytes


def _sync_bytes(call, options) -> float:
    op = dict(call.params)["op"]
    return 0.0 if op == "wait" else collective_bytes(op, options.dp, call.inputs[0].nbytes)


def _prefetch_bytes(call, options) -> float:
    params = dict(call.params)
    return 0.0 if not params["gather"] or params.get("redo") else \
        collective_bytes("allgather", options.dp, gather_bytes(call, options.dp))


# Bytes each call that puts traffic on the link sends from this rank (see NOTE [one table
# of call ops]: the ops whose Traffic is a message, a DP collective or the world's sum)
TRAFFIC = registered({
    CallOp.SEND: lambda call, options: call.inputs[0].nbytes,
    CallOp.GRAD_SYNC: _sync_bytes,
    CallOp.GRAD_SCATTER: lambda call, options: collective_bytes(
        "reduce_scatter", options.dp, scatter_bytes(call)),
    CallOp.PREFETCH_VIEW: _prefetch_bytes,
    CallOp.GATHER_VIEW: lambda call, options: collective_bytes(
        "allgather", options.dp, gather_bytes(call, options.dp)),
    # one float64 summed over the world
    CallOp.GLOBAL_NORM: lambda call, options: collective_bytes(
        "allreduce", options.pp * options.dp, 8),
}, "cluster/volume.py TRAFFIC", linked_ops())


def _call_bytes(call, options) -> float:
    """Bytes a lowered runtime call sends from this rank (0 for local calls)."""
    counted = TRAFFIC.get(call.op)
    return 0.0 if counted is None else counted(call, options)


def stage_bytes(rows, options) -> float:
    """Bytes a rank of the rows' stage sends in one step."""
    return sum(_call_bytes(step.call, options) for _, steps, _ in expanded_rows(rows)
               for step in steps if isinstance(step, PythonStep))


def _read(directory: Path):
    """(RuntimeProgram, stage -> StageRows) of a program directory."""
    runtime = read_runtime((directory / "runtime.json").read_text(), str(directory))
    rows = {}
    for stage in range(runtime.options.pp):
        path = directory / "code" / f"stage{stage}.tasks.json"
        rows[stage] = read_stage_rows(path.read_text(), str(path))
    return runtime, rows


def planned_volume(program_dir) -> dict[int, float]:
    """rank -> bytes it sends per step, for a program directory of `ratrain compile`."""
    runtime, rows = _read(Path(program_dir))
    options = runtime.options
    per_stage = {stage: stage_bytes(rows[stage], options) for stage in range(options.pp)}
    return {runtime.rank(stage, replica): per_stage[stage]
            for stage in range(options.pp) for replica in range(options.dp)}


def message_bytes(program_dir) -> dict[str, int]:
    """Task text of every pipeline SEND ("0SEND_F3") -> bytes of its message."""
    _, rows = _read(Path(program_dir))
    sizes = {}
    for stage_rows in rows.values():
        for task, steps, _ in expanded_rows(stage_rows):
            for step in steps:
                if isinstance(step, PythonStep) and step.call.op == CallOp.SEND:
                    sizes[str(task)] = step.call.inputs[0].nbytes
    return sizes
