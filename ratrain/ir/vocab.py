"""The vocabulary-parallel layers' facts (NOTE [vocabulary-parallel head], NOTE
[vocabulary-parallel embedding]): which layers are the LM head's and the input
embedding's row shards, which rows each holds, and how a shard's parameter is named.
Read by the passes, the runtime (a shard's rows of an HF weight) and the checkpoint
writer (the shards gathered back).
"""
from __future__ import annotations

import re

import numpy as np

VOCAB_KIND = "vocab"                    # layer kind of one shard of the LM head's rows
FINAL_NORM_KIND = "final_norm"          # the head without its LM head: the final RMSNorm
EMBED_KIND = "embed_rows"               # layer kind of one shard of the embedding's rows

# NOTE [vocabulary-parallel head]: the LM head's weight W [V, h] and its cross-entropy
# are the last stage's alone in a plain pipeline, and on the node16 profile that stage
# bounds every schedule (issue 43). Under --vocab-parallel (models/trace.split_head, when
# the compiler traces the model) stage s holds rows [s V/P, (s+1) V/P) of W as a layer
# of its own (kind `vocab`: the fused cross-entropy over the shard, traced for its costs
# and buffers), with its own master, moments, view and gradient, synced and updated by
# the per-layer SYNC/UPD/PREF like any layer. The last stage keeps the final RMSNorm
# (kind `final_norm`), and its F ends in the normalised hidden state hn. Per micro-batch
# m every stage runs (passes/lower_vocab.py, rt/vocab_calls.py)
#   S(m): hn(m) broadcast from the last stage over the replica's pipeline group (non-
#         blocking), the shard's log-sum-exp lse_s per token (the fused kernel's forward
#         on the shard's rows) and target logit (zero off the shard), which start a
#         non-blocking all-gather over the group;
#   T(m): lse = log sum_s exp(lse_s) (float64, stage order: the same bits on every
#         stage), the loss mean(lse - target logit) (recorded by the last stage), then the
#         fused kernel's backward on the shard with that lse: the shard's weight gradient
#         dW_s += G^T hn and its part G W_s of hn's gradient, G = (softmax - onehot) /
#         (M N), summed over the group into the last stage's gin.mb by a non-blocking
#         reduce that its B(m) waits for (the hazard rule).
# So the loss is the same function of the logits as the unsplit head's, and each shard's
# gradient that of its rows. Not bit for bit: the fused kernel sums each token's
# exponentials over the whole vocabulary in one float32 running sum (rescaled chunk by
# chunk), while here each shard sums its own rows and the shards' sums are combined by a
# log-sum-exp in float64 (another reduction order, other roundings); the target logit
# is a dot product instead of a GEMM's element, and hn's gradient is P partial sums
# added in MPI's reduction order where the fused kernel adds every chunk's GEMM into one
# float32 accumulator. The losses agree within about 1e-7 relative per step
# (tests/rt/test_vocab_parallel_mpi.py asserts 1e-6 over 30 steps). Where S and T go in
# the task lists, and why every stage holds one micro-batch more: NOTE
# [vocabulary-parallel schedule] (passes/schedule_vocab.py). `--vocab-parallel both` (the
# bare flag) spreads the input embedding's rows the same way: NOTE [vocabulary-parallel
# embedding].

# NOTE [vocabulary-parallel embedding]: with the head split, stage 0 still holds the input
# embedding E [V, h], whose AdamW and DP sync (a vocabulary-sized layer's) follow stage
# 0's last backward and, on the node16 profile, end the step (NOTE [vocabulary-parallel
# head on the node], tests/sim/test_node16_vocab.py). Under --vocab-parallel both
# (models/trace.split_embedding) the embed layer leaves the pipeline: its layers are the
# decoders and the final norm, numbered from 0, and stage s holds rows [s V/P, (s+1) V/P)
# of E as a layer of its own after the head's shards (kind `embed_rows`: the embedding
# lookup on the shard, traced for its costs and buffers; HF name with the rows,
# `model.embed_tokens.weight[0:8000]`), synced and updated by the per-layer SYNC/UPD/PREF
# on every stage, each a P-th of the whole. Stage 0's F starts from in.mb like any later
# stage's, and its B ends in gout.mb. Per micro-batch m every stage runs
# (passes/lower_embed.py, rt/embed_calls.py)
#   E(m): the micro-batch's ids, the shard's rows of those in [lo, hi) and zero rows
#         elsewhere, summed over the replica's pipeline group into stage 0's in.mb by a
#         non-blocking reduce that stage 0's F(m) waits for (the hazard rule);
#   G(m): stage 0's gout.mb (the gradient of the embedding's output, written by its B(m))
#         broadcast over the group (non-blocking; stage 0 first adds its own rows, the
#         others wait for it by the hazard rule), and the embedding's backward restricted
#         to the shard's rows: grad[id - lo] += dh[n] for every token n whose id is in
#         [lo, hi), in token order.
# Every token's id is in exactly one shard, so the reduce adds zeros to one row: the sum
# is that row, bit for bit, in any precision; and each row's gradient takes the same
# additions in the same order as the whole embedding's backward kernel (which adds each
# token's row into grad.L), so the embedding's numbers are the unsplit program's: under
# MPI --vocab-parallel both trains to the bits of head (tests/rt/test_vocab_parallel_mpi.py;
# the reference executor runs the whole embedding's backward as numpy's rule, which sums
# a micro-batch's rows before adding them, so there only the first step agrees bit for
# bit). The pipeline has one layer fewer, so P is at most the decoders + 1. Tied
# embeddings: embed shard s and head shard s bind the same rows (the same name) on the
# same stage, so their TIE adds two local copies and crosses no link. Where E and G go:
# NOTE [vocabulary-parallel schedule].

