"""Task IR: the schedule-level actions each rank runs, with a text form that parses back.

schedule_1f1b creates the first per-rank task lists; later passes add lifecycle tasks
(SYNC, UPD, PREF, REC, FREE, and the ZeRO-3 view gathers GATH_F/GATH_R/GATH_B). The
dry run, memory checker, visualizer and runtime all read the same tasks. A task's identity is its text (`1F3`, `0SEND_F2`, `1SYNC[L7]`);
its cost and memory delta are annotations that do not take part in equality or text.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from string import Formatter


class Kind(StrEnum):
    F = "F"               # forward of one micro-batch through the stage
    B = "B"               # backward of one micro-batch (input and weight gradients;
                          # in a zb1 program the input gradients only)
    BL = "BL"             # backward of one layer of one micro-batch (input and weight
                          # gradients): a piece of a B (NOTE [sync issue point])
    W = "W"               # zb1: weight gradients of one layer of one micro-batch
    SEND_F = "SEND_F"     # send the stage's output activation to stage + 1
    RECV_F = "RECV_F"     # receive the stage's input activation from stage - 1
    SEND_B = "SEND_B"     # send the input gradient to stage - 1
    RECV_B = "RECV_B"     # receive the output gradient from stage + 1
    POST_F = "POST_F"     # post (non-blocking) the receive that RECV_F later waits for
    POST_B = "POST_B"     # post (non-blocking) the receive that RECV_B later waits for
    SYNC = "SYNC"         # gradient sync of one layer over the DP group
    UPD = "UPD"           # optimizer update of one layer (its shard under ZeRO)
    PREF = "PREF"         # build the next step's parameter view of one layer
    REC = "REC"           # recompute one layer's activations of one micro-batch
    FREE = "FREE"         # release a named buffer
    NORM = "NORM"         # step-level scalar all-reduce: global grad norm + overflow flag
    TIE = "TIE"           # sum a shared weight's gradient over the layers binding it
    GATH_F = "GATH_F"     # ZeRO-3: all-gather one layer's view for the F of a micro-batch
    GATH_R = "GATH_R"     # ZeRO-3: ... for the REC of (layer, micro-batch)
    GATH_B = "GATH_B"     # ZeRO-3: ... for the B of a micro-batch
    S = "S"               # vocabulary-parallel head: the stage's shard's logits and softmax
                          # statistics of one micro-batch (NOTE [vocabulary-parallel head])
    T = "T"               # ... its loss, its shard's weight gradient and its part of the
                          # final hidden state's gradient
    E = "E"               # vocabulary-parallel embedding: the stage's rows of one micro-
                          # batch's lookup, summed into stage 0's input (NOTE
                          # [vocabulary-parallel embedding])
    G = "G"               # ... the lookup's gradient from stage 0, added to the stage's rows


# The whole grammar: one template per kind. It prints a task; compiled, it parses it back.
TEXT_FORMS: dict[Kind, str] = {
    Kind.F: "{stage}F{micro_batch}",
    Kind.B: "{stage}B{micro_batch}",
    Kind.BL: "{stage}B[L{layer}]{micro_batch}",
    Kind.W: "{stage}W[L{layer}]{micro_batch}",
    Kind.SEND_F: "{stage}SEND_F{micro_batch}",
    Kind.RECV_F: "{stage}RECV_F{micro_batch}",
    Kind.SEND_B: "{stage}SEND_B{micro_batch}",
    Kind.RECV_B: "{stage}RECV_B{micro_batch}",
    Kind.POST_F: "{stage}POST_F{micro_batch}",
    Kind.POST_B: "{stage}POST_B{micro_batch}",
    Kind.SYNC: "{stage}SYNC[L{layer}]",
    Kind.UPD: "{stage}UPD[L{layer}]",
    Kind.PREF: "{stage}PREF[L{layer}]",
    Kind.REC: "{stage}REC[L{layer}]{micro_batch}",
    Kind.FREE: "{stage}FREE[{buffer}]",
    Kind.NORM: "{stage}NORM",
    Kind.TIE: "{stage}TIE[L{layer}]",
    Kind.GATH_F: "{stage}GATH_F[L{layer}]{micro_batch}",
    Kind.GATH_R: "{stage}GATH_R[L{layer}]{micro_batch}",
    Kind.GATH_B: "{stage}GATH_B[L{layer}]{micro_batch}",
    Kind.S: "{stage}S{micro_batch}",
    Kind.T: "{stage}T{micro_batch}",
    Kind.E: "{stage}E{micro_batch}",
    Kind.G: "{stage}G{micro_batch}",
}

# What each placeholder may hold; buffer names exclude spaces and brackets to parse back.
_FIELD_PATTERNS = {"stage": r"\d+", "micro_batch": r"\d+", "layer": r"\d+",
                   "buffer": r"[^\s\[\]]+"}


def compile_form(template: str, fields: dict[str, str]) -> re.Pattern:
    """The regex parsing what `template` prints, each `{name}` a group matching fields[name]."""
    parts = [re.escape(literal) + (f"(?P<{name}>{fields[name]})" if name else "")
             for literal, name, _, _ in Formatter().parse(template)]
    return re.compile("".join(parts))


def describe_forms(templates) -> str:
    """The forms for an error message: `{stage}F{micro_batch}` -> `<stage>F<micro_batch>`."""
    return ", ".join(re.sub(r"\{(\w+)\}", r"<\1>", form) for form in templates)


_PATTERNS = {kind: compile_form(form, _FIELD_PATTERNS) for kind, form in TEXT_FORMS.items()}
_OPERANDS = {kind: frozenset(p.groupindex) - {"stage"} for kind, p in _PATTERNS.items()}
_EXPECTED = describe_forms(TEXT_FORMS.values())

PIPELINE_COMMS = frozenset({Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B})
SENDS = frozenset({Kind.SEND_F, Kind.SEND_B})
RECVS = frozenset({Kind.RECV_F, Kind.RECV_B})
GATHERS = frozenset({Kind.GATH_F, Kind.GATH_R, Kind.GATH_B})  # NOTE [ZeRO-3 lifecycle]
BACKWARDS = frozenset({Kind.B, Kind.BL})  # run (part of) a micro-batch's backward
# Tasks that write a layer's gradient: SYNC[L] stands after the last of them that covers
# L (a B covers its stage's layers, a per-layer piece or a zb1 W its own; verify_schedule).
GRAD_PRODUCERS = BACKWARDS | {Kind.W, Kind.T, Kind.G}
VOCAB_TASKS = frozenset({Kind.S, Kind.T})  # NOTE [vocabulary-parallel head]
EMBED_TASKS = frozenset({Kind.E, Kind.G})  # NOTE [vocabulary-parallel embedding]
# every task that issues a collective over the replica's pipeline group: one order on
# every rank (NOTE [vocabulary-parallel schedule])
PIPE_COLLECTIVES = VOCAB_TASKS | EMBED_TASKS


@dataclass(frozen=True)
class Task:
    stage: int                          # pipeline stage that runs the task
    kind: Kind                          # what the task does
    micro_batch: int | None = None      # F, B, BL, W, SEND_*/RECV_*, REC, S, T, E, G;
                                        # None otherwise
    layer: int | None = None            # global layer index: BL, W, SYNC, UPD, PREF, REC,
                                        # TIE, GATH_*
    buffer: str | None = None           # FREE only: name of the released buffer
    cost: float | None = field(default=None, compare=False)  # est. seconds; None = unknown
    mem_delta: int = field(default=0, compare=False)          # bytes allocated (+) / freed (-)

    def __post_init__(self):
        object.__setattr__(self, "kind", Kind(self.kind))
        _check_operands(self)

    def __str__(self) -> str:
        return TEXT_FORMS[self.kind].format(stage=self.stage, micro_batch=self.micro_batch,
                                            layer=self.layer, buffer=self.buffer)


def _check_operands(task: Task) -> None:
    if not isinstance(task.stage, int) or task.stage < 0:
        raise ValueError(f"{task.kind} task: stage must be an int >= 0, got {task.stage!r}")
    for name in ("micro_batch", "layer", "buffer"):
        value, wanted = getattr(task, name), name in _OPERANDS[task.kind]
        if wanted and value is None:
            raise ValueError(f"{task.kind} task needs a {name} (form {TEXT_FORMS[task.kind]})")
        if not wanted and value is not None:
            raise ValueError(f"{task.kind} task takes no {name} (form {TEXT_FORMS[task.kind]})")
        if wanted and not re.fullmatch(_FIELD_PATTERNS[name], str(value)):
            raise ValueError(f"{task.kind} task: bad {name} {value!r}")


def parse_task(text: str) -> Task:
    """Parse one task's text form; `parse_task(str(t)) == t` for every task t."""
    text = text.strip()
    for kind, pattern in _PATTERNS.items():
        match = pattern.fullmatch(text)
        if match:
            operands = {name: value if name == "buffer" else int(value)
                        for name, value in match.groupdict().items()}
            return Task(kind=kind, **operands)
    raise ValueError(f"cannot parse task {text!r}; expected one of: {_EXPECTED} "
                     f"(e.g. 1F3, 1B[L5]3, 0SEND_F2, 1SYNC[L7], 1REC[L5]3, 1FREE[act.L5.mb3])")


