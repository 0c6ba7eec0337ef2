"""The measured timeline of a run: one Chrome trace event per task and rank (open
DIR/trace-rank<R>.json in Perfetto or chrome://tracing), to set beside the simulator's.
Each rank writes its own file; times are microseconds since the rank's first step.
"""
from __future__ import annotations

import json
import time
from pathlib import Path


class TaskTrace:
    """Complete ("X") events of one rank: name = task text, args = step."""

    def __init__(self, rank: int, stage: int):
        self.rank, self.stage, self.events = rank, stage, []
        self.origin = time.perf_counter()

    def record(self, task, step: int, start: float, end: float) -> None:
        self.events.append({"name": str(task), "ph": "X", "pid": self.rank, "tid": 0,
                            "ts": (start - self.origin) * 1e6, "dur": (end - start) * 1e6,
                            "args": {"step": step}})

    def write(self, directory: str) -> Path:
        path = Path(directory) / f"trace-rank{self.rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        label = {"name": "process_name", "ph": "M", "pid": self.rank,
                 "args": {"name": f"rank {self.rank} (stage {self.stage})"}}
        path.write_text(json.dumps({"traceEvents": [label] + self.events}))
        return path
