"""The kernel runs `ratrain calibrate` times: every natively run IR op on model-sized shapes.

Each case calls a native kernel through the `ratrain.kernels` bindings the way the
generated code does (same layouts, fp32 outputs, memset before accumulating kernels) and
carries the FLOPs and bytes the simulator charges the IR node of that op
(sim/kernels.py: node_flops or coarse_bwd_flops of the forward node, node_bytes), so a fit
of seconds over (FLOPs, bytes) is in the simulator's own units.
"""
from __future__ import annotations

import numpy as np

from ratrain.calibrate.case import Case
from ratrain.calibrate.rt_cases import runtime_cases
from ratrain.program_format.call_ops import timed_ops
from ratrain.ir.costs import coarse_bwd_flops, node_flops
from ratrain.ir.graph import Node, Var
from ratrain.models.rope import RopeSpec, inv_freq
from ratrain.sim.kernels import kernel_shape, node_bytes

# Rows (tokens of a micro-batch) and widths of the tiny presets and of a small model
# twice as wide: the shapes `ratrain train` and the bench run on this machine.
ROWS = (256, 512, 1024)
WIDTHS = ((256, 688), (512, 1376))          # hidden, intermediate
# attention and RoPE: B, T, H, D of micro-batches of up to 1024 tokens
ATTENTION = tuple((b, t, h, d) for t in (128, 256, 512) for b in (1, 2, 4) if b * t <= 1024
                  for h, d in ((4, 64), (8, 32)))
# NOTE [grouped-query attention cases]: attention also runs with fewer key/value heads
# than query heads (tiny-gqa: 8 over 2). For the same FLOPs such a call is slower, by
# 1.4-1.6x at B 1-4, T 256, H 8 over 2, D 32 on the 2-core machine of bench/predict.py
# (each K/V row serves 4 query heads, so the kernel's inner loop streams it 4 times): the
# fit over the equal-head cases charged it 0.64-0.71x of its time, and tiny-gqa pp 2's
# step was predicted 7% short. So those shapes are timed too, and RoPE of the keys'
# fewer heads (NOTE [cases by shape], sim/kernels.py).
GQA_HEADS = ((8, 2, 32),)                   # query heads, key/value heads, head dim
VOCAB = (256, 1024)


# NOTE [16-bit GEMM cases]: the GEMMs (matmul, and the LM head's inside cross-entropy) are
# also timed with bf16 and fp16 operands, as a 16-bit program runs them (outputs in the
# operands' format, weight gradients in fp32): their speed is the kernel path's
# (kernels.pyx), not the fp32 rate's. On the 2-core AMD EPYC of bench/predict.py
# (avx512_bf16, 1 thread) bf16 GEMMs ran at 157-186 GFLOP/s, fp16 ones at 89-100 and fp32
# ones at 85-98, where the roofline had charged both 16-bit formats `fp16_flops`, half the
# fp32 rate of the whole node. The other kernels widen 16-bit operands to fp32 and compute
# there (attention took 1.03-1.04 ms at B 1, T 256, H 8/2, D 32 in all three formats), so
# their fp32 cases stand for them (NOTE [16-bit costs], sim/kernels.py).
GEMM_FORMATS = {"fp32": np.float32, "bf16": np.uint16, "fp16": np.float16}
IR_DTYPE = {np.dtype(np.uint16): "bfloat16"}   # bf16 arrays are uint16 bits (kernels.pyx)


def _node(op: str, inputs, outputs, **params) -> Node:
    var = lambda a: Var(IR_DTYPE.get(a.dtype, str(a.dtype)), tuple(a.shape))
    return Node(op, tuple(map(var, inputs)), tuple(map(var, outputs)),
                tuple(sorted(params.items())))


def _pair(op: str, fwd_io, bwd_io, run_fwd, run_bwd, precision: str = "fp32",
          **params) -> list[Case]:
    """The forward case of `op` and its `<op>_bwd` case (FLOPs of the forward node), both
    named by the forward node's kernel_shape, which the simulator looks them up by (NOTE
    [cases by shape], sim/kernels.py)."""
    fwd = _node(op, *fwd_io, **params)
    bwd = _node(f"{op}_bwd", *bwd_io)
    shape = kernel_shape(fwd)
    return [Case(op, shape, node_flops(fwd), node_bytes(fwd), run_fwd, precision=precision),
            Case(f"{op}_bwd", shape, coarse_bwd_flops(fwd), node_bytes(bwd), run_bwd,
                 precision=precision)]


def _random(rng, *shape):
    return rng.random(shape, np.float32) - 0.5


