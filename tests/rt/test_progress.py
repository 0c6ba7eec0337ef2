"""What a run shows while and after it trains, in one process: model FLOPs from the traced
graph, the progress line, elapsed and ETA, the one summary and the loss plot."""
import json
import struct

import pytest

from ratrain import models
from ratrain.models.trace import trace_model
from ratrain.rt.loss_plot import loss_series, plot_path, write_loss_plot
from ratrain.rt.metrics import MetricsLog, StepMetrics, Throughput, clock


def tiny_graph(seq_len=32):
    return trace_model(models.get_config("tiny"), micro_batch_size=1, seq_len=seq_len)


def test_model_flops_are_6_n_tokens_plus_attention():
    """See NOTE [model FLOPs and MFU]: 3 x the forward = 6 x (matmul parameters, head
    included) x tokens + 12 x layers x heads x head-dim x causal pairs, plus elementwise
    ops (RMSNorm, RoPE, SwiGLU, residual adds), which are under 1% here."""
    c, T = models.get_config("tiny"), 32
    H, L, F, V = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
    heads = c["num_attention_heads"]
    matmul_params = L * (4 * H * H + 3 * H * F) + V * H
    dense = 6 * matmul_params * T + 12 * L * heads * (H // heads) * (T * (T + 1) // 2)
    counted = tiny_graph(T).micro_batch_flops()
    assert dense == 626_196_480
    assert 1 < counted / dense < 1.01


def test_model_flops_do_not_count_recompute_or_kernel_rework():
    """3 x the forward, not the rules' backward, which counts flash attention's second
    QK^T and the cross-entropy's second logits product."""
    from ratrain.ir.costs import layer_cost
    graph = tiny_graph()
    forward = sum(layer_cost(graph.kinds[l.kind]).fwd_flops for l in graph.layers)
    executed = sum(layer_cost(graph.kinds[l.kind]).bwd_flops for l in graph.layers)
    assert graph.micro_batch_flops() == 3 * forward
    assert executed > 2 * forward


def step(n, seconds=0.5, elapsed=0.0, eta=0.0, **fields):
    return StepMetrics(n, 4.0 - n / 10, 1000 / seconds, seconds, 1e-3, [2 ** 20, 2 ** 21],
                       [100 * 2 ** 20, 300 * 2 ** 20], elapsed_s=elapsed, eta_s=eta, **fields)


def test_progress_line_has_rate_mfu_memory_elapsed_and_eta():
    metrics = step(7, seconds=0.5, elapsed=75, eta=3725, model_flops=2e12, mfu=0.4,
                   eval_loss=3.25)
    assert metrics.progress_line(100) == (
        "step 7/100  loss 3.3000  eval loss 3.2500  lr 0.001  2,000 tokens/s  "
        "4.00 TFLOP/s  MFU 40.0%  mem 300.00 MiB  elapsed 1:15  ETA 1:02:05")
    old_program = step(1, elapsed=2.25, eta=9, loss_scale=1024.0, skipped=True)
    assert old_program.progress_line(5).endswith(
        "tokens/s  mem 300.00 MiB  elapsed 2.2s  ETA 9.0s  loss scale 1024  "
        "skipped (gradient overflow)")


def test_clock_formats():
    assert [clock(s) for s in (0.04, 59.9, 60, 3599, 3600, 86399)] == \
        ["0.0s", "59.9s", "1:00", "59:59", "1:00:00", "23:59:59"]


def test_eta_is_the_mean_step_after_the_first(monkeypatch):
    now = iter([0.0, 10.0, 12.0, 16.0])  # construction, then the end of steps 3, 4, 5
    monkeypatch.setattr("ratrain.rt.metrics.time.perf_counter", lambda: next(now))
    log = MetricsLog(None, steps=10)
    assert log.clock(3) == (10.0, 70.0)   # only the first step (warm-up) to go by
    log.write(step(3, elapsed=10.0))
    assert log.clock(4) == (12.0, 12.0)   # 2 s a step, 6 steps left
    log.write(step(4, elapsed=12.0))
    assert log.clock(5) == (16.0, 15.0)   # (16 - 10) / 2 = 3 s a step, 5 left


def test_throughput_reads_the_manifest_and_divides():
    rate = Throughput.of_manifest({"flops": {"model_per_step": 6e9, "peak": 2e11}})
    assert rate == Throughput(6e9, 2e11) and rate.mfu(0.5) == pytest.approx(0.06)
    assert MetricsLog(None, 3, rate).rate_fields(0.5) == {"model_flops": 6e9,
                                                          "mfu": pytest.approx(0.06)}
    assert Throughput.of_manifest({}) is None  # a program compiled before the field
    assert MetricsLog(None, 3, None).rate_fields(0.5) == {}


def test_one_summary_names_time_loss_rate_mfu_memory_and_file():
    log = MetricsLog(None, steps=3, throughput=Throughput(int(1e11), 1e12))
    log.steps = [step(1, seconds=2.0, elapsed=2), step(2, seconds=0.5, elapsed=2.5),
                 step(3, seconds=0.5, elapsed=3.0, eval_loss=3.5)]
    log.path = "run/metrics.jsonl"
    assert log.summary() == (
        "done: 3 steps in 3.0s, final loss 3.7000 (first 3.9000), eval loss 3.5000 at step 3, "
        "2,000 tokens/s, 200.00 GFLOP/s (MFU 20.0%); per rank (max) 300.00 MiB resident, "
        "arena 2.00 MiB; metrics run/metrics.jsonl")


def png_size(path) -> tuple[int, int]:
    """(width, height) from a PNG's signature and IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_loss_plot_is_a_png_beside_the_metrics(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": k, "loss": 5 - k / 10} | (
        {"eval_loss": 5.1 - k / 10} if k % 5 == 0 else {})) + "\n" for k in range(1, 21)))
    train, held_out = loss_series(str(metrics))
    assert train[0] == (1, 4.9) and len(train) == 20
    assert [step for step, _ in held_out] == [5, 10, 15, 20]
    assert [loss for _, loss in held_out] == pytest.approx([4.6, 4.1, 3.6, 3.1])
    assert write_loss_plot(str(metrics)) == tmp_path / "loss.png"
    assert png_size(tmp_path / "loss.png") == (800, 500)
    assert plot_path(str(tmp_path / "fp16.jsonl")) == tmp_path / "fp16-loss.png"


def test_elapsed_counts_on_from_the_checkpoint_and_the_summary_says_both(monkeypatch):
    """See NOTE [elapsed across resumes]: a job resumed from a checkpoint at 100 s of
    training."""
    now = iter([0.0, 10.0, 12.0])  # construction, then the end of steps 31 and 32
    monkeypatch.setattr("ratrain.rt.metrics.time.perf_counter", lambda: next(now))
    log = MetricsLog(None, steps=40, before=100.0)
    assert log.clock(31) == (110.0, 90.0)   # the ETA is this job's: 10 s for its first step
    log.write(step(31, elapsed=110.0))
    assert log.clock(32) == (112.0, 16.0)
    log.write(step(32, elapsed=112.0, eval_loss=3.25))
    assert log.summary().startswith("done: 2 steps in 12.0s (1:52 since the run began), "
                                    "final loss 0.8000 (first 0.9000), eval loss 3.2500 at "
                                    "step 32")