def backward_of(task: Task) -> Task:
    """The whole B a backward task belongs to: itself for a B, its B for a piece BL."""
    return Task(task.stage, Kind.B, micro_batch=task.micro_batch)


def parse_tasks(text: str) -> tuple[Task, ...]:
    """Parse whitespace-separated tasks: `parse_tasks("1F0 1F1 1B0")`."""
    return tuple(parse_task(word) for word in text.split())


def format_tasks(tasks) -> str:
    return " ".join(str(task) for task in tasks)


# A SEND/RECV's counterpart: the matching kind, on the neighbour stage this far away.
_PEER = {Kind.SEND_F: (Kind.RECV_F, +1), Kind.RECV_F: (Kind.SEND_F, -1),
         Kind.SEND_B: (Kind.RECV_B, -1), Kind.RECV_B: (Kind.SEND_B, +1)}


def counterpart(task: Task) -> Task | None:
    """The task that completes a pipeline SEND/RECV (`0SEND_F2` <-> `1RECV_F2`).

    None for non-communication tasks and for a peer stage below 0.
    """
    if task.kind not in _PEER:
        return None
    kind, step = _PEER[task.kind]
    peer_stage = task.stage + step
    return Task(peer_stage, kind, micro_batch=task.micro_batch) if peer_stage >= 0 else None


# Per-rank programs: rank -> tasks in program order. Without DP, rank == stage.
Schedule = dict[int, tuple[Task, ...]]

_RANK_LINE = re.compile(r"rank\s+(\d+)\s*:(.*)")


def format_schedule(schedule: Schedule) -> str:
    """One line per rank, ranks ascending: `rank 0: 0F0 0SEND_F0 ...`."""
    return "\n".join(f"rank {rank}: {format_tasks(tasks)}".rstrip()
                     for rank, tasks in sorted(schedule.items()))


def parse_schedule(text: str) -> Schedule:
    """Inverse of format_schedule; blank lines and `#` comments are ignored."""
    schedule: Schedule = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = _RANK_LINE.fullmatch(line)
        if not match or int(match[1]) in schedule:
            problem = "repeats a rank" if match else "expected 'rank <r>: <task> <task> ...'"
            raise ValueError(f"schedule line {number} {problem}: {line!r}")
        schedule[int(match[1])] = parse_tasks(match[2])
    return schedule
