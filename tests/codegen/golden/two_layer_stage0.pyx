# golden: two-layer llama, pp 1, fp32
# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memset, memmove
from libc.stdlib cimport malloc
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from ratrain.kernels cimport *

ctypedef int (*function_t)(char *A, const int64_t *o, int threads, int *status,
                           double *clock) noexcept nogil

PER_CALL_CLOCK = True   # run_function takes `clock` (NOTE [calls in the trace], rt/trace.py)


cdef inline double now() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return t.tv_sec + t.tv_nsec * 1e-9

cdef float *SCR = <float *>malloc(16 * sizeof(float))   # kernel-side fp32 scratch
if SCR == NULL:
    raise MemoryError()

cdef float INV_FREQ_8_edfbb1c1[4]
INV_FREQ_8_edfbb1c1[0] = 1.0
INV_FREQ_8_edfbb1c1[1] = 0.10000000149011612
INV_FREQ_8_edfbb1c1[2] = 0.009999999776482582
INV_FREQ_8_edfbb1c1[3] = 0.0010000000474974513


cdef int f0(char *A, const int64_t *o, int threads, int *status, double *clock) noexcept nogil:
    # used by B tasks of head layers
    # o[0] = ws.{task}:f32[]
    # o[1] = grad.L{l}+128:f32[64,32] (grad of lm_head.weight)
    # o[2] = ws.{task}:f32[2,8,32]
    # o[3] = act.L{l}.mb{m}:f32[2,8,32]
    # o[4] = view.L{l}+128:f32[64,32] (param lm_head.weight)
    # o[5] = act.L{l}.mb{m}:i32[2,8]
    # o[6] = act.L{l}.mb{m}:f32[2,8]
    # o[7] = grad.L{l}+0:f32[32] (grad of norm.weight)
    # o[8] = ws.{task}:f32[2,8,32]
    # o[9] = act.L{l}.mb{m}:f32[2,8,32]
    # o[10] = view.L{l}+0:f32[32] (param norm.weight)
    # o[11] = act.L{l}.mb{m}:f32[2,8]
    cdef int st = 0
    if clock != NULL: clock[0] = now()
    # cross_entropy_bwd[grad_into=(1, 'add')] float32[2, 8, 32] float32[64, 32] float32[2, 8, 32] float32[64, 32] int32[2, 8] float32[2, 8] float32[]
    st = rt_spread(<float *>(A + o[0]), SCR, 16)
    st = crossentropy_bwd_f32(<float *>(A + o[2]), <float *>(A + o[1]), <float *>(A + o[3]), <float *>(A + o[4]), <int32_t *>(A + o[5]), <float *>(A + o[6]), SCR, 16, 64, 32, 4096, threads)
    if st != 0: status[0] = st; return 0
    if clock != NULL: clock[1] = now()
    # rms_norm_bwd[eps=1e-06 grad_into=(1, 'add')] float32[2, 8, 32] float32[32] float32[2, 8, 32] float32[32] float32[2, 8] float32[2, 8, 32]
    st = rmsnorm_bwd_f32(<float *>(A + o[8]), <float *>(A + o[7]), <float *>(A + o[2]), <float *>(A + o[9]), <float *>(A + o[10]), <float *>(A + o[11]), 16, 32, threads)
    if st != 0: status[0] = st; return 1
    if clock != NULL: clock[2] = now()
    return -1


cdef int f1(char *A, const int64_t *o, int threads, int *status, double *clock) noexcept nogil:
    # used by B tasks of head layers
    # o[0] = ws.{task}:f32[]
    # o[1] = grad.L{l}+128:f32[64,32] (grad of lm_head.weight)
    # o[2] = ws.{task}:f32[2,8,32]
    # o[3] = act.L{l}.mb{m}:f32[2,8,32]
    # o[4] = view.L{l}+128:f32[64,32] (param lm_head.weight)
    # o[5] = act.L{l}.mb{m}:i32[2,8]
    # o[6] = act.L{l}.mb{m}:f32[2,8]
    # o[7] = grad.L{l}+0:f32[32] (grad of norm.weight)
    # o[8] = ws.{task}:f32[2,8,32]
    # o[9] = act.L{l}.mb{m}:f32[2,8,32]
    # o[10] = view.L{l}+0:f32[32] (param norm.weight)
    # o[11] = act.L{l}.mb{m}:f32[2,8]
    cdef int st = 0
    if clock != NULL: clock[0] = now()
    # cross_entropy_bwd[grad_into=(1, 'set')] float32[2, 8, 32] float32[64, 32] float32[2, 8, 32] float32[64, 32] int32[2, 8] float32[2, 8] float32[]
    st = rt_spread(<float *>(A + o[0]), SCR, 16)
    memset(<float *>(A + o[1]), 0, 8192)
    st = crossentropy_bwd_f32(<float *>(A + o[2]), <float *>(A + o[1]), <float *>(A + o[3]), <float *>(A + o[4]), <int32_t *>(A + o[5]), <float *>(A + o[6]), SCR, 16, 64, 32, 4096, threads)
    if st != 0: status[0] = st; return 0
    if clock != NULL: clock[1] = now()
    # rms_norm_bwd[eps=1e-06 grad_into=(1, 'set')] float32[2, 8, 32] float32[32] float32[2, 8, 32] float32[32] float32[2, 8] float32[2, 8, 32]
    memset(<float *>(A + o[7]), 0, 128)
    st = rmsnorm_bwd_f32(<float *>(A + o[8]), <float *>(A + o[7]), <float *>(A + o[2]), <float *>(A + o[9]), <float *>(A + o[10]), <float *>(A + o[11]), 16, 32, threads)
    if st != 0: status[0] = st; return 1
    if clock != NULL: clock[2] = now()
    return -1


cdef int f2(char *A, const int64_t *o, int threads, int *status, double *clock) noexcept nogil:
    # used by F tasks of embed layers
    # o[0] = act.L{l+1}.mb{m}:f32[2,8,32]
    # o[1] = act.L{l}.mb{m}:i32[2,8]
    # o[2] = view.L{l}+0:f32[64,32] (param embed_tokens.weight)
    cdef int st = 0
    if clock != NULL: clock[0] = now()
    # embedding[vocab=64] float32[2, 8, 32] float32[64, 32] int32[2, 8]
    st = embedding_fwd_f32(<float *>(A + o[0]), <int32_t *>(A + o[1]), <float *>(A + o[2]), 16, 64, 32, threads)
    if st != 0: status[0] = st; return 0
    if clock != NULL: clock[1] = now()
    return -1


