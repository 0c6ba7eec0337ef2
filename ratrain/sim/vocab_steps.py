"""The simulator's steps for the vocabulary-parallel head's calls (NOTE [vocabulary-parallel
head], ir/vocab.py; the runtime's: rt/vocab_calls.py). Its collectives over the pipeline
group are replayed as the point-to-point messages they amount to (NOTE [shard messages]);
the shard's kernels cost the shard layer's cross-entropy forward and backward, the
tables every compute task's seconds come from (NOTE [a compute task's seconds]).
"""
from __future__ import annotations

import math

from ratrain.ir.tasks import BACKWARDS, Kind
from ratrain.ir.vocab import stage_vocab_layer
from ratrain.sim.costs import crosses_node, message_path
from ratrain.sim.steps import Compute, Recv, Send

# NOTE [shard messages]: the runtime's broadcast of hn(m), all-gather of the statistics
# and reduce of hn's gradient are MPI collectives over the replica's pipeline group. The
# replay has pipeline messages (a Send fires the Recv of the same key on the peer, the
# transfer on the sender's port, on its own channel per peer) and no other cross-stage
# collective, so each is replayed as its messages: the last stage sends hn(m) to every
# other stage in S(m) (a flat broadcast: the root's port carries P - 1 copies, where
# MPICH's binomial tree carries log2 P; at pp 4 that overstates the root's bytes by a
# third), every stage sends its statistics (2 N floats) to every other in S(m) and
# waits for theirs in T(m), and every other stage sends its part of hn's gradient to
# the last stage in T(m), whose backward of m first waits for all of them (the hazard
# rule: it reads gin.mb). A reduce's additions are charged to the last stage as DDR
# traffic, one pass over each part.


def _key(what: str, micro_batch: int, source: int, target: int) -> tuple:
    return what, micro_batch, source, target


def _send(c, stage: int, peer: int, what: str, micro_batch: int, nbytes: float) -> Send:
    latency, rate = message_path(c.profile, crosses_node(c.profile, c.options, stage, peer))
    return Send(_key(what, micro_batch, stage, peer), f"to stage {peer}", latency, nbytes,
                rate)


def _peers(c, stage: int) -> list[int]:
    return [s for s in range(c.options.pp) if s != stage]


def _params(call) -> dict:
    return dict(call.params)


def vocab_hidden(c, task, call) -> list:
    """The last stage copies hn and sends it to every stage; the others wait for it."""
    root, m, hn = _params(call)["root"], task.micro_batch, call.outputs[0]
    if task.stage != root:
        return [Recv(_key("hn", m, root, task.stage))]
    return [Compute(2 * hn.nbytes / c.ddr)] + \
        [_send(c, root, peer, "hn", m, hn.nbytes) for peer in _peers(c, root)]


def _shard_seconds(c, task, direction: str) -> float:
    """The stage's shard's cross-entropy in `direction` (see NOTE [a compute task's
    seconds]; task_seconds charges S and T the same)."""
    return c._warm.layer(stage_vocab_layer(c.program, task.stage), direction)


def vocab_stats(c, task, call) -> list:
    """The shard's cross-entropy forward, then its statistics to every other stage."""
    stats = call.outputs[0]
    part = stats.nbytes // c.options.pp
    return [Compute(_shard_seconds(c, task, "fwd"))] + \
        [_send(c, task.stage, peer, "stats", task.micro_batch, part)
         for peer in _peers(c, task.stage)]


def vocab_grad(c, task, call) -> list:
    """Every other stage's statistics, the shard's cross-entropy backward, then (not the
    last stage) its part of hn's gradient to the last stage."""
    m, root = task.micro_batch, _params(call)["root"]
    waits = [Recv(_key("stats", m, peer, task.stage)) for peer in _peers(c, task.stage)]
    steps = waits + [Compute(_shard_seconds(c, task, "bwd"))]
    if task.stage != root:
        part = 4 * math.prod(call.inputs[0].shape)    # summed in float32
        steps.append(_send(c, task.stage, root, "dh", m, part))
    return steps


def waits_for_hidden_grad(c, task) -> list:
    """The last stage's first backward step of micro-batch m waits for every other
    stage's part of hn's gradient, and adds them (NOTE [shard messages])."""
    if task.kind not in BACKWARDS or task.stage != len(c.program.stages) - 1 or \
            not any(t.kind == Kind.T for t in c.program.tasks[task.stage]):
        return []
    layers = c.program.stages[task.stage]
    if task.kind == Kind.BL and task.layer != layers[-1]:
        return []
    peers = _peers(c, task.stage)
    g = c.program.graph
    part = g.micro_batch_size * g.seq_len * int(g.config["hidden_size"]) * 4
    return [Recv(_key("dh", task.micro_batch, peer, task.stage)) for peer in peers] + \
        [Compute(2 * part * len(peers) / c.ddr)]


VOCAB_STEPS = {"vocab_hidden": vocab_hidden, "vocab_stats": vocab_stats,
               "vocab_loss": lambda c, task, call: [], "vocab_grad": vocab_grad}
