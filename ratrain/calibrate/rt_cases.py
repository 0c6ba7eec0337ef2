"""The runtime's own Python-run calls as calibration cases: AdamW, view prefetch, the
finishing work of a gradient all-reduce and the start of a view's all-gather, run through
rt/calls.run_call on a small arena, so their cost includes what the runtime does around
the kernel (gradient scaling, decay runs, the mean written back, the shard cast and the
MPI start) and not only the kernel. Bytes are those the simulator charges (sim/calls.py).
"""
from __future__ import annotations


import numpy as np

from ratrain.calibrate.case import Case
from ratrain.ir.buffers import BufferKind, buffer_name
from ratrain.sim.costs import UPDATE_BYTES_PER_PARAM, view_cast_bytes
from ratrain.optim import AdamW
from ratrain.program_format.call_ops import CallOp
from ratrain.program_format.lowered import Call, Slot
from ratrain.passes.program import CompileOptions

# Parameters of a layer: tiny and small models' layers, a decoder layer of the 58M LLaMA
# (3.2M) and its vocabulary-sized embedding or LM head (32000 x 512 = 16.4M).
# NOTE [model-sized runtime calls]: past about 1M parameters these calls cost more per
# byte than the small sizes say: more of their bytes come from the DDR all ranks share,
# and numpy temporaries above glibc's mmap threshold are fresh pages on every call (the
# all-reduce finish's mean). So the largest layers are timed, not extrapolated (the
# simulator charges past the largest case at its time per byte, NOTE [streaming calls
# past the cases], sim/kernels.py). A fit of sizes up to 1M put AdamW of 16.4M
# parameters at 0.31x of its time on a 16-core node (every rank at once), 0.63x on a
# 2-core machine, and the all-reduce finish at 0.64x and 0.23x.
# NOTE [no power-of-two strides]: a case's buffers sit in its arena as a layer's do in a
# step's: master, then opt.L = [m | v], then the gradient, each right after the last. At a
# power-of-two n they would start exactly a multiple of 4n bytes apart, and on this
# machine's cores a call streaming buffers a multiple of 1 MiB apart runs about 7x slower
# (AdamW of 2^20 parameters: 30-46 ms, 1 GB/s; the same with m and v 64 bytes or a page
# further apart, or n = 791,040 as in the tiny model's layers: 4.1-5.9 ms). Every case
# above 2^18 parameters measured that, and the simulator charged the tiny model's UPD
# 108 ms where its runs took 22 ms. So each size is a power of two plus a page of
# parameters (4 KiB apart from the power of two), as no layer of a real model is exactly a
# power of two times 1 MiB. (A model whose layer is, say an embedding of 2^15 x 512, does
# pay that in its UPD; `simulate --against` a trace of it shows it.)
SIZES = tuple((1 << k) + 1024 for k in (16, 18, 20, 22, 24))
WEIGHT_SHARE = 0.99                     # of a decoder layer's parameters, in matrices


class OneMemberGroup:
    """The Transport of a rank alone in its DP group: collectives finish at once; an
    all-gather is a real MPI one over this rank alone (NOTE [gather start])."""

    def __init__(self):
        self.options, self.step, self.optimizer = CompileOptions(), 1, AdamW(weight_decay=0.1)
        self.comms = None

    def dp_sum(self, st, call, value, scatter, finish):
        finish(value)

    def dp_gather(self, st, call, shard, finish, into=None):
        from ratrain.rt import comm
        self.comms = self.comms or comm.Communicators.alone()
        comm.start_param_allgather(self.comms, shard, (), finish, into).complete()


def _state(n: int, buffers: dict):
    """A RankState over a fresh arena holding `buffers` (name -> fp32 elements)."""
    from ratrain.rt.calls import RankState, decay_runs
    offsets, at = {}, 0
    for name, count in buffers.items():
        offsets[name], at = (at, 4 * count), at + 4 * count
    st = RankState(0, 0, 0, np.zeros(at, np.uint8), offsets)
    st.decay[1] = decay_runs((np.arange(n) < WEIGHT_SHARE * n).astype(np.float32))  # 2 runs, as layers
    return st


def _slot(name: str, n: int) -> Slot:
    return Slot(name, 0, "float32", (n,))


def _case(op: str, n: int, nbytes: int, call: Call, st) -> Case:
    from ratrain.rt.calls import run_call
    transport = OneMemberGroup()
    return Case(str(op), f"n={n}", 0, nbytes, lambda threads: run_call(transport, st, call),
                cold=True)


def layer_state(n: int):
    """A layer of `n` parameters as a step's arena holds it (NOTE [no power-of-two
    strides]): (RankState, master, m, v, grad, view slots)."""
    names = [buffer_name(kind, layer=1) for kind in (BufferKind.MASTER, BufferKind.OPT,
                                                      BufferKind.GRAD, BufferKind.VIEW)]
    st = _state(n, {**dict.fromkeys(names, n), names[1]: 2 * n})  # opt.L: [m | v]
    master, m, grad, view = (_slot(name, n) for name in names)
    return st, master, m, Slot(names[1], 4 * n, "float32", (n,)), grad, view


def runtime_cases(kernels=None, rng=None) -> list[Case]:
    cases = []
    for n in SIZES:
        st, master, m, v, grad, view = layer_state(n)
        cases += [
            _case(CallOp.ADAMW, n, UPDATE_BYTES_PER_PARAM * n,
                  Call(CallOp.ADAMW, (master, m, v), (grad,), (("zero", 0),), layer=1), st),
            _case(CallOp.PREFETCH_VIEW, n, 8 * n,
                  Call(CallOp.PREFETCH_VIEW, (view,), (master,), (("gather", False),),
                       layer=1), st),
            _case(CallOp.GRAD_SYNC, n, 8 * n,
                  Call(CallOp.GRAD_SYNC, (grad,), (grad,), (("op", "allreduce"),),
                       layer=1), st),
            _case(CallOp.GATHER_VIEW, n, view_cast_bytes(n, 4),
                  Call(CallOp.GATHER_VIEW, (view,), (master,),
                       (("use", "0F0"), ("in_place", True)),
                       layer=1), st)]
    return cases