cdef int f3(char *A, const int64_t *o, int threads, int *status, double *clock) noexcept nogil:
    # used by B tasks of embed layers
    # o[0] = grad.L{l}+0:f32[64,32] (grad of embed_tokens.weight)
    # o[1] = ws.{task}:f32[2,8,32]
    # o[2] = act.L{l}.mb{m}:i32[2,8]
    cdef int st = 0
    if clock != NULL: clock[0] = now()
    # embedding_bwd[grad_into=(0, 'add') vocab=64] float32[64, 32] int32[2, 8] float32[2, 8, 32]
    st = embedding_bwd_f32(<float *>(A + o[0]), <float *>(A + o[1]), <int32_t *>(A + o[2]), 16, 64, 32, threads)
    if st != 0: status[0] = st; return 0
    if clock != NULL: clock[1] = now()
    return -1


cdef int f4(char *A, const int64_t *o, int threads, int *status, double *clock) noexcept nogil:
    # used by B tasks of embed layers
    # o[0] = grad.L{l}+0:f32[64,32] (grad of embed_tokens.weight)
    # o[1] = ws.{task}:f32[2,8,32]
    # o[2] = act.L{l}.mb{m}:i32[2,8]
    cdef int st = 0
    if clock != NULL: clock[0] = now()
    # embedding_bwd[grad_into=(0, 'set') vocab=64] float32[64, 32] int32[2, 8] float32[2, 8, 32]
    memset(<float *>(A + o[0]), 0, 8192)
    st = embedding_bwd_f32(<float *>(A + o[0]), <float *>(A + o[1]), <int32_t *>(A + o[2]), 16, 64, 32, threads)
    if st != 0: status[0] = st; return 0
    if clock != NULL: clock[1] = now()
    return -1


