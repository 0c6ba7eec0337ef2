"""Seconds of one IR node on a profile: a roofline over the node's FLOPs and DDR bytes.

A node takes max(FLOPs / (peak x efficiency), bytes / DDR bandwidth): GEMM-class kernels
(gemm, attention) reach `gemm_efficiency` of peak on large shapes and less on small ones
(the profile's `gemm_shape_curve` over the kernel's smallest dimension); every other op
is bound by the bytes it reads and writes. A `<op>_bwd` node takes its FLOPs and shape
from the forward node it differentiates (NOTE [backward partners]) and its bytes from its
own operands.

A measured profile (`ratrain calibrate`) replaces the roofline of the ops it timed by
their measured cost: its `op_costs[precision][op]` = {"seconds": s, "flop_rate": F,
"byte_rate": B, "measured": [[FLOPs, bytes, seconds, shape], ...]} charges a call the
time measured for its very shape (a case the calibration ran: NOTE [cases by shape]),
else the fit s + FLOPs / F + bytes / B (a missing rate charges nothing for that term).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from ratrain.hw.profiles import Profile
from ratrain.ir.costs import coarse_bwd_flops, node_flops
from ratrain.ir.graph import LayerGraph, Literal, Node, Var
from ratrain.ir.rules import lookup_rule
from ratrain.rt.threads import threads_per_rank

GEMM_CLASS = ("gemm", "attention")


def peak_flops(profile: Profile | Mapping, precision: str) -> float:
    """The profile's peak for the precision: its bf16 peak if it has one, else the 16-bit
    (fp16) peak for both 16-bit formats."""
    profile = Profile.of(profile)
    if precision == "bf16" and profile.bf16_flops is not None:
        return profile.bf16_flops
    return profile.fp16_flops if precision in ("fp16", "bf16") else profile.fp32_flops


def shape_factor(profile: Profile | Mapping, min_dim: int) -> float:
    """The profile's gemm_shape_curve at `min_dim`: linear in log2(dim) between its
    points, flat beyond the first and the last; 1 without a curve."""
    points = sorted(Profile.of(profile).gemm_shape_curve or [])
    if not points:
        return 1.0
    if min_dim <= points[0][0]:
        return points[0][1]
    for (d0, f0), (d1, f1) in zip(points, points[1:]):
        if min_dim <= d1:
            t = (math.log2(min_dim) - math.log2(d0)) / (math.log2(d1) - math.log2(d0))
            return f0 + t * (f1 - f0)
    return points[-1][1]


def kernel_min_dim(node: Node) -> int | None:
    """Smallest dimension of a GEMM-class forward node: rows, out, in of x @ w^T; the
    sequence or head size of attention on q[B, T, H, D]; None for other ops."""
    rule = lookup_rule(node.op)
    kernel = rule.kernel if rule is not None else None
    if kernel == "gemm":
        x, w = node.inputs[0].shape, node.inputs[1].shape
        return min(math.prod(x[:-1]), *w)
    if kernel == "attention":
        _, t, _, d = node.inputs[0].shape
        return min(t, d)
    return None


# NOTE [cases by shape]: a kernel's time is not a function of its FLOPs and bytes alone.
# RoPE of B 1, T 512, H 4, D 64, of B 2, T 256 and of B 4, T 128 do the same FLOPs on the
# same bytes, and took 0.248, 0.148 and 0.098 ms here (2 threads: its sines and cosines
# are per position); a bf16 GEMM of M 256, N 688, K 256 and of N 256, K 688 took 0.29 and
# 0.33 ms. Matched on FLOPs and bytes, every such call was charged the first case's time
# (tiny's RoPE, B 2 T 256 H 4 D 64, two-thirds of it). So a calibrated case names its
# shape as kernel_shape writes it from the case's forward node, the profile keeps it
# beside the case's time, and a call is charged the case of its own shape.
def kernel_shape(node: Node) -> str | None:
    """What besides FLOPs and bytes sets a forward node's kernel time, as calibration cases
    name their shapes (calibrate/cases.py; NOTE [cases by shape]): rows (every leading
    dimension) and widths of the row-wise kernels, B, T, heads and D of RoPE and attention;
    None for ops without a native kernel family."""
    rule = lookup_rule(node.op)
    kernel = rule.kernel if rule is not None else None
    shapes = [v.shape for v in node.inputs if isinstance(v, Var)]
    rows = lambda shape: math.prod(shape[:-1])
    if kernel == "gemm":
        x, w = shapes[:2]
        return f"M={rows(x)} N={w[0]} K={w[1]}"
    if kernel in ("attention", "rope"):
        b, t, h, d = shapes[0]
        kv = shapes[1][2] if kernel == "attention" else h   # RoPE: one tensor's heads
        return f"B={b} T={t} H={h if kv == h else f'{h}/{kv}'} D={d}"
    if kernel == "rmsnorm":
        return f"N={rows(shapes[0])} C={shapes[0][-1]}"
    if kernel == "swiglu":
        return f"N={rows(shapes[0])} F={shapes[0][-1]}"
    if kernel == "embedding":
        table, ids = shapes[:2]
        return f"N={math.prod(ids)} V={table[0]} C={table[1]}"
    if kernel == "cross_entropy":
        h, w = shapes[:2]
        return f"N={rows(h)} V={w[0]} C={w[1]}"
    return None


def efficiency(profile: Profile | Mapping, node: Node) -> float:
    profile = Profile.of(profile)
    dim = kernel_min_dim(node)
    base = profile.gemm_efficiency
    return base if dim is None else base * shape_factor(profile, dim)


def node_bytes(node: Node, widened: bool = False) -> int:
    """DDR bytes a node reads and writes: its operands and results (a reshape copies);
    `widened`: 16-bit floats counted as fp32, what the node's fp32 call moves (NOTE
    [16-bit costs])."""
    size = (lambda v: v.size * 4 if v.dtype in ("float16", "bfloat16") else v.nbytes) \
        if widened else (lambda v: v.nbytes)
    return sum(size(x) for x in node.inputs if isinstance(x, Var)) + \
        sum(size(o) for o in node.outputs)


MEASURED_PRECISION = "fp32"             # every op calibrate times is timed in it


# NOTE [16-bit costs]: `ratrain calibrate` times every op in fp32 and only the GEMMs in bf16
# and fp16 too (NOTE [16-bit GEMM cases], calibrate/cases.py): the other kernels widen
# 16-bit operands and compute in fp32, and take the fp32 call's time (1 thread here, tiny
# shapes, bf16 against fp32: rms_norm 29 against 23 us, swiglu 481 against 507, RoPE 112
# against 114, attention 1.035 against 1.038 ms), and the runtime's calls (AdamW on the fp32
# master weights, the all-reduce finish, a view's prefetch) are the same code in every
# program. So a kernel a profile measured only in fp32 costs a 16-bit program its fp32 fit
# at the node's FLOPs and at its bytes counted as fp32 (`node_bytes(widened=True)`), and a
# runtime call its fp32 fit at the bytes it moves. Before, such ops fell back to the
# roofline: a tiny-gqa pp 2 bf16 step's AdamWs took 3.25 ms on stage 0 where DDR bandwidth
# charged 0.72 ms, and its GEMMs ran at the bf16 rate where the roofline charged
# `fp16_flops`.
def measured_at(profile: Profile, precision: str, op: str) -> tuple[str, dict] | None:
    """(the format it was measured in, the entry): the profile's measured cost of `op` at
    `precision`, else its fp32 one (NOTE [16-bit costs]); None if it measured neither."""
    costs = profile.op_costs
    return next(((p, costs[p][op]) for p in (precision, MEASURED_PRECISION)
                 if op in costs.get(p, {})), None)


def op_costs(profile: Profile, precision: str, op: str) -> dict | None:
    """The entry of measured_at (what a call of `op` in a `precision` program costs)."""
    found = measured_at(profile, precision, op)
    return found and found[1]


def cold_profile(profile: Profile, precision: str) -> Profile | None:
    """The profile whose `op_costs` are its cold ones (`op_costs_cold` over the warm ones
    it lacks, at every precision), None without cold costs at `precision` or fp32 (NOTE
    [cache residency])."""
    cold, warm = profile.op_costs_cold, profile.op_costs
    if not cold.get(precision) and not cold.get(MEASURED_PRECISION):
        return None
    return profile.with_fields(op_costs={p: {**warm.get(p, {}), **cold.get(p, {})}
                                         for p in {*warm, *cold}})


def rank_profile(profile: Profile | Mapping, world_size: int) -> Profile:
    """The profile of one rank of a `world_size`-rank job on one node of `node_cores`
    cores, narrowed: its `threads` entry for the threads the runtime gives each rank
    (NOTE [threads per rank]; the nearest measured count below, else the smallest) over
    the profile's own fields, and that count as `rank_threads`. Without `threads`, as is."""
    profile = Profile.of(profile)
    table = profile.threads
    if not table:
        return profile
    cores = profile.cores if profile.node_cores is None else profile.node_cores
    wanted = threads_per_rank(int(cores), world_size)
    counts = sorted(int(k) for k in table)
    chosen = max((c for c in counts if c <= wanted), default=counts[0])
    return profile.with_fields(**{**table[str(chosen)], "rank_threads": chosen})


