"""Buffer names: the arena buffers tasks create and read, with a text form that parses back.

passes/buffers.py says which buffers each task creates and reads, lowering addresses slots
in them, plan_memory places them, and codegen, the simulator and the runtime read the names
back. One template per kind (`NAME_FORMS`) builds, parses and validates every name, as
ir/tasks.py's TEXT_FORMS does for tasks; names are plain strings everywhere else.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from ratrain.ir.tasks import Kind, Task, compile_form, describe_forms, parse_task


class BufferKind(StrEnum):
    MASTER = "master"     # fp32 master parameters of a layer (its shard under ZeRO 1-3)
    OPT = "opt"           # AdamW moments [m | v] of a layer (shards under ZeRO 1-3)
    VIEW = "view"         # compute-dtype parameter view of a layer (ZeRO 0-2)
    ZVIEW = "zview"       # ZeRO-3: one slot of the ring of gathered views
    GRAD = "grad"         # a layer's full fp32 gradient
    GSHARD = "gshard"     # this rank's shard of a layer's fp32 gradient (ZeRO 2/3)
    UNDO = "undo"         # commit rule: a speculative UPD's copy [master | m | v]
    ACT = "act"           # residuals of (layer, micro-batch) kept from F to B
    WACT = "wact"         # zb1: the kept residuals W[L] reads, from F to W[L] (NOTE
                          # [weight operands], passes/layer_buffers.py)
    REC = "rec"           # residuals of (layer, micro-batch) a REC task rebuilt
    WOP = "wop"           # zb1: what B hands W[L] of (layer, micro-batch) (NOTE [weight
                          # operands], passes/layer_buffers.py)
    IN = "in"             # forward activation received from stage - 1
    OUT = "out"           # forward activation sent to stage + 1
    GIN = "gin"           # output gradient received from stage + 1
    GOUT = "gout"         # input gradient sent to stage - 1
    WS = "ws"             # one task's workspace (its intermediates)
    VOCAB = "vocab"       # vocabulary-parallel head: a micro-batch's final hidden state,
                          # targets and softmax statistics, from S to T (NOTE
                          # [vocabulary-parallel head])


# The whole grammar: one template per kind. It prints a name; compiled, it parses it back.
NAME_FORMS: dict[BufferKind, str] = {
    BufferKind.MASTER: "master.L{layer}",
    BufferKind.OPT: "opt.L{layer}",
    BufferKind.VIEW: "view.L{layer}",
    BufferKind.ZVIEW: "zview.{slot}",
    BufferKind.GRAD: "grad.L{layer}",
    BufferKind.GSHARD: "gshard.L{layer}",
    BufferKind.UNDO: "undo.L{layer}",
    BufferKind.ACT: "act.L{layer}.mb{micro_batch}",
    BufferKind.WACT: "wact.L{layer}.mb{micro_batch}",
    BufferKind.REC: "rec.L{layer}.mb{micro_batch}",
    BufferKind.WOP: "wop.L{layer}.mb{micro_batch}",
    BufferKind.IN: "in.mb{micro_batch}",
    BufferKind.OUT: "out.mb{micro_batch}",
    BufferKind.GIN: "gin.mb{micro_batch}",
    BufferKind.GOUT: "gout.mb{micro_batch}",
    BufferKind.WS: "ws.{task}",
    BufferKind.VOCAB: "vocab.mb{micro_batch}",
}

# What each placeholder may hold. A workspace names its task by the task's text, or by
# its arena form (arena_name), with the brackets a FREE's operand cannot hold as parentheses.
_FIELD_PATTERNS = {"layer": r"\d+", "micro_batch": r"\d+", "slot": r"\d+", "task": r"\S+"}


_PATTERNS = {kind: compile_form(form, _FIELD_PATTERNS) for kind, form in NAME_FORMS.items()}
_OPERANDS = {kind: frozenset(p.groupindex) for kind, p in _PATTERNS.items()}
_EXPECTED = describe_forms(NAME_FORMS.values())


def arena_name(name: str) -> str:
    """A buffer's name in the plan and in FREE tasks. Task text forbids brackets in a
    FREE's operand, but workspace names embed task text (`ws.0REC[L1]0`): map them to
    parentheses (`ws.0REC(L1)0`). The identity for every other name."""
    return name.replace("[", "(").replace("]", ")")


@dataclass(frozen=True)
class BufferName:
    kind: BufferKind                    # what the buffer holds
    layer: int | None = None            # global layer index: per-layer state, act, wact, rec, wop
    micro_batch: int | None = None      # act, wact, rec, wop and the messages
    slot: int | None = None             # zview: index in the ring of view slots
    task: str | None = None             # ws: text of the task owning the workspace

    def __post_init__(self):
        object.__setattr__(self, "kind", BufferKind(self.kind))
        if isinstance(self.task, Task):
            object.__setattr__(self, "task", str(self.task))
        _check_operands(self)

    def __str__(self) -> str:
        return NAME_FORMS[self.kind].format(layer=self.layer, micro_batch=self.micro_batch,
                                            slot=self.slot, task=self.task)


def _check_operands(name: BufferName) -> None:
    form = NAME_FORMS[name.kind]
    for field in ("layer", "micro_batch", "slot", "task"):
        value, wanted = getattr(name, field), field in _OPERANDS[name.kind]
        if wanted == (value is None):
            need = "needs a" if wanted else "takes no"
            raise ValueError(f"{name.kind} buffer {need} {field} (form {form})")
    if name.task is not None:
        parse_task(name.task.replace("(", "[").replace(")", "]"))  # raises on a non-task
    for field in ("layer", "micro_batch", "slot"):
        value = getattr(name, field)
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ValueError(f"{name.kind} buffer: {field} must be an int >= 0, got {value!r}")


@lru_cache(maxsize=1 << 16)
def buffer_name(kind: BufferKind | str, **operands) -> str:
    """The name of the buffer of `kind` with these operands: `buffer_name("act", layer=5,
    micro_batch=3) == "act.L5.mb3"`; a workspace's `task` may be a Task. Raises ValueError
    on a missing, extra or malformed operand."""
    return str(BufferName(BufferKind(kind), **operands))


@lru_cache(maxsize=1 << 16)
def parse_buffer(text: str) -> BufferName:
    """Parse one buffer name (or its arena form); `str(parse_buffer(s)) == s` for every
    name s the grammar makes. Raises ValueError naming the text and the forms expected."""
    for kind, pattern in _PATTERNS.items():
        match = pattern.fullmatch(text)
        if match:
            operands = {name: value if name == "task" else int(value)
                        for name, value in match.groupdict().items()}
            try:
                return BufferName(kind, **operands)
            except ValueError as error:
                raise ValueError(f"cannot parse buffer name {text!r}: {error}") from None
    raise ValueError(f"cannot parse buffer name {text!r}; expected one of: {_EXPECTED} "
                     f"(e.g. grad.L3, act.L5.mb3, zview.0, ws.1B2)")


def is_grad_shard(name: str) -> bool:
    """Does the buffer hold only this rank's shard of a layer's gradient (gshard.L)?"""
    return parse_buffer(name).kind == BufferKind.GSHARD


# The message buffer a pipeline task sends from, posts a receive into or waits on.
_MESSAGES = {Kind.SEND_F: BufferKind.OUT, Kind.POST_F: BufferKind.IN, Kind.RECV_F: BufferKind.IN,
             Kind.SEND_B: BufferKind.GOUT, Kind.POST_B: BufferKind.GIN,
             Kind.RECV_B: BufferKind.GIN}


def message_buffer(task: Task) -> str:
    """The buffer of the message a SEND_*, POST_* or RECV_* task moves: `1SEND_F3` sends
    out.mb3, `2POST_F3` and `2RECV_F3` receive it into in.mb3 (gout / gin backward)."""
    return buffer_name(_MESSAGES[task.kind], micro_batch=task.micro_batch)


# ---- which buffer holds a layer's gradient, as B, SYNC and UPD see it --------------------

def grad_accumulator(layer: int, scattered: bool) -> str:
    """The buffer B writes or adds the layer's gradient into: grad.L, or under scatter
    accumulation (`scattered`, NOTE [gradient accumulation]) this rank's shard gshard.L,
    which each B's reduce-scatter adds into."""
    return buffer_name(BufferKind.GSHARD if scattered else BufferKind.GRAD, layer=layer)


def sync_buffers(layer: int, zero: int, scattered: bool) -> tuple[str, str]:
    """(the buffer SYNC[L] reduces, the buffer its result lands in): grad.L in place under
    ZeRO 0/1 (all-reduce), grad.L into gshard.L under ZeRO 2/3 (reduce-scatter), and
    gshard.L alone under scatter accumulation (the B's reduced it: the SYNC waits)."""
    source = grad_accumulator(layer, scattered)
    return source, buffer_name(BufferKind.GSHARD if zero >= 2 else BufferKind.GRAD, layer=layer)


def update_grad(layer: int, zero: int) -> str:
    """The gradient UPD[L] (and the NORM) reads: what SYNC[L] wrote, gshard.L under
    ZeRO 2/3, grad.L under ZeRO 0/1 (whether B scattered or not)."""
    return sync_buffers(layer, zero, scattered=False)[1]