def matmul_cases(kernels, rng) -> list[Case]:
    """y = x w^T (NT); backward dx = dy w (NN) and dw = dy^T x (TN), as codegen emits; in
    every GEMM_FORMATS (NOTE [16-bit GEMM cases])."""
    return [case for precision in GEMM_FORMATS for m in ROWS for hidden, inter in WIDTHS
            for n, k in ((hidden, hidden), (inter, hidden), (hidden, inter))
            for case in _gemm_pair(kernels, rng, precision, m, n, k)]


def _gemm_pair(kernels, rng, precision: str, m: int, n: int, k: int) -> list[Case]:
    """The matmul case of x[m, k] w[n, k]^T in `precision`, and its backward."""
    x, w, dy = (kernels.cast(_random(rng, *s), GEMM_FORMATS[precision])
                for s in ((m, k), (n, k), (m, n)))
    y, dx = np.empty((m, n), x.dtype), np.empty_like(x)
    dw = np.empty((n, k), np.float32)

    def fwd(t):
        kernels.gemm(x, w, trans_b=True, out=y, threads=t)

    def bwd(t):
        kernels.gemm(dy, w, out=dx, threads=t)
        kernels.gemm(dy, x, trans_a=True, out=dw, threads=t)
    return _pair("matmul", ((x, w), (y,)), ((x, w, dy), (dx, dw)), fwd, bwd, precision)


def attention_cases(kernels, rng) -> list[Case]:
    """Causal attention of every ATTENTION shape with as many key/value heads as query
    heads, and of its (B, T) with the GQA_HEADS (NOTE [grouped-query attention cases])."""
    cases = []
    shapes = [(b, t, h, h, d) for b, t, h, d in ATTENTION] + \
        [(b, t, h, kv, d) for b, t in dict.fromkeys((b, t) for b, t, _, _ in ATTENTION)
         for h, kv, d in GQA_HEADS]
    for b, t, h, kv, d in shapes:
        q, do = (_random(rng, b, t, h, d) for _ in range(2))
        k, v = (_random(rng, b, t, kv, d) for _ in range(2))
        o, lse = kernels.attention_fwd(q, k, v)
        grads = [np.empty_like(x) for x in (q, k, v)]

        def fwd(threads, q=q, k=k, v=v):
            kernels.attention_fwd(q, k, v, threads=threads)

        def bwd(threads, q=q, k=k, v=v, o=o, lse=lse, do=do):
            kernels.attention_bwd(q, k, v, o, lse, do, threads=threads)
        cases += _pair("attention", ((q, k, v), (o, lse)),
                       ((q, k, v, o, lse, do), tuple(grads)), fwd, bwd, causal=True,
                       alibi=False)
    return cases


def rows_by_width():
    return [(n, c) for n in ROWS + (4096,) for c, _ in WIDTHS]


def norm_cases(kernels, rng) -> list[Case]:
    cases = []
    for n, c in rows_by_width():
        x, w, dy = _random(rng, n, c), _random(rng, c), _random(rng, n, c)
        y, rstd = kernels.rmsnorm_fwd(x, w)
        dw = np.zeros(c, np.float32)

        def fwd(t, x=x, w=w):
            kernels.rmsnorm_fwd(x, w, threads=t)

        def bwd(t, x=x, w=w, dy=dy, rstd=rstd, dw=dw):
            dw.fill(0)
            kernels.rmsnorm_bwd(dy, x, w, rstd, dw=dw, threads=t)
        cases += _pair("rms_norm", ((x, w), (y, rstd)),
                       ((x, w, rstd, dy), (y, dw)), fwd, bwd, eps=1e-5)
    return cases


def rope_cases(kernels, rng) -> list[Case]:
    """RoPE of every ATTENTION shape and, at each of its (B, T), of the GQA_HEADS' keys
    (their key/value heads): its time is per position as well as per element (NOTE [cases
    by shape], sim/kernels.py)."""
    cases = []
    keys = [(b, t, kv, d) for b, t in dict.fromkeys((b, t) for b, t, _, _ in ATTENTION)
            for _, kv, d in GQA_HEADS]
    for b, t, h, d in ATTENTION + tuple(keys):
        x, freqs = _random(rng, b, t, h, d), inv_freq(RopeSpec(10000.0), d)
        cases += _pair("rope", ((x,), (x,)), ((x,), (x,)),
                       lambda th, x=x, f=freqs: kernels.rope_fwd(x, f, threads=th),
                       lambda th, x=x, f=freqs: kernels.rope_bwd(x, f, threads=th), theta=10000.0)
    return cases


def swiglu_cases(kernels, rng) -> list[Case]:
    cases = []
    for n in ROWS + (4096,):
        for _, inter in WIDTHS:
            gate, up, dy = (_random(rng, n, inter) for _ in range(3))
            cases += _pair("swiglu", ((gate, up), (gate,)),
                           ((gate, up, dy), (gate, up)),
                           lambda t, g=gate, u=up: kernels.swiglu_fwd(g, u, threads=t),
                           lambda t, g=gate, u=up, d=dy: kernels.swiglu_bwd(d, g, u, threads=t))
    return cases