def fitted_seconds(costs: dict, flops: float, nbytes: float, shape: str | None = None) -> float:
    """What an op_costs entry charges a call of `flops` and `nbytes` (of a kernel of
    `shape`, kernel_shape's): the time measured for a case of exactly these FLOPs, bytes
    and shape (its `measured` [[FLOPs, bytes, s, shape], ...]; a row without a shape, from
    an older profile, matches on FLOPs and bytes: NOTE [cases by shape]), else, for a call
    without FLOPs whose cases have none (the runtime's calls) from the smallest case's
    bytes up, the measured times interpolated (NOTE [streaming calls past the cases]),
    else the fit."""
    for case_flops, case_bytes, seconds, *case_shape in costs.get("measured", ()):
        if case_flops == flops and case_bytes == nbytes and \
                (not case_shape or shape is None or case_shape[0] == shape):
            return seconds
    streamed = _streamed_seconds(costs.get("measured", ()), nbytes) if flops == 0 else None
    if streamed is not None:
        return streamed
    return (costs.get("seconds", 0.0)
            + (flops / costs["flop_rate"] if "flop_rate" in costs else 0.0)
            + (nbytes / costs["byte_rate"] if "byte_rate" in costs else 0.0))


# NOTE [streaming calls past the cases]: a runtime call (AdamW, the all-reduce finish, a
# view's prefetch) streams its bytes; calibrate times it on every rank at once, and the
# larger its case the more of those bytes come from DDR shared by all the node's ranks,
# so its time per byte grows with size (node16 profile, 1 thread: AdamW 5.0, 2.3 and 1.35
# GB/s at 64K, 256K and 1M parameters). A fit over all cases, weighted by relative error,
# sits between them (3.7 GB/s there) and charges a 16.4M-parameter embedding's AdamW a
# third of what it took (401 ms on a 16-core node, every rank at once: 1.14 GB/s). So
# such a call costs the linear interpolation of the two cases around its bytes, and past
# the largest case that case's time per byte: what was measured nearest, never a rate
# faster than the largest case streamed at.


