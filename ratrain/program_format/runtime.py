"""What a rank needs of a compiled program besides its stage's rows: options, rank layout,
per-stage memory plans, every layer's parameter names and state slots (runtime.json), and
the format's name and compatibility rule.

NOTE [program format]: a program directory is JSON and generated Cython, never pickle:
program.json (the manifest, with the file hashes), runtime.json (RuntimeProgram),
code/stage<N>.tasks.json (StageRows, one line per row) and code/stage<N>.pyx (rendered
from the rows; formats before 10 run it only with --trust-program-code). Its
"format" names the version, "ratrain-program/N". A runtime reads every format listed in
READABLE and refuses any other in one line: an older one it no longer reads (the pickled
formats 1-5) asks for a recompile, an unknown (newer) one for a newer ratrain. A change a
reader of the current format would misread bumps N; the new runtime keeps reading the old
N (codec.py converts) for as long as tests/fixtures holds a program of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

FORMAT = "ratrain-program/10"          # 10: the rows hold the generated functions as
                                        # data, the .pyx is rendered from them (NOTE [a
                                        # program directory is data], rt/program.py);
                                        # 9: options name the pipeline schedule (zb1 has
                                        # W tasks), the rows say where each SYNC starts (a
                                        # B's per-layer pieces, no table beside them: NOTE
                                        # [sync issue point]); 8: options name the
                                        # placement; 7: every call names its layer; 6: JSON
READABLE = (FORMAT, "ratrain-program/9", "ratrain-program/8", "ratrain-program/7",
            "ratrain-program/6")         # (5 and older: pickles)
PICKLED = tuple(f"ratrain-program/{n}" for n in range(1, 6))


def format_problem(found: str | None) -> str | None:
    """Why a program written in format `found` cannot be read here (one line), or None."""
    if found in READABLE:
        return None
    if found in PICKLED or found is None:
        return (f"was written by an older ratrain in {found or 'an unnamed format'} "
                f"(pickled tables), which this ratrain ({FORMAT}) no longer reads: recompile it")
    return (f"was written in {found}, which this ratrain does not know (it reads "
            f"{', '.join(READABLE)}): run it with the ratrain that compiled it, or recompile it")


@dataclass(frozen=True)
class StagePlan:
    arena_bytes: int                    # bytes the rank allocates
    peak_bytes: int                     # most bytes live at once, per plan_memory
    offsets: dict                       # buffer name -> (arena offset, nbytes)
    persistent: frozenset               # buffers live for the whole run


@dataclass(frozen=True)
class Memory:
    stages: dict                        # stage -> StagePlan


@dataclass(frozen=True)
class LayerState:
    params: tuple                       # (HF name, shape) in flattening order
    state: tuple                        # master, m, v slots, full size, shard size
    views: tuple                        # the view slot of every parameter


@dataclass(frozen=True)
class RuntimeGraph:
    name: str                           # model name
    config: dict                        # HF config


@dataclass(frozen=True)
class RuntimeProgram:
    graph: RuntimeGraph
    options: object                     # CompileOptions
    stages: tuple                       # layer indices of each stage
    memory: Memory
    layers: dict                        # layer -> LayerState
    tie_stages: tuple = ()              # stages summing a tied weight's gradient (TIE)
    directory: str | None = field(default=None, compare=False)  # where code/ is, once opened

    def rank(self, stage: int, replica: int) -> int:
        return self.options.rank_placement.rank(stage, replica)

    def coords(self, rank: int) -> tuple[int, int]:
        return self.options.rank_placement.coords(rank)

    def state_slots(self, layer: int) -> tuple:
        return self.layers[layer].state

    def view_slots(self, layer: int) -> tuple:
        return self.layers[layer].views

    def layer_params(self, layer: int) -> tuple:
        return self.layers[layer].params

    @property
    def num_layers(self) -> int:
        return len(self.layers)