_SHARD = re.compile(r"(?P<base>.+)\[(?P<lo>\d+):(?P<hi>\d+)\]")


def shard_name(base: str, lo: int, hi: int) -> str:
    """The name of rows [lo, hi) of HF parameter `base`: `lm_head.weight[0:8000]`."""
    return f"{base}[{lo}:{hi}]"


def parse_shard(name: str) -> tuple[str, int, int] | None:
    """(HF name, lo, hi) of a shard's name; None for a whole parameter's."""
    match = _SHARD.fullmatch(name)
    return None if match is None else (match["base"], int(match["lo"]), int(match["hi"]))


def base_name(name: str) -> str:
    """The HF parameter a (shard's) name reads: itself, or the shard's whole weight."""
    shard = parse_shard(name)
    return name if shard is None else shard[0]


def param_value(params: dict, name: str):
    """A parameter by (shard) name from HF-named arrays: a shard is its rows."""
    shard = parse_shard(name)
    if shard is None:
        return params[name]
    base, lo, hi = shard
    return params[base][lo:hi]


def merge_shards(params: dict) -> dict:
    """HF-named arrays from arrays some of which are row shards (named by shard_name):
    each sharded weight's rows concatenated in row order."""
    out, shards = {}, {}
    for name, value in params.items():
        shard = parse_shard(name)
        if shard is None:
            out[name] = value
        else:
            shards.setdefault(shard[0], []).append((shard[1], value))
    for base, rows in shards.items():
        out.setdefault(base, np.concatenate([v for _, v in sorted(rows, key=lambda r: r[0])]))
    return out


def whole_shapes(pairs) -> dict:
    """HF name -> shape of (name, shape) pairs some of which name row shards: a sharded
    weight's rows added up, each shard once (tied copies bind one shard twice), unless a
    layer holds it whole."""
    out, parts = {}, {}
    for name, shape in pairs:
        shard = parse_shard(name)
        if shard is None:
            out[name] = tuple(shape)
        else:
            parts.setdefault(shard[0], {})[shard[1:]] = tuple(shape)
    for base, rows in parts.items():
        shapes = list(rows.values())
        out.setdefault(base, (sum(hi - lo for lo, hi in rows), *shapes[0][1:]))
    return out


def shard_rows(vocab: int, shards: int, index: int) -> tuple[int, int]:
    """[lo, hi) of shard `index` of `vocab` rows over `shards`: ceil(V/P) each, the last
    shorter (never empty while V >= P)."""
    size = -(-vocab // shards)
    return min(vocab, index * size), min(vocab, (index + 1) * size)


def vocab_layers(graph) -> tuple[int, ...]:
    """The LM head's shard layers of a TrainGraph, shard order (= stage order); () when
    the head is whole."""
    return tuple(layer.index for layer in graph.layers if layer.kind == VOCAB_KIND)


def embed_layers(graph) -> tuple[int, ...]:
    """The input embedding's shard layers of a TrainGraph, shard order (= stage order);
    () when the embedding is whole (NOTE [vocabulary-parallel embedding])."""
    return tuple(layer.index for layer in graph.layers if layer.kind == EMBED_KIND)


def is_vocab_parallel(program) -> bool:
    """Is the program's LM head split in row shards?"""
    return bool(vocab_layers(program.graph))


def is_embedding_split(program) -> bool:
    """Is the program's input embedding split in row shards?"""
    return bool(embed_layers(program.graph))


def pipeline_layer_count(graph) -> int:
    """Layers the pipeline passes activations through (embed, decoders, head or final
    norm): the shard layers come after them and live beside every stage."""
    return len(graph.layers) - len(vocab_layers(graph)) - len(embed_layers(graph))


def stage_vocab_layer(program, stage: int) -> int | None:
    """The shard layer of the LM head stage `stage` holds, or None."""
    shards = vocab_layers(program.graph)
    return shards[stage] if shards else None


def stage_embed_layer(program, stage: int) -> int | None:
    """The shard layer of the input embedding stage `stage` holds, or None."""
    shards = embed_layers(program.graph)
    return shards[stage] if shards else None


def shard_layers(program, stage: int) -> tuple[int, ...]:
    """The row-shard layers stage `stage` holds: its shard of the LM head, then of the
    input embedding, each where split (ascending, as the graph numbers them)."""
    return tuple(l for l in (stage_vocab_layer(program, stage),
                             stage_embed_layer(program, stage)) if l is not None)


def state_layers(program, stage: int) -> tuple[int, ...]:
    """Every layer whose training state (master, moments, view, gradient, SYNC, UPD,
    PREF) stage `stage` holds: its pipeline layers, then its shards (shard_layers)."""
    return tuple(program.stages[stage]) + shard_layers(program, stage)
