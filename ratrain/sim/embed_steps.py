"""The simulator's steps for the vocabulary-parallel embedding's calls (NOTE
[vocabulary-parallel embedding], ir/vocab.py; the runtime's: rt/embed_calls.py). As the
head's (NOTE [shard messages], sim/vocab_steps.py), its collectives over the pipeline
group are replayed as the messages they amount to, and the shard's kernels cost the
shard layer's embedding forward and backward, the tables every compute task's seconds
come from (NOTE [a compute task's seconds]).
"""
from __future__ import annotations

import math

from ratrain.ir.tasks import Kind
from ratrain.ir.vocab import stage_embed_layer
from ratrain.sim.steps import Compute, Recv
from ratrain.sim.vocab_steps import _key, _params, _peers, _send

# NOTE [embedding messages]: the runtime's reduce of the lookups and broadcast of their
# gradient are MPI collectives over the replica's pipeline group, replayed as messages
# (NOTE [shard messages]): every stage but 0 sends its lookup (N h floats, summed in
# float32) to stage 0 in E(m), and stage 0's F(m) first waits for all of them and adds
# them (DDR traffic, one pass over each part); stage 0 sends the lookup's gradient to
# every other stage in G(m) (a flat broadcast, as hn's), whose G(m) waits for it.


def _shard_seconds(c, task, direction: str) -> float:
    """The stage's shard's embedding in `direction` (see NOTE [a compute task's seconds];
    task_seconds charges E and G the same)."""
    return c._warm.layer(stage_embed_layer(c.program, task.stage), direction)


def embed_rows(c, task, call) -> list:
    """The shard's lookup, then (not stage 0) its part of the sum to stage 0."""
    steps = [Compute(_shard_seconds(c, task, "fwd"))]
    root = _params(call)["root"]
    if task.stage != root:
        ids, = call.inputs[1:]
        part = 4 * math.prod(ids.shape) * call.inputs[0].shape[-1]  # summed in float32
        steps.append(_send(c, task.stage, root, "emb", task.micro_batch, part))
    return steps


def embed_output_grad(c, task, call) -> list:
    """Stage 0 sends the lookup's gradient to every stage; the others wait for it."""
    root, m, grad = _params(call)["root"], task.micro_batch, call.outputs[0]
    if task.stage != root:
        return [Recv(_key("eg", m, root, task.stage))]
    return [_send(c, root, peer, "eg", m, grad.nbytes) for peer in _peers(c, root)]


def embed_grad(c, task, call) -> list:
    """The shard's embedding backward."""
    return [Compute(_shard_seconds(c, task, "bwd"))]


def waits_for_lookups(c, task) -> list:
    """Stage 0's F of micro-batch m first waits for every other stage's lookup, and adds
    them (NOTE [embedding messages])."""
    if task.kind != Kind.F or task.stage != 0 or stage_embed_layer(c.program, 0) is None:
        return []
    g = c.program.graph
    part = g.micro_batch_size * g.seq_len * int(g.config["hidden_size"]) * 4
    peers = _peers(c, 0)
    return [Recv(_key("emb", task.micro_batch, peer, 0)) for peer in peers] + \
        [Compute(2 * part * len(peers) / c.ddr)]


EMBED_STEPS = {"embed_rows": embed_rows, "embed_output_grad": embed_output_grad,
               "embed_grad": embed_grad}