def embedding_cases(kernels, rng) -> list[Case]:
    cases = []
    for n in ROWS + (4096,):
        for vocab in VOCAB:
            for c, _ in WIDTHS:
                table, ids = _random(rng, vocab, c), rng.integers(0, vocab, n).astype(np.int32)
                y, dtable = kernels.embedding_fwd(ids, table), np.zeros((vocab, c), np.float32)

                def bwd(t, y=y, ids=ids, vocab=vocab, dtable=dtable):
                    dtable.fill(0)
                    kernels.embedding_bwd(y, ids, vocab, dtable=dtable, threads=t)
                cases += _pair("embedding", ((table, ids), (y,)),
                               ((ids, y), (dtable,)),
                               lambda t, ids=ids, table=table: kernels.embedding_fwd(
                                   ids, table, threads=t), bwd)
    return cases


def cross_entropy_cases(kernels, rng) -> list[Case]:
    """The LM head's GEMM and cross-entropy, in every GEMM_FORMATS (hidden states and head
    weights in it; NOTE [16-bit GEMM cases])."""
    cases = []
    for precision in GEMM_FORMATS:
        for n in ROWS:
            for vocab in VOCAB:
                for c, _ in WIDTHS:
                    h, w = (kernels.cast(_random(rng, *s), GEMM_FORMATS[precision])
                            for s in ((n, c), (vocab, c)))
                    targets = rng.integers(0, vocab, n).astype(np.int32)
                    losses, lse = kernels.cross_entropy_fwd(h, w, targets)
                    dlosses = np.full(n, 1.0 / n, np.float32)
                    dw, loss = np.zeros((vocab, c), np.float32), np.zeros((), np.float32)

                    def bwd(t, h=h, w=w, targets=targets, lse=lse, dlosses=dlosses, dw=dw):
                        dw.fill(0)
                        kernels.cross_entropy_bwd(h, w, targets, lse, dlosses, dw=dw, threads=t)
                    cases += _pair("cross_entropy", ((h, w, targets), (loss, lse)),
                                   ((h, w, targets, lse, loss), (h, dw)),
                                   lambda t, h=h, w=w, targets=targets: kernels.cross_entropy_fwd(
                                       h, w, targets, threads=t), bwd, precision)
    return cases


def memory_cases(kernels, rng) -> list[Case]:
    """Streaming adds (out = a + b) from cache-sized to DDR-sized arrays: the bandwidth of
    the memory-bound calls (add, copies, gradient accumulation, messages' copies)."""
    cases = []
    for n in (1 << 16, 1 << 18, 1 << 20, 1 << 22):
        a, b, out = _random(rng, n), _random(rng, n), np.empty(n, np.float32)
        cases.append(Case("add", f"n={n}", n, 12 * n,
                          lambda t, a=a, b=b, out=out: np.add(a, b, out=out), cold=True))
    return cases


def _groups() -> dict:
    """op names -> the function making their cases."""
    return {("matmul", "matmul_bwd"): matmul_cases, ("attention", "attention_bwd"): attention_cases,
            ("rms_norm", "rms_norm_bwd"): norm_cases, ("rope", "rope_bwd"): rope_cases,
            ("swiglu", "swiglu_bwd"): swiglu_cases, ("embedding", "embedding_bwd"): embedding_cases,
            ("cross_entropy", "cross_entropy_bwd"): cross_entropy_cases, ("add",): memory_cases,
            timed_ops(): runtime_cases}  # NOTE [one table of call ops]


def quick_cases(seed: int = 0) -> list[Case]:
    """The quick calibration's cases (NOTE [this machine's profile], calibrate/quick.py):
    the largest forward GEMM in each of GEMM_FORMATS, for the peaks, and the two largest
    streaming adds, for the DDR bandwidth."""
    from ratrain import kernels
    import ratrain.ops  # noqa: F401  (registers the op rules the FLOP counts come from)
    rng = np.random.default_rng(seed)
    hidden, inter = WIDTHS[-1]
    gemms = [_gemm_pair(kernels, rng, p, max(ROWS), inter, hidden)[0] for p in GEMM_FORMATS]
    return gemms + memory_cases(kernels, rng)[-2:]


def all_cases(ops=None, seed: int = 0) -> list[Case]:
    """Every case, or those of the ops in `ops` (names as in Case.op)."""
    from ratrain import kernels
    import ratrain.ops  # noqa: F401  (registers the op rules the FLOP counts come from)
    rng = np.random.default_rng(seed)
    cases = [c for names, make in _groups().items() if ops is None or set(names) & set(ops)
             for c in make(kernels, rng)]
    return [c for c in cases if ops is None or c.op in ops]
