"""How far apart a 16-core node's replicas compute, step by step (issue 40's stragglers):
for each traced layout of a directory `../shared/device/node16.sh` filled, every step
after the first two and every stage, the replicas' compute (the run time of their F, B,
BL, W and REC tasks, waits inside them included as the trace records them) as a standard
deviation over the mean and as the slowest's excess over the mean; and the UPD time of
the replica that computed longest against the one that computed least. The slowest
replica waits only for the collectives' tail, the others for it too: where the first is
small, the step's time beyond the mean compute is the replicas' spread, not the link.

Reads traces.tar.gz as bench/node16-h200/ and bench/node16-h200-2/roundN hold it, so it
runs anywhere. Usage: python bench/replica_spread.py [DIR] [LAYOUT ...]."""
import argparse
import json
import statistics
import sys
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path

from ratrain.ir.tasks import Kind, parse_task

HERE = Path(__file__).resolve().parent
COMPUTE = {Kind.F, Kind.B, Kind.BL, Kind.W, Kind.REC}
SKIP = 2                                # a run's first steps warm caches and allocators


def rank_steps(path: Path) -> tuple[int | None, dict, dict]:
    """One rank's trace: (its stage, step -> compute seconds, step -> UPD seconds)."""
    compute, upd, stage = defaultdict(float), defaultdict(float), None
    for event in json.loads(path.read_text())["traceEvents"]:
        if event.get("ph") != "X":
            continue
        try:
            task = parse_task(event["name"])
        except ValueError:
            continue
        stage, step = task.stage, event["args"].get("step", 0)
        if task.kind in COMPUTE:
            compute[step] += event["dur"] * 1e-6
        elif task.kind == Kind.UPD:
            upd[step] += event["dur"] * 1e-6
    return stage, compute, upd


def layout_lines(name: str, traces: Path) -> list[str]:
    ranks = [rank_steps(p) for p in sorted(traces.glob("trace-rank*.json"))]
    spread, excess, slowest_upd, fastest_upd = [], [], [], []
    for stage in sorted({s for s, _, _ in ranks if s is not None}):
        replicas = [(c, u) for s, c, u in ranks if s == stage]
        if len(replicas) < 2:
            continue
        for step in sorted(set.intersection(*(set(c) for c, _ in replicas))):
            if step <= SKIP:
                continue
            times = [c[step] for c, _ in replicas]
            mean = statistics.mean(times)
            spread.append(statistics.pstdev(times) / mean)
            excess.append((max(times) - mean) / mean)
            slow = max(replicas, key=lambda r: r[0][step])
            fast = min(replicas, key=lambda r: r[0][step])
            slowest_upd.append(slow[1].get(step, 0.0))
            fastest_upd.append(fast[1].get(step, 0.0))
    if not spread:
        return [f"{name:<28} one replica: no spread"]
    return [f"{name:<28} replicas' compute per step and stage: sd/mean "
            f"{statistics.median(spread):.1%} (range {min(spread):.1%}-{max(spread):.1%}), "
            f"(slowest - mean)/mean {statistics.median(excess):.1%}; UPD of the slowest "
            f"{statistics.median(slowest_upd):.3f} s, of the fastest "
            f"{statistics.median(fastest_upd):.3f} s (medians over {len(spread)})"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?", default=str(HERE / "node16-h200"))
    ap.add_argument("layouts", nargs="*", help="layouts to read (default: every one traced)")
    args = ap.parse_args()
    archive = Path(args.dir) / "traces.tar.gz"
    if not archive.is_file():
        sys.exit(f"bench/replica_spread: {archive} is missing; give a directory "
                 "../shared/device/node16.sh filled")
    with tempfile.TemporaryDirectory() as scratch:
        with tarfile.open(archive) as tar:
            tar.extractall(scratch, filter="data")
        found = sorted(p.name for p in Path(scratch).iterdir() if p.is_dir())
        if unknown := [n for n in args.layouts if n not in found]:
            sys.exit(f"bench/replica_spread: no traces of {unknown[0]} in {archive}; it has "
                     f"{', '.join(found)}")
        print(f"# {args.dir}: steps after {SKIP}")
        for name in args.layouts or found:
            print("\n".join(layout_lines(name, Path(scratch) / name)))


if __name__ == "__main__":
    main()