cdef int f5(char *A, const int64_t *o, int threads, int *status, double *clock) noexcept nogil:
    # used by B tasks of decoder layers
    # o[0] = ws.{task}:f32[2,8,48]
    # o[1] = ws.{task}:f32[2,8,32]
    # o[2] = view.L{l}+24832:f32[32,48] (param mlp.down_proj.weight)
    # o[3] = grad.L{l}+24832:f32[32,48] (grad of mlp.down_proj.weight)
    # o[4] = act.L{l}.mb{m}:f32[2,8,48]
    # o[5] = ws.{task}:f32[2,8,48]
    # o[6] = ws.{task}:f32[2,8,48]
    # o[7] = act.L{l}.mb{m}:f32[2,8,48]
    # o[8] = act.L{l}.mb{m}:f32[2,8,48]
    # o[9] = view.L{l}+18688:f32[48,32] (param mlp.up_proj.weight)
    # o[10] = grad.L{l}+18688:f32[48,32] (grad of mlp.up_proj.weight)
    # o[11] = act.L{l}.mb{m}:f32[2,8,32]
    # o[12] = view.L{l}+12544:f32[48,32] (param mlp.gate_proj.weight)
    # o[13] = grad.L{l}+12544:f32[48,32] (grad of mlp.gate_proj.weight)
    # o[14] = ws.{task}:f32[2,8,32]
    # o[15] = grad.L{l}+12416:f32[32] (grad of post_attention_layernorm.weight)
    # o[16] = act.L{l}.mb{m}:f32[2,8,32]
    # o[17] = view.L{l}+12416:f32[32] (param post_attention_layernorm.weight)
    # o[18] = act.L{l}.mb{m}:f32[2,8]
    # o[19] = view.L{l}+8320:f32[32,32] (param self_attn.o_proj.weight)
    # o[20] = grad.L{l}+8320:f32[32,32] (grad of self_attn.o_proj.weight)
    # o[21] = act.L{l}.mb{m}:f32[2,8,32]
    # o[22] = ws.{task}:f32[2,8,4,8]
    # o[23] = ws.{task}:f32[2,8,2,8]
    # o[24] = act.L{l}.mb{m}:f32[2,8,4,8]
    # o[25] = act.L{l}.mb{m}:f32[2,8,2,8]
    # o[26] = act.L{l}.mb{m}:f32[2,8,2,8]
    # o[27] = act.L{l}.mb{m}:f32[2,8,4,8]
    # o[28] = act.L{l}.mb{m}:f32[2,4,8]
    # o[29] = ws.{task}:f32[2,8,2,8]
    # o[30] = ws.{task}:f32[2,8,16]
    # o[31] = view.L{l}+6272:f32[16,32] (param self_attn.v_proj.weight)
    # o[32] = grad.L{l}+6272:f32[16,32] (grad of self_attn.v_proj.weight)
    # o[33] = act.L{l}.mb{m}:f32[2,8,32]
    # o[34] = view.L{l}+4224:f32[16,32] (param self_attn.k_proj.weight)
    # o[35] = grad.L{l}+4224:f32[16,32] (grad of self_attn.k_proj.weight)
    # o[36] = view.L{l}+128:f32[32,32] (param self_attn.q_proj.weight)
    # o[37] = grad.L{l}+128:f32[32,32] (grad of self_attn.q_proj.weight)
    # o[38] = grad.L{l}+0:f32[32] (grad of input_layernorm.weight)
    # o[39] = act.L{l}.mb{m}:f32[2,8,32]
    # o[40] = view.L{l}+0:f32[32] (param input_layernorm.weight)
    # o[41] = act.L{l}.mb{m}:f32[2,8]
    # o[42] = ws.{task}:f32[2,8,32]
    cdef int st = 0
    if clock != NULL: clock[0] = now()
    # matmul_bwd[grad_into=(1, 'add')] float32[2, 8, 48] float32[32, 48] float32[2, 8, 48] float32[32, 48] float32[2, 8, 32]
    st = gemm_fwd_f32(<float *>(A + o[0]), RT_F32, <float *>(A + o[1]), <float *>(A + o[2]), NULL, 16, 48, 32, 0, threads)
    if st == 0: st = gemm_fwd_f32(<float *>(A + o[3]), RT_F32, <float *>(A + o[1]), <float *>(A + o[4]), NULL, 32, 48, 16, RT_TRANS_A | RT_ACCUMULATE, threads)
    if st != 0: status[0] = st; return 0
    if clock != NULL: clock[1] = now()
    # swiglu_bwd float32[2, 8, 48] float32[2, 8, 48] float32[2, 8, 48] float32[2, 8, 48] float32[2, 8, 48]
    st = swiglu_bwd_f32(<float *>(A + o[5]), <float *>(A + o[6]), <float *>(A + o[0]), <float *>(A + o[7]), <float *>(A + o[8]), 768, threads)
    if st != 0: status[0] = st; return 1
    if clock != NULL: clock[2] = now()
    # matmul_bwd[grad_into=(1, 'add')] float32[2, 8, 32] float32[48, 32] float32[2, 8, 32] float32[48, 32] float32[2, 8, 48]
    st = gemm_fwd_f32(<float *>(A + o[0]), RT_F32, <float *>(A + o[6]), <float *>(A + o[9]), NULL, 16, 32, 48, 0, threads)
    if st == 0: st = gemm_fwd_f32(<float *>(A + o[10]), RT_F32, <float *>(A + o[6]), <float *>(A + o[11]), NULL, 48, 32, 16, RT_TRANS_A | RT_ACCUMULATE, threads)
    if st != 0: status[0] = st; return 2
    if clock != NULL: clock[3] = now()
    # matmul_bwd[grad_into=(1, 'add')] float32[2, 8, 32] float32[48, 32] float32[2, 8, 32] float32[48, 32] float32[2, 8, 48]
    st = gemm_fwd_f32(<float *>(A + o[6]), RT_F32, <float *>(A + o[5]), <float *>(A + o[12]), NULL, 16, 32, 48, 0, threads)
    if st == 0: st = gemm_fwd_f32(<float *>(A + o[13]), RT_F32, <float *>(A + o[5]), <float *>(A + o[11]), NULL, 48, 32, 16, RT_TRANS_A | RT_ACCUMULATE, threads)
    if st != 0: status[0] = st; return 3
    if clock != NULL: clock[4] = now()
    # add float32[2, 8, 32] float32[2, 8, 32] float32[2, 8, 32]
    st = rt_add_f32(<float *>(A + o[14]), <float *>(A + o[0]), <float *>(A + o[6]), 512)
    if st != 0: status[0] = st; return 4
    if clock != NULL: clock[5] = now()
    # rms_norm_bwd[eps=1e-06 grad_into=(1, 'add')] float32[2, 8, 32] float32[32] float32[2, 8, 32] float32[32] float32[2, 8] float32[2, 8, 32]
    st = rmsnorm_bwd_f32(<float *>(A + o[0]), <float *>(A + o[15]), <float *>(A + o[14]), <float *>(A + o[16]), <float *>(A + o[17]), <float *>(A + o[18]), 16, 32, threads)
    if st != 0: status[0] = st; return 5
    if clock != NULL: clock[6] = now()
    # add float32[2, 8, 32] float32[2, 8, 32] float32[2, 8, 32]
    st = rt_add_f32(<float *>(A + o[14]), <float *>(A + o[1]), <float *>(A + o[0]), 512)
    if st != 0: status[0] = st; return 6
    if clock != NULL: clock[7] = now()
    # matmul_bwd[grad_into=(1, 'add')] float32[2, 8, 32] float32[32, 32] float32[2, 8, 32] float32[32, 32] float32[2, 8, 32]
    st = gemm_fwd_f32(<float *>(A + o[0]), RT_F32, <float *>(A + o[14]), <float *>(A + o[19]), NULL, 16, 32, 32, 0, threads)
    if st == 0: st = gemm_fwd_f32(<float *>(A + o[20]), RT_F32, <float *>(A + o[14]), <float *>(A + o[21]), NULL, 32, 32, 16, RT_TRANS_A | RT_ACCUMULATE, threads)
    if st != 0: status[0] = st; return 7
    if clock != NULL: clock[8] = now()
    # reshape[new_sizes=(2, 8, 4, 8)] float32[2, 8, 4, 8] float32[2, 8, 32]
    memmove(<float *>(A + o[22]), <float *>(A + o[0]), 2048)
    if st != 0: status[0] = st; return 8
    if clock != NULL: clock[9] = now()
    # attention_bwd[alibi=False causal=True] float32[2, 8, 4, 8] float32[2, 8, 2, 8] float32[2, 8, 2, 8] float32[2, 8, 4, 8] float32[2, 8, 2, 8] float32[2, 8, 2, 8] float32[2, 8, 4, 8] float32[2, 4, 8] float32[2, 8, 4, 8]
    st = attention_bwd_f32(<float *>(A + o[0]), <float *>(A + o[6]), <float *>(A + o[23]), <float *>(A + o[24]), <float *>(A + o[25]), <float *>(A + o[26]), <float *>(A + o[27]), <float *>(A + o[28]), <float *>(A + o[22]), NULL, 2, 8, 4, 2, 8, 1, threads)
    if st != 0: status[0] = st; return 9
    if clock != NULL: clock[10] = now()
    # rope_bwd[theta=10000.0] float32[2, 8, 2, 8] float32[2, 8, 2, 8]
    st = rope_bwd_f32(<float *>(A + o[29]), <float *>(A + o[6]), 2, 8, 2, 8, INV_FREQ_8_edfbb1c1, 1.0, threads)
    if st != 0: status[0] = st; return 10
    if clock != NULL: clock[11] = now()
    # rope_bwd[theta=10000.0] float32[2, 8, 4, 8] float32[2, 8, 4, 8]
    st = rope_bwd_f32(<float *>(A + o[22]), <float *>(A + o[0]), 2, 8, 4, 8, INV_FREQ_8_edfbb1c1, 1.0, threads)
    if st != 0: status[0] = st; return 11
    if clock != NULL: clock[12] = now()
    # reshape[new_sizes=(2, 8, 16)] float32[2, 8, 16] float32[2, 8, 2, 8]
    memmove(<float *>(A + o[6]), <float *>(A + o[23]), 1024)
    if st != 0: status[0] = st; return 12
    if clock != NULL: clock[13] = now()
    # reshape[new_sizes=(2, 8, 16)] float32[2, 8, 16] float32[2, 8, 2, 8]
    memmove(<float *>(A + o[30]), <float *>(A + o[29]), 1024)
    if st != 0: status[0] = st; return 13
    if clock != NULL: clock[14] = now()
    # reshape[new_sizes=(2, 8, 32)] float32[2, 8, 32] float32[2, 8, 4, 8]
    memmove(<float *>(A + o[0]), <float *>(A + o[22]), 2048)
    if st != 0: status[0] = st; return 14
    if clock != NULL: clock[15] = now()
    # matmul_bwd[grad_into=(1, 'add')] float32[2, 8, 32] float32[16, 32] float32[2, 8, 32] float32[16, 32] float32[2, 8, 16]
    st = gemm_fwd_f32(<float *>(A + o[22]), RT_F32, <float *>(A + o[6]), <float *>(A + o[31]), NULL, 16, 32, 16, 0, threads)
    if st == 0: st = gemm_fwd_f32(<float *>(A + o[32]), RT_F32, <float *>(A + o[6]), <float *>(A + o[33]), NULL, 16, 32, 16, RT_TRANS_A | RT_ACCUMULATE, threads)
    if st != 0: status[0] = st; return 15
    if clock != NULL: clock[16] = now()
    # matmul_bwd[grad_into=(1, 'add')] float32[2, 8, 32] float32[16, 32] float32[2, 8, 32] float32[16, 32] float32[2, 8, 16]
    st = gemm_fwd_f32(<float *>(A + o[6]), RT_F32, <float *>(A + o[30]), <float *>(A + o[34]), NULL, 16, 32, 16, 0, threads)
    if st == 0: st = gemm_fwd_f32(<float *>(A + o[35]), RT_F32, <float *>(A + o[30]), <float *>(A + o[33]), NULL, 16, 32, 16, RT_TRANS_A | RT_ACCUMULATE, threads)
    if st != 0: status[0] = st; return 16
    if clock != NULL: clock[17] = now()
    # add float32[2, 8, 32] float32[2, 8, 32] float32[2, 8, 32]
    st = rt_add_f32(<float *>(A + o[29]), <float *>(A + o[22]), <float *>(A + o[6]), 512)
    if st != 0: status[0] = st; return 17
    if clock != NULL: clock[18] = now()
    # matmul_bwd[grad_into=(1, 'add')] float32[2, 8, 32] float32[32, 32] float32[2, 8, 32] float32[32, 32] float32[2, 8, 32]
    st = gemm_fwd_f32(<float *>(A + o[22]), RT_F32, <float *>(A + o[0]), <float *>(A + o[36]), NULL, 16, 32, 32, 0, threads)
    if st == 0: st = gemm_fwd_f32(<float *>(A + o[37]), RT_F32, <float *>(A + o[0]), <float *>(A + o[33]), NULL, 32, 32, 16, RT_TRANS_A | RT_ACCUMULATE, threads)
    if st != 0: status[0] = st; return 18
    if clock != NULL: clock[19] = now()
    # add float32[2, 8, 32] float32[2, 8, 32] float32[2, 8, 32]
    st = rt_add_f32(<float *>(A + o[0]), <float *>(A + o[29]), <float *>(A + o[22]), 512)
    if st != 0: status[0] = st; return 19
    if clock != NULL: clock[20] = now()
    # rms_norm_bwd[eps=1e-06 grad_into=(1, 'add')] float32[2, 8, 32] float32[32] float32[2, 8, 32] float32[32] float32[2, 8] float32[2, 8, 32]
    st = rmsnorm_bwd_f32(<float *>(A + o[22]), <float *>(A + o[38]), <float *>(A + o[0]), <float *>(A + o[39]), <float *>(A + o[40]), <float *>(A + o[41]), 16, 32, threads)
    if st != 0: status[0] = st; return 20
    if clock != NULL: clock[21] = now()
    # add float32[2, 8, 32] float32[2, 8, 32] float32[2, 8, 32]
    st = rt_add_f32(<float *>(A + o[42]), <float *>(A + o[14]), <float *>(A + o[22]), 512)
    if st != 0: status[0] = st; return 21
    if clock != NULL: clock[22] = now()
    return -1


