"""The DMA layer and scratch arenas seen from Python: counters reset and count per level,
kernels stay correct when the profile gives smaller GSM/AM (smaller tiles, more DMA), and a
scratch too small for any tile is reported as an error, not a crash."""
import numpy as np
import pytest
from native_refs import assert_close

from ratrain import kernels


@pytest.fixture
def small_scratch():
    """MT-3000 defaults are GSM 6 MB, AM 768 KB; shrink them, then restore."""
    before = kernels.scratch_sizes()
    kernels.scratch_config(256 << 10, 96 << 10)
    yield
    kernels.scratch_config(before["gsm"], before["am"])


def test_dma_reset_and_keys():
    kernels.dma_reset()
    assert kernels.dma_stats() == dict(ddr_to_gsm=0, ddr_to_am=0, gsm_to_ddr=0, am_to_ddr=0,
                                       gets=0, puts=0)
    q = np.ones((1, 64, 1, 64), np.float16)
    kernels.attention_fwd(q, q, q)
    stats = kernels.dma_stats()
    # one query tile in, one output tile out, one K and one V tile in: 4 x 64 x 64 x 2 bytes
    assert stats["ddr_to_am"] == 3 * 64 * 64 * 2 and stats["am_to_ddr"] == 64 * 64 * 2


def test_small_scratch_gives_smaller_tiles_same_numbers(small_scratch):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 700)).astype(np.float16)
    b = rng.standard_normal((500, 700)).astype(np.float16)
    plan = kernels.gemm_plan(300, 500, 700, trans_b=True)
    assert plan["nc"] < 500                      # the column block no longer fits whole
    out = kernels.gemm(a, b, trans_b=True, out_dtype=np.float32, threads=2)
    # fp32 accumulation over K=700 of O(1) products, see test_native_gemm.REL
    assert_close(out, a.astype(np.float64) @ b.astype(np.float64).T, 2e-6, "gemm small scratch")
    q = rng.standard_normal((1, 100, 2, 128)).astype(np.float16)
    o_small, _ = kernels.attention_fwd(q, q, q)
    kernels.scratch_config(6 << 20, 768 << 10)
    o_big, _ = kernels.attention_fwd(q, q, q)
    # different tile sizes change only the fp32 summation order; outputs are fp16 (2^-11)
    assert_close(o_small, o_big, 2e-3, "attention tiles")


def test_scratch_too_small_is_an_error():
    before = kernels.scratch_sizes()
    try:
        kernels.scratch_config(64 << 10, 64 << 10)
        with pytest.raises(RuntimeError, match="scratch"):
            kernels.gemm(np.ones((8, 20000), np.float16), np.ones((20000, 8), np.float16))
    finally:
        kernels.scratch_config(before["gsm"], before["am"])
    with pytest.raises(RuntimeError):
        kernels.scratch_config(1, 1)