def _streamed_seconds(measured, nbytes: float) -> float | None:
    """Seconds of a FLOP-free call of `nbytes` from FLOP-free cases (NOTE [streaming
    calls past the cases]); None below the smallest case, or with a case with FLOPs."""
    if not measured or any(row[0] for row in measured):
        return None
    points = sorted((row[1], row[2]) for row in measured)
    if nbytes < points[0][0]:
        return None
    for (b0, s0), (b1, s1) in zip(points, points[1:]):
        if nbytes <= b1:
            return s0 + (s1 - s0) * (nbytes - b0) / (b1 - b0)
    largest, seconds = points[-1]
    return seconds * nbytes / largest


def node_key(node: Node, precision: str, forward: Node | None = None) -> tuple:
    """What a traced row of `node` is keyed by (NOTE [traced rows]): precision, op,
    FLOPs, bytes and kernel_shape; `forward` is the partner of a `<op>_bwd` node."""
    shaped = forward if forward is not None else node
    flops = coarse_bwd_flops(forward) if forward is not None else node_flops(node)
    return precision, node.op, flops, node_bytes(node), kernel_shape(shaped)


def traced_seconds(profile: Profile, key: tuple) -> float | None:
    """What a traced run measured for a call of `key` (node_key's, or a runtime call's
    runtime_key), None if no trace calibrated the profile had it (NOTE [traced rows])."""
    return profile.traced.get("calls", {}).get(key_text(key), (None,))[0]


def op_speed_factor(profile: dict, precision: str, op: str) -> float:
    """How much longer an untraced call of `op` takes in a traced run than the
    microbenchmark rows charge it: the median ratio over the traced calls of that op
    (NOTE [traced rows] 5, calibrate/from_trace.py); 1 where no trace had it."""
    return Profile.of(profile).traced.get("op_speed", {}).get(key_text((precision, op)),
                                                              (1.0,))[0]