cdef int f6(char *A, const int64_t *o, int threads, int *status, double *clock) noexcept nogil:
    # used by B tasks of decoder layers
    # o[0] = ws.{task}:f32[2,8,48]
    # o[1] = ws.{task}:f32[2,8,32]
    # o[2] = view.L{l}+24832:f32[32,48] (param mlp.down_proj.weight)
    # o[3] = grad.L{l}+24832:f32[32,48] (grad of mlp.down_proj.weight)
    # o[4] = act.L{l}.mb{m}:f32[2,8,48]
    # o[5] = ws.{task}:f32[2,8,48]
    # o[6] = ws.{task}:f32[2,8,48]
    # o[7] = act.L{l}.mb{m}:f32[2,8,48]
    # o[8] = act.L{l}.mb{m}:f32[2,8,48]
    # o[9] = view.L{l}+18688:f32[48,32] (param mlp.up_proj.weight)
    # o[10] = grad.L{l}+18688:f32[48,32] (grad of mlp.up_proj.weight)
    # o[11] = act.L{l}.mb{m}:f32[2,8,32]
    # o[12] = view.L{l}+12544:f32[48,32] (param mlp.gate_proj.weight)
    # o[13] = grad.L{l}+12544:f32[48,32] (grad of mlp.gate_proj.weight)
    # o[14] = ws.{task}:f32[2,8,32]
    # o[15] = grad.L{l}+12416:f32[32] (grad of post_attention_layernorm.weight)
    # o[16] = act.L{l}.mb{m}:f32[2,8,32]
    # o[17] = view.L{l}+12416:f32[32] (param post_attention_layernorm.weight)
    # o[18] = act.L{l}.mb{m}:f32[2,8]
    # o[19] = view.L{l}+8320:f32[32,32] (param self_attn.o_proj.weight)
    # o[20] = grad.L{l}+8320:f32[32,32] (grad of self_attn.o_proj.weight)
    # o[21] = act.L{l}.mb{m}:f32[2,8,32]
    # o[22] = ws.{task}:f32[2,8,4,8]
    # o[23] = ws.{task}:f32[2,8,2,8]
    # o[24] = act.L{l}.mb{m}:f32[2,8,4,8]
    # o[25] = act.L{l}.mb{m}:f32[2,8,2,8]
    # o[26] = act.L{l}.mb{m}:f32[2,8,2,8]
    # o[27] = act.L{l}.mb{m}:f32[2,8,4,8]
    # o[28] = act.L{l}.mb{m}:f32[2,4,8]
    # o[29] = ws.{task}:f32[2,8,2,8]
    # o[30] = ws.{task}:f32[2,8,16]
    # o[31] = view.L{l}+6272:f32[16,32] (param self_attn.v_proj.weight)
    # o[32] = grad.L{l}+6272:f32[16,32] (grad of self_attn.v_proj.weight)
    # o[33] = act.L{l}.mb{m}:f32[2,8,32]
    # o[34] = view.L{l}+4224:f32[16,32] (param self_attn.k_proj.weight)
    # o[35] = grad.L{l}+4224:f32[16,32] (grad of self_attn.k_proj.weight)
    # o[36] = view.L{l}+128:f32[32,32] (param self_attn.q_proj.weight)
    # o[37] = grad.L{l}+128:f32[32,32] (grad of self_attn.q_proj.weight)
    # o[38] = grad.L{l}+0:f32[32] (grad of input_layernorm.weight)
    # o[39] = act.L{l}.mb{m}:f32[2,8,32]
    # o[40] = view.L{l}+0:f32[32] (param input_layernorm.weight)
    # o[41] = act.L{l}.mb{m}:f32[2,8]
    # o[42] = ws.{task}:f32[2,8,32]
    cdef int st = 0
    if clock != NULL: clock[0] = now()
    # matmul_bwd[grad_into=(1, 'set')] float32[2, 8, 48] float32[32, 48] float32[2, 8, 48] float32[32, 48] float32[2, 8, 32]
    st = gemm_fwd_f32(<float *>(A + o[0]), RT_F32, <float *>(A + o[1]), <float *>(A + o[2]), NULL, 16, 48, 32, 0, threads)
    if st == 0: st = gemm_fwd_f32(<float *>(A + o[3]), RT_F32, <float *>(A + o[1]), <float *>(A + o[4]), NULL, 32, 48, 16, RT_TRANS_A, threads)
    if st != 0: status[0] = st; return 0
    if clock != NULL: clock[1] = now()
    # swiglu_bwd float32[2, 8, 48] float32[2, 8, 48] float32[2, 8, 48] float32[2, 8, 48] float32[2, 8, 48]
    st = swiglu_bwd_f32(<float *>(A + o[5]), <float *>(A + o[6]), <float *>(A + o[0]), <float *>(A + o[7]), <float *>(A + o[8]), 768, threads)
    if st != 0: status[0] = st; return 1
    if clock != NULL: clock[2] = now()
    # matmul_bwd[grad_into=(1, 'set')] float32[2, 8, 32] float32[48, 32] float32[2, 8, 32] float32[48, 32] float32[2, 8, 48]
    st = gemm_fwd_f32(<float *>(A + o[0]), RT_F32, <float *>(A + o[6]), <float *>(A + o[9]), NULL, 16, 32, 48, 0, threads)
    if st == 0: st = gemm_fwd_f32(<float *>(A + o[10]), RT_F32, <float *>(A + o[6]), <float *>(A + o[11]), NULL, 48, 32, 16, RT_TRANS_A, threads)
    if st != 0: status[0] = st; return 2
    if clock != NULL: clock[3] = now()
    # matmul_bwd[grad_into=(1, 'set')] float32[2, 8, 32] float32[48, 32] float32[2, 8, 32] float32[48, 32] float32[2, 8, 48]
    st = gemm_fwd_f32(<float *>(A + o[6]), RT_F32, <float *>(A + o[5]), <float *>(A + o[12]), NULL, 16, 32, 48, 0, threads)
    if st == 0: st = gemm_fwd_f32(<float *>(A + o[13]), RT_F32, <float *>(A + o[5]), <float *>(A + o[11]), NULL, 48, 32, 16, RT_TRANS_A, threads)
    if st != 0: status[0] = st; return 3
    if clock != NULL: clock[4] = now()
    # add float32[2, 8, 32] float32[2, 8, 32] float32[2, 8, 32]
    st = rt_add_f32(<float *>(A + o[14]), <float *>(A + o[0]), <float *>(A + o[6]), 512)
    if st != 0: status[0] = st; return 4
    if clock != NULL: clock[5] = now()
    # rms_norm_bwd[eps=1e-06 grad_into=(1, 'set')] float32[2, 8, 32] float32[32] float32[2, 8, 32] float32[32] float32[2, 8] float32[2, 8, 32]
    memset(<float *>(A + o[15]), 0, 128)
    st = rmsnorm_bwd_f32(<float *>(A + o[0]), <float *>(A + o[15]), <float *>(A + o[14]), <float *>(A + o[16]), <float *>(A + o[17]), <float *>(A + o[18]), 16, 32, threads)
    if st != 0: status[0] = st; return 5
    if clock != NULL: clock[6] = now()
    # add float32[2, 8, 32] float32[2, 8, 32] float32[2, 8, 32]
    st = rt_add_f32(<float *>(A + o[14]), <float *>(A + o[1]), <float *>(A + o[0]), 512)
    if st != 0: status[0] = st; return 6
    if clock != NULL: clock[7] = now()
    # matmul_bwd[grad_into=(1, 'set')] float32[2, 8, 32] float32[32, 32] float32[2, 8, 32] float32[32, 32] float32[2, 8, 32]
    st = gemm_fwd_f32(<float *>(A + o[0]), RT_F32, <float *>(A + o[14]), <float *>(A + o[19]), NULL, 16, 32, 32, 0, threads)
    if st == 0: st = gemm_fwd_f32(<float *>(A + o[20]), RT_F32, <float *>(A + o[14]), <float *>(A + o[21]), NULL, 32, 32, 16, RT_TRANS_A, threads)
    if st != 0: status[0] = st; return 7
    if clock != NULL: clock[8] = now()
    # reshape[new_sizes=(2, 8, 4, 8)] float32[2, 8, 4, 8] float32[2, 8, 32]
    memmove(<float *>(A + o[22]), <float *>(A + o[0]), 2048)
    if st != 0: status[0] = st; return 8
    if clock != NULL: clock[9] = now()
    # attention_bwd[alibi=False causal=True] float32[2, 8, 4, 8] float32[2, 8, 2, 8] float32[2, 8, 2, 8] float32[2, 8, 4, 8] float32[2, 8, 2, 8] float32[2, 8, 2, 8] float32[2, 8, 4, 8] float32[2, 4, 8] float32[2, 8, 4, 8]
    st = attention_bwd_f32(<float *>(A + o[0]), <float *>(A + o[6]), <float *>(A + o[23]), <float *>(A + o[24]), <float *>(A + o[25]), <float *>(A + o[26]), <float *>(A + o[27]), <float *>(A + o[28]), <float *>(A + o[22]), NULL, 2, 8, 4, 2, 8, 1, threads)
    if st != 0: status[0] = st; return 9
    if clock != NULL: clock[10] = now()
    # rope_bwd[theta=10000.0] float32[2, 8, 2, 8] float32[2, 8, 2, 8]
    st = rope_bwd_f32(<float *>(A + o[29]), <float *>(A + o[6]), 2, 8, 2, 8, INV_FREQ_8_edfbb1c1, 1.0, threads)
    if st != 0: status[0] = st; return 10
    if clock != NULL: clock[11] = now()
    # rope_bwd[theta=10000.0] float32[2, 8, 4, 8] float32[2, 8, 4, 8]
    st = rope_bwd_f32(<float *>(A + o[22]), <float *>(A + o[0]), 2, 8, 4, 8, INV_FREQ_8_edfbb1c1, 1.0, threads)
    if st != 0: status[0] = st; return 11
    if clock != NULL: clock[12] = now()
    # reshape[new_sizes=(2, 8, 16)] float32[2, 8, 16] float32[2, 8, 2, 8]
    memmove(<float *>(A + o[6]), <float *>(A + o[23]), 1024)
    if st != 0: status[0] = st; return 12
    if clock != NULL: clock[13] = now()
    # reshape[new_sizes=(2, 8, 16)] float32[2, 8, 16] float32[2, 8, 2, 8]
    memmove(<float *>(A + o[30]), <float *>(A + o[29]), 1024)
    if st != 0: status[0] = st; return 13
    if clock != NULL: clock[14] = now()
    # reshape[new_sizes=(2, 8, 32)] float32[2, 8, 32] float32[2, 8, 4, 8]
    memmove(<float *>(A + o[0]), <float *>(A + o[22]), 2048)
    if st != 0: status[0] = st; return 14
    if clock != NULL: clock[15] = now()
    # matmul_bwd[grad_into=(1, 'set')] float32[2, 8, 32] float32[16, 32] float32[2, 8, 32] float32[16, 32] float32[2, 8, 16]
    st = gemm_fwd_f32(<float *>(A + o[22]), RT_F32, <float *>(A + o[6]), <float *>(A + o[31]), NULL, 16, 32, 16, 0, threads)
    if st == 0: st = gemm_fwd_f32(<float *>(A + o[32]), RT_F32, <float *>(A + o[6]), <float *>(A + o[33]), NULL, 16, 32, 16, RT_TRANS_A, threads)
    if st != 0: status[0] = st; return 15
    if clock != NULL: clock[16] = now()
    # matmul_bwd[grad_into=(1, 'set')] float32[2, 8, 32] float32[16, 32] float32[2, 8, 32] float32[16, 32] float32[2, 8, 16]
    st = gemm_fwd_f32(<float *>(A + o[6]), RT_F32, <float *>(A + o[30]), <float *>(A + o[34]), NULL, 16, 32, 16, 0, threads)
    if st == 0: st = gemm_fwd_f32(<float *>(A + o[35]), RT_F32, <float *>(A + o[30]), <float *>(A + o[33]), NULL, 16, 32, 16, RT_TRANS_A, threads)
    if st != 0: status[0] = st; return 16
    if clock != NULL: clock[17] = now()
    # add float32[2, 8, 32] float32[2, 8, 32] float32[2, 8, 32]
    st = rt_add_f32(<float *>(A + o[29]), <float *>(A + o[22]), <float *>(A + o[6]), 512)
    if st != 0: status[0] = st; return 17
    if clock != NULL: clock[18] = now()
    # matmul_bwd[grad_into=(1, 'set')] float32[2, 8, 32] float32[32, 32] float32[2, 8, 32] float32[32, 32] float32[2, 8, 32]
    st = gemm_fwd_f32(<float *>(A + o[22]), RT_F32, <float *>(A + o[0]), <float *>(A + o[36]), NULL, 16, 32, 32, 0, threads)
    if st == 0: st = gemm_fwd_f32(<float *>(A + o[37]), RT_F32, <float *>(A + o[0]), <float *>(A + o[33]), NULL, 32, 32, 16, RT_TRANS_A, threads)
    if st != 0: status[0] = st; return 18
    if clock != NULL: clock[19] = now()
    # add float32[2, 8, 32] float32[2, 8, 32] float32[2, 8, 32]
    st = rt_add_f32(<float *>(A + o[0]), <float *>(A + o[29]), <float *>(A + o[22]), 512)
    if st != 0: status[0] = st; return 19
    if clock != NULL: clock[20] = now()
    # rms_norm_bwd[eps=1e-06 grad_into=(1, 'set')] float32[2, 8, 32] float32[32] float32[2, 8, 32] float32[32] float32[2, 8] float32[2, 8, 32]
    memset(<float *>(A + o[38]), 0, 128)
    st = rmsnorm_bwd_f32(<float *>(A + o[22]), <float *>(A + o[38]), <float *>(A + o[0]), <float *>(A + o[39]), <float *>(A + o[40]), <float *>(A + o[41]), 16, 32, threads)
    if st != 0: status[0] = st; return 20
    if clock != NULL: clock[21] = now()
    # add float32[2, 8, 32] float32[2, 8, 32] float32[2, 8, 32]
    st = rt_add_f32(<float *>(A + o[42]), <float *>(A + o[14]), <float *>(A + o[22]), 512)
    if st != 0: status[0] = st; return 21
    if clock != NULL: clock[22] = now()
    return -1


