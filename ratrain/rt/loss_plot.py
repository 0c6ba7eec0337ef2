"""The loss curve of a run as a PNG beside its metrics file (rank 0, after the last step):
training loss per step and, where the run evaluated, the held-out loss. Read from the
metrics file, so a resumed run's plot shows the whole run. Headless (matplotlib's Agg).
"""
from __future__ import annotations

import json
from pathlib import Path


def plot_path(metrics: str) -> Path:
    """Where the plot of `metrics` goes: loss.png beside metrics.jsonl (a `ratrain train`
    run directory), NAME-loss.png beside any other NAME.jsonl."""
    path = Path(metrics)
    return path.with_name("loss.png" if path.stem == "metrics" else f"{path.stem}-loss.png")


def loss_series(metrics: str) -> tuple[list, list]:
    """((step, loss) of every line, (step, eval_loss) of the lines that evaluated)."""
    records = [json.loads(line) for line in Path(metrics).read_text().splitlines()
               if line.strip()]
    return ([(r["step"], r["loss"]) for r in records],
            [(r["step"], r["eval_loss"]) for r in records if r.get("eval_loss") is not None])


def write_loss_plot(metrics: str, width_px: int = 800, height_px: int = 500) -> Path:
    """Draw loss (and eval loss) over steps from `metrics` into plot_path(metrics),
    `width_px` x `height_px` pixels; the path written."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    train, held_out = loss_series(metrics)
    dpi = 100
    fig, ax = plt.subplots(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    try:
        ax.plot(*zip(*train), label="loss", linewidth=1)
        if held_out:
            ax.plot(*zip(*held_out), "o-", label="eval loss", markersize=3)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (mean next-token cross-entropy)")
        ax.set_title(f"{Path(metrics).resolve().parent.name}: {len(train)} steps")
        ax.grid(alpha=0.3)
        ax.legend()
        out = plot_path(metrics)
        fig.savefig(out, dpi=dpi)
    finally:
        plt.close(fig)
    return out