def key_text(key: tuple) -> str:
    """A traced row's key as the profile's JSON holds it."""
    return " ".join(str(part) for part in key)


def node_seconds(node: Node, profile: Profile | Mapping, precision: str,
                 forward: Node | None = None) -> float:
    """Seconds of `node` (traced in a run, else measured cost, else roofline); `forward`
    is the partner of a `<op>_bwd` node."""
    profile = Profile.of(profile)
    if profile.traced:
        traced = traced_seconds(profile, node_key(node, precision, forward))
        if traced is not None:
            return traced
    shaped = forward if forward is not None else node
    flops = coarse_bwd_flops(forward) if forward is not None else node_flops(node)
    return op_speed_factor(profile, precision, node.op) * _untraced_seconds(
        node, profile, precision, shaped, flops)


def _untraced_seconds(node: Node, profile: dict, precision: str, shaped: Node,
                      flops: float) -> float:
    """Seconds of `node` by its op's microbenchmark cases, else the roofline."""
    found = measured_at(profile, precision, node.op)
    if found is not None:
        measured_in, measured = found
        return fitted_seconds(measured, flops, node_bytes(node, widened=measured_in != precision),
                              kernel_shape(shaped))
    compute = flops / (peak_flops(profile, precision) * efficiency(profile, shaped))
    return max(compute, node_bytes(node) / profile.ddr_bandwidth)


# NOTE [backward partners]: autodiff feeds each `<op>_bwd` node the residuals its forward
# rule saves, as the very same Vars, first among its inputs. A forward node is therefore
# identified by (op, ids of its saved values), and a backward node by the same ids read
# off its leading inputs. (Two forward nodes never save identical values: a matmul saves
# its own weight.)

def _identity(values) -> tuple:
    return tuple(v.id if isinstance(v, Var) else ("literal", v.value) for v in values
                 if isinstance(v, (Var, Literal)))


def backward_partners(fwd: LayerGraph, bwd: LayerGraph) -> list[Node | None]:
    """For each node of `bwd`: the forward node it differentiates, or None (lax ops)."""
    saved: dict[tuple, Node] = {}
    counts: dict[str, int] = {}
    for node in fwd.nodes:
        rule = lookup_rule(node.op)
        if rule is not None and rule.vjp is None and rule.residuals is not None:
            key = _identity(rule.residuals(node.inputs, node.outputs))
            saved[(node.op, key)] = node
            counts[node.op] = len(key)
    partners = []
    for node in bwd.nodes:
        base = node.op.removesuffix("_bwd")
        if node.op.endswith("_bwd") and base in counts:
            partners.append(saved.get((base, _identity(node.inputs[:counts[base]]))))
        else:
            partners.append(None)
    return partners


def graph_seconds(kind, direction: str, profile: Profile | Mapping,
                  precision: str) -> tuple[float, ...]:
    """Seconds of every node of a layer kind's forward ("fwd") or backward graph ("bwd"),
    or of zb1's input ("bwd_input") or weight ("bwd_weight") part of it: each node its
    share of the backward node it comes from (a split GEMM half of matmul_bwd's)."""
    profile = Profile.of(profile)
    if direction == "fwd":
        return tuple(node_seconds(n, profile, precision) for n in kind.fwd.nodes)
    partners = backward_partners(kind.fwd, kind.bwd)
    whole = tuple(node_seconds(n, profile, precision, forward=p)
                  for n, p in zip(kind.bwd.nodes, partners))
    if direction == "bwd":
        return whole
    split, n_input = kind.split, len(kind.split.input_part.nodes)
    origin = split.origin[:n_input] if direction == "bwd_input" else split.origin[n_input:]
    return tuple(whole[i] * share for i, share in origin)


def whole_node_key(kind, direction: str, i: int, precision: str) -> tuple[tuple, float]:
    """(node_key of the whole node behind node `i` of a layer kind's `direction` graph, the
    share of it that node is): graph_seconds' nodes, a zb1 half taking its share of the
    backward node it comes from (NOTE [traced rows])."""
    if direction == "fwd":
        return node_key(kind.fwd.nodes[i], precision), 1.0
    partners = backward_partners(kind.fwd, kind.bwd)
    whole, share = i, 1.0
    if direction != "bwd":
        offset = 0 if direction == "bwd_input" else len(kind.split.input_part.nodes)
        whole, share = kind.split.origin[offset + i]
    return node_key(kind.bwd.nodes[whole], precision, partners[whole]), share