cdef int f7(char *A, const int64_t *o, int threads, int *status, double *clock) noexcept nogil:
    # used by F tasks of head layers
    # o[0] = act.L{l}.mb{m}:f32[2,8,32]
    # o[1] = act.L{l}.mb{m}:f32[2,8]
    # o[2] = act.L{l}.mb{m}:f32[2,8,32]
    # o[3] = view.L{l}+0:f32[32] (param norm.weight)
    # o[4] = act.L{l}.mb{m}:f32[2,8]
    # o[5] = view.L{l}+128:f32[64,32] (param lm_head.weight)
    # o[6] = act.L{l}.mb{m}:i32[2,8]
    # o[7] = ws.{task}:f32[]
    cdef int st = 0
    if clock != NULL: clock[0] = now()
    # rms_norm[eps=1e-06] float32[2, 8, 32] float32[2, 8] float32[2, 8, 32] float32[32]
    st = rmsnorm_fwd_f32(<float *>(A + o[0]), <float *>(A + o[1]), <float *>(A + o[2]), <float *>(A + o[3]), 16, 32, 1e-06, threads)
    if st != 0: status[0] = st; return 0
    if clock != NULL: clock[1] = now()
    # cross_entropy float32 float32[2, 8] float32[2, 8, 32] float32[64, 32] int32[2, 8]
    st = crossentropy_fwd_f32(SCR, <float *>(A + o[4]), <float *>(A + o[0]), <float *>(A + o[5]), <int32_t *>(A + o[6]), 16, 64, 32, 4096, threads)
    if st == 0: st = rt_mean_into(<float *>(A + o[7]), SCR, 16)
    if st != 0: status[0] = st; return 1
    if clock != NULL: clock[2] = now()
    return -1


