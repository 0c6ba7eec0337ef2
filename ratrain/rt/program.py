"""What a rank needs of a compiled program, without the compiler: options, rank layout,
per-stage memory plans, every layer's parameter names and state slots, and the stage's
task table with its generated module. `ratrain compile` writes it (runtime.pkl plus
code/stage<N>.{pkl,pyx}); `python -m ratrain.rt` reads it, so a rank imports neither JAX
nor the passes and never recompiles.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path

# runtime.pkl and code/ hold the program (3: TIE tasks, RoPE tables; 4: ZeRO-3 gathers,
# and the commit rule's speculative adamw, redo_update and undo.L; 5: periodic stage
# tables, NOTE [periodic programs])
FORMAT = "ratrain-program/5"


def ratrain_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("ratrain")
    except PackageNotFoundError:
        return "unknown"


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


@dataclass
class RuntimeProgram:
    graph: RuntimeGraph
    options: object                     # CompileOptions
    stages: tuple                       # layer indices of each stage
    memory: Memory
    layers: dict                        # layer -> LayerState
    tie_stages: tuple = ()              # stages summing a tied weight's gradient (TIE)
    directory: Path | None = None       # where code/ lives (set when opened)
    _code: dict = field(default_factory=dict, repr=False)

    def rank(self, stage: int, replica: int) -> int:
        return replica * self.options.pp + stage

    def coords(self, rank: int) -> tuple[int, int]:
        return rank % self.options.pp, rank // self.options.pp

    def state_slots(self, layer: int) -> tuple:
        return self.layers[layer].state

    def view_slots(self, layer: int) -> tuple:
        return self.layers[layer].views

    def layer_params(self, layer: int) -> tuple:
        return self.layers[layer].params

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def stage_code(self, stage: int) -> tuple:
        """(StageTable, loaded generated module) of a stage, built if not cached yet."""
        if stage not in self._code:
            from ratrain.codegen.build import build_module, load_module
            code = self.directory / "code"
            table = pickle.loads((code / f"stage{stage}.pkl").read_bytes())
            module = load_module(build_module((code / f"stage{stage}.pyx").read_text(),
                                              self.directory))
            self._code[stage] = (table, module)
        return self._code[stage]

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_code", "directory")}

    def __setstate__(self, state):
        self.__dict__.update(state, _code={}, directory=None)


def runtime_program(program) -> RuntimeProgram:
    """The RuntimeProgram of a compiled (lowered) Program."""
    from ratrain.passes.insert_tied_sum import tie_stages
    graph = program.graph
    layers = {index: LayerState(program.layer_params(index), program.state_slots(index),
                                program.view_slots(index)) for index in range(len(graph.layers))}
    memory = Memory({s: StagePlan(m.arena_bytes, m.peak_bytes, dict(m.offsets), m.persistent)
                     for s, m in program.memory.stages.items()})
    return RuntimeProgram(RuntimeGraph(graph.name, graph.config), program.options,
                          program.stages, memory, layers, tie_stages(program))


def code_files(program, header: str) -> dict[str, bytes | str]:
    """code/stage<N>.pyx, .pkl and .legend.txt (which slots each generated function's
    offsets are, for its first user) of every stage, and runtime.pkl."""
    from ratrain.codegen import generate
    from ratrain.codegen.legend import format_legend
    files: dict[str, bytes | str] = {"runtime.pkl": pickle.dumps(runtime_program(program), 5)}
    for stage, (table, source) in generate(program, header).items():
        files[f"code/stage{stage}.pyx"] = source
        files[f"code/stage{stage}.pkl"] = pickle.dumps(table, 5)
        files[f"code/stage{stage}.legend.txt"] = format_legend(table)
    return files