cdef int f8(char *A, const int64_t *o, int threads, int *status, double *clock) noexcept nogil:
    # used by F tasks of decoder layers
    # o[0] = act.L{l}.mb{m}:f32[2,8,32]
    # o[1] = act.L{l}.mb{m}:f32[2,8]
    # o[2] = act.L{l}.mb{m}:f32[2,8,32]
    # o[3] = view.L{l}+0:f32[32] (param input_layernorm.weight)
    # o[4] = ws.{task}:f32[2,8,32]
    # o[5] = view.L{l}+128:f32[32,32] (param self_attn.q_proj.weight)
    # o[6] = ws.{task}:f32[2,8,16]
    # o[7] = view.L{l}+4224:f32[16,32] (param self_attn.k_proj.weight)
    # o[8] = ws.{task}:f32[2,8,16]
    # o[9] = view.L{l}+6272:f32[16,32] (param self_attn.v_proj.weight)
    # o[10] = ws.{task}:f32[2,8,4,8]
    # o[11] = act.L{l}.mb{m}:f32[2,8,2,8]
    # o[12] = act.L{l}.mb{m}:f32[2,8,4,8]
    # o[13] = act.L{l}.mb{m}:f32[2,8,2,8]
    # o[14] = act.L{l}.mb{m}:f32[2,8,4,8]
    # o[15] = act.L{l}.mb{m}:f32[2,4,8]
    # o[16] = act.L{l}.mb{m}:f32[2,8,32]
    # o[17] = view.L{l}+8320:f32[32,32] (param self_attn.o_proj.weight)
    # o[18] = act.L{l}.mb{m}:f32[2,8,32]
    # o[19] = act.L{l}.mb{m}:f32[2,8,32]
    # o[20] = act.L{l}.mb{m}:f32[2,8]
    # o[21] = view.L{l}+12416:f32[32] (param post_attention_layernorm.weight)
    # o[22] = act.L{l}.mb{m}:f32[2,8,48]
    # o[23] = view.L{l}+12544:f32[48,32] (param mlp.gate_proj.weight)
    # o[24] = act.L{l}.mb{m}:f32[2,8,48]
    # o[25] = view.L{l}+18688:f32[48,32] (param mlp.up_proj.weight)
    # o[26] = act.L{l}.mb{m}:f32[2,8,48]
    # o[27] = view.L{l}+24832:f32[32,48] (param mlp.down_proj.weight)
    # o[28] = act.L{l+1}.mb{m}:f32[2,8,32]
    cdef int st = 0
    if clock != NULL: clock[0] = now()
    # rms_norm[eps=1e-06] float32[2, 8, 32] float32[2, 8] float32[2, 8, 32] float32[32]
    st = rmsnorm_fwd_f32(<float *>(A + o[0]), <float *>(A + o[1]), <float *>(A + o[2]), <float *>(A + o[3]), 16, 32, 1e-06, threads)
    if st != 0: status[0] = st; return 0
    if clock != NULL: clock[1] = now()
    # matmul float32[2, 8, 32] float32[2, 8, 32] float32[32, 32]
    st = gemm_fwd_f32(<float *>(A + o[4]), RT_F32, <float *>(A + o[0]), <float *>(A + o[5]), NULL, 16, 32, 32, RT_TRANS_B, threads)
    if st != 0: status[0] = st; return 1
    if clock != NULL: clock[2] = now()
    # matmul float32[2, 8, 16] float32[2, 8, 32] float32[16, 32]
    st = gemm_fwd_f32(<float *>(A + o[6]), RT_F32, <float *>(A + o[0]), <float *>(A + o[7]), NULL, 16, 16, 32, RT_TRANS_B, threads)
    if st != 0: status[0] = st; return 2
    if clock != NULL: clock[3] = now()
    # matmul float32[2, 8, 16] float32[2, 8, 32] float32[16, 32]
    st = gemm_fwd_f32(<float *>(A + o[8]), RT_F32, <float *>(A + o[0]), <float *>(A + o[9]), NULL, 16, 16, 32, RT_TRANS_B, threads)
    if st != 0: status[0] = st; return 3
    if clock != NULL: clock[4] = now()
    # reshape[new_sizes=(2, 8, 4, 8)] float32[2, 8, 4, 8] float32[2, 8, 32]
    memmove(<float *>(A + o[10]), <float *>(A + o[4]), 2048)
    if st != 0: status[0] = st; return 4
    if clock != NULL: clock[5] = now()
    # reshape[new_sizes=(2, 8, 2, 8)] float32[2, 8, 2, 8] float32[2, 8, 16]
    memmove(<float *>(A + o[4]), <float *>(A + o[6]), 1024)
    if st != 0: status[0] = st; return 5
    if clock != NULL: clock[6] = now()
    # reshape[new_sizes=(2, 8, 2, 8)] float32[2, 8, 2, 8] float32[2, 8, 16]
    memmove(<float *>(A + o[11]), <float *>(A + o[8]), 1024)
    if st != 0: status[0] = st; return 6
    if clock != NULL: clock[7] = now()
    # rope[theta=10000.0] float32[2, 8, 4, 8] float32[2, 8, 4, 8]
    st = rope_fwd_f32(<float *>(A + o[12]), <float *>(A + o[10]), 2, 8, 4, 8, INV_FREQ_8_edfbb1c1, 1.0, threads)
    if st != 0: status[0] = st; return 7
    if clock != NULL: clock[8] = now()
    # rope[theta=10000.0] float32[2, 8, 2, 8] float32[2, 8, 2, 8]
    st = rope_fwd_f32(<float *>(A + o[13]), <float *>(A + o[4]), 2, 8, 2, 8, INV_FREQ_8_edfbb1c1, 1.0, threads)
    if st != 0: status[0] = st; return 8
    if clock != NULL: clock[9] = now()
    # attention[alibi=False causal=True] float32[2, 8, 4, 8] float32[2, 4, 8] float32[2, 8, 4, 8] float32[2, 8, 2, 8] float32[2, 8, 2, 8]
    st = attention_fwd_f32(<float *>(A + o[14]), <float *>(A + o[15]), <float *>(A + o[12]), <float *>(A + o[13]), <float *>(A + o[11]), NULL, 2, 8, 4, 2, 8, 1, threads)
    if st != 0: status[0] = st; return 9
    if clock != NULL: clock[10] = now()
    # reshape[new_sizes=(2, 8, 32)] float32[2, 8, 32] float32[2, 8, 4, 8]
    memmove(<float *>(A + o[16]), <float *>(A + o[14]), 2048)
    if st != 0: status[0] = st; return 10
    if clock != NULL: clock[11] = now()
    # matmul float32[2, 8, 32] float32[2, 8, 32] float32[32, 32]
    st = gemm_fwd_f32(<float *>(A + o[4]), RT_F32, <float *>(A + o[16]), <float *>(A + o[17]), NULL, 16, 32, 32, RT_TRANS_B, threads)
    if st != 0: status[0] = st; return 11
    if clock != NULL: clock[12] = now()
    # add float32[2, 8, 32] float32[2, 8, 32] float32[2, 8, 32]
    st = rt_add_f32(<float *>(A + o[18]), <float *>(A + o[2]), <float *>(A + o[4]), 512)
    if st != 0: status[0] = st; return 12
    if clock != NULL: clock[13] = now()
    # rms_norm[eps=1e-06] float32[2, 8, 32] float32[2, 8] float32[2, 8, 32] float32[32]
    st = rmsnorm_fwd_f32(<float *>(A + o[19]), <float *>(A + o[20]), <float *>(A + o[18]), <float *>(A + o[21]), 16, 32, 1e-06, threads)
    if st != 0: status[0] = st; return 13
    if clock != NULL: clock[14] = now()
    # matmul float32[2, 8, 48] float32[2, 8, 32] float32[48, 32]
    st = gemm_fwd_f32(<float *>(A + o[22]), RT_F32, <float *>(A + o[19]), <float *>(A + o[23]), NULL, 16, 48, 32, RT_TRANS_B, threads)
    if st != 0: status[0] = st; return 14
    if clock != NULL: clock[15] = now()
    # matmul float32[2, 8, 48] float32[2, 8, 32] float32[48, 32]
    st = gemm_fwd_f32(<float *>(A + o[24]), RT_F32, <float *>(A + o[19]), <float *>(A + o[25]), NULL, 16, 48, 32, RT_TRANS_B, threads)
    if st != 0: status[0] = st; return 15
    if clock != NULL: clock[16] = now()
    # swiglu float32[2, 8, 48] float32[2, 8, 48] float32[2, 8, 48]
    st = swiglu_fwd_f32(<float *>(A + o[26]), <float *>(A + o[22]), <float *>(A + o[24]), 768, threads)
    if st != 0: status[0] = st; return 16
    if clock != NULL: clock[17] = now()
    # matmul float32[2, 8, 32] float32[2, 8, 48] float32[32, 48]
    st = gemm_fwd_f32(<float *>(A + o[4]), RT_F32, <float *>(A + o[26]), <float *>(A + o[27]), NULL, 16, 32, 48, RT_TRANS_B, threads)
    if st != 0: status[0] = st; return 17
    if clock != NULL: clock[18] = now()
    # add float32[2, 8, 32] float32[2, 8, 32] float32[2, 8, 32]
    st = rt_add_f32(<float *>(A + o[28]), <float *>(A + o[18]), <float *>(A + o[4]), 512)
    if st != 0: status[0] = st; return 18
    if clock != NULL: clock[19] = now()
    return -1


cdef function_t FUNCTIONS[9]
FUNCTIONS[0] = f0
FUNCTIONS[1] = f1
FUNCTIONS[2] = f2
FUNCTIONS[3] = f3
FUNCTIONS[4] = f4
FUNCTIONS[5] = f5
FUNCTIONS[6] = f6
FUNCTIONS[7] = f7
FUNCTIONS[8] = f8


def run_function(int function, size_t arena, size_t offsets, int threads, size_t clock=0):
    """Run generated function `function` on the arena at address `arena`, its pointers'
    int64 offsets at address `offsets`; (index of the failing call or -1, kernel status).
    `clock`: 0, or the address of calls + 1 doubles that get the monotonic seconds at
    the start and after each call."""
    if function < 0 or function >= 9:
        raise IndexError("generated program: no such function")
    cdef int status = 0, failed
    cdef function_t run = FUNCTIONS[function]
    with nogil:
        failed = run(<char *>arena, <const int64_t *>offsets, threads, &status,
                     <double *>clock)
    return failed, status
