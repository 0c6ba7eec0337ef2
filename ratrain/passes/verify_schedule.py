"""The schedule verifier: invariants of per-stage task lists, checked after every pass.

It checks only what the tasks present so far promise (a pass that has not run yet adds
no obligations): pipeline messages pair up and do not deadlock; each (stage, mb) has one
F and one B (or the B's per-layer pieces, in order); under zb1 one W per (layer, mb) after
its B, in micro-batch order, within the in-flight bound; each layer is synced once, after
the last task producing its gradient (GRAD_PRODUCERS; zb1: right after its last W);
every UPD follows its SYNC; every PREF follows its UPD; a NORM precedes every UPD, or
follows every UPD and PREF under the commit rule; every REC precedes its B (and,
in ratrain mode, the RECV_B it overlaps); every RECV has an earlier POST once posted.
"""
from __future__ import annotations

from collections import Counter
from functools import lru_cache

from ratrain.ir.tasks import (BACKWARDS, EMBED_TASKS, GRAD_PRODUCERS, PIPE_COLLECTIVES,
                              PIPELINE_COMMS, VOCAB_TASKS, Kind)
from ratrain.passes.dryrun import dry_run
from ratrain.ir.vocab import shard_layers, stage_embed_layer, stage_vocab_layer, state_layers
from ratrain.passes.insert_grad_sync import (last_backward_index, last_shard_index,
                                             last_weight_indices)
from ratrain.passes.insert_tied_sum import produced_layers, tied_layers_on
from ratrain.passes.insert_update import commits_updates
from ratrain.passes.partition_stages import in_flight_micro_batches, pipeline_depth


class ScheduleInvariantError(ValueError):
    """A task list breaks a schedule invariant; the message names stage and task."""


def _fail(stage: int, message: str):
    raise ScheduleInvariantError(f"stage {stage}: {message}")


class _Index:
    """First position of each (kind, micro-batch) and (kind, layer) in a task list."""

    def __init__(self, tasks):
        self.first: dict = {}
        for i, t in enumerate(tasks):
            self.first.setdefault((t.kind, "mb", t.micro_batch), i)
            self.first.setdefault((t.kind, "layer", t.layer), i)

    def __call__(self, kind, micro_batch=None, layer=None) -> int | None:
        key = (kind, "mb", micro_batch) if layer is None else (kind, "layer", layer)
        return self.first.get(key)


def _check_forward_backward(program, stage: int, tasks) -> None:
    counts = Counter((t.kind, t.micro_batch) for t in tasks if t.kind in (Kind.F, Kind.B))
    for m, layers in _pieces(tasks).items():
        expected = list(reversed(program.stages[stage]))
        if layers != expected or counts[(Kind.B, m)]:
            _fail(stage, f"micro-batch {m}'s backward pieces cover layers {layers}"
                         f"{' besides its B' if counts[(Kind.B, m)] else ''}, "
                         f"not {expected} once each in that order")
        counts[(Kind.B, m)] = 1
    for m in range(program.micro_batches):
        for kind in (Kind.F, Kind.B):
            if counts[(kind, m)] != 1:
                _fail(stage, f"{counts[(kind, m)]} {kind} tasks for micro-batch {m}")
    order = [t.micro_batch for t in tasks if t.kind in BACKWARDS]
    if order != sorted(order):
        _fail(stage, f"backwards run out of micro-batch order {order}: gradient buffers "
                     "are created by micro-batch 0's")


def _pieces(tasks) -> dict:
    """micro-batch -> the layers of its per-layer backward pieces (Kind.BL), in order."""
    out: dict = {}
    for t in tasks:
        if t.kind == Kind.BL:
            out.setdefault(t.micro_batch, []).append(t.layer)
    return out


def _check_ties(program, stage: int, tasks) -> None:
    """See NOTE [tied weights]: one TIE on a stage holding a tied layer, before their SYNCs."""
    tied = tied_layers_on(program, stage)
    ties = [i for i, t in enumerate(tasks) if t.kind == Kind.TIE]
    # insert_tied_sum runs before insert_prefetch: a PREF means it has run
    expected = 1 if tied and (ties or any(t.kind == Kind.PREF for t in tasks)) else 0
    if len(ties) != expected:
        _fail(stage, f"{len(ties)} TIE tasks; tied layers here: {list(tied) or 'none'}")
    if not ties:
        return
    for i, t in enumerate(tasks):
        if t.kind == Kind.SYNC and t.layer in tied and i < ties[0]:
            _fail(stage, f"{t} runs before {tasks[ties[0]]} sums the tied gradient")
        if t.kind in GRAD_PRODUCERS and set(produced_layers(program, t)) & set(tied) and \
                i > ties[0]:
            _fail(stage, f"{tasks[ties[0]]} sums the tied gradient before {t} adds to it")


def _check_syncs(program, stage: int, tasks) -> None:
    if not any(t.kind == Kind.SYNC for t in tasks):
        return
    per_layer = Counter(t.layer for t in tasks if t.kind == Kind.SYNC)
    for layer in state_layers(program, stage):
        if per_layer[layer] != 1:
            _fail(stage, f"layer {layer} is synced {per_layer[layer]} times, not once")
    tied = tied_layers_on(program, stage)
    if any(t.kind == Kind.W for t in tasks):  # NOTE [zb1 schedule]
        return _check_syncs_after_weights(program, stage, [
            t for t in tasks
            if t.kind != Kind.FREE and not (t.kind == Kind.SYNC and t.layer in tied)])
    last = {}  # layer -> position of the last task producing its gradient
    for i, t in enumerate(tasks):
        if t.kind in GRAD_PRODUCERS:
            for layer in produced_layers(program, t):
                last[layer] = i
    # tied layers sync after their TIE (_check_ties); a scattered layer's SYNC only waits
    exempt = set(tied) | set(program.scatter_grads)
    for i, t in enumerate(tasks):
        if t.kind != Kind.SYNC or t.layer not in last:
            continue
        if i < last[t.layer]:
            _fail(stage, f"{t} starts before {tasks[last[t.layer]]}, the last task "
                         f"producing layer {t.layer}'s gradient")
        between = [u for u in tasks[last[t.layer] + 1:i] if u.kind not in _NOT_DELAYING]
        if program.options.schedule == "ratrain" and t.layer not in exempt and between:
            _fail(stage, f"{t} does not start right after {tasks[last[t.layer]]}, the last "
                         f"task producing its gradient: {between[0]} delays it")


# What may stand between a layer's last gradient producer and its SYNC in ratrain mode
# (NOTE [sync issue point]): the backward of other layers, the message the previous stage
# waits for (stage 0's G under a vocabulary-parallel embedding: the other stages' G
# waits for its broadcast), other SYNCs and FREEs; never other work.
_NOT_DELAYING = BACKWARDS | {Kind.W, Kind.SYNC, Kind.SEND_B, Kind.G, Kind.FREE}


def _check_syncs_after_weights(program, stage: int, tasks) -> None:
    """See NOTE [zb1 schedule]: SYNC[L] after the last task producing L's gradient (the last
    B, the last W[L]); in ratrain mode right after its layer's last W."""
    last_b, last_w = last_backward_index(tasks), last_weight_indices(tasks)
    shards = set(shard_layers(program, stage))
    for layer, kind in ((stage_vocab_layer(program, stage), Kind.T),
                        (stage_embed_layer(program, stage), Kind.G)):
        if layer is not None:  # its gradient is complete after the last T (G)
            last_w[layer] = last_shard_index(tasks, kind)
    for i, t in enumerate(tasks):
        if t.kind != Kind.SYNC:
            continue
        producer = last_w[t.layer] if t.layer in shards else \
            max(last_b, last_w.get(t.layer, -1))
        if i < producer:
            _fail(stage, f"{t} starts before {tasks[producer]}, the last task producing "
                         f"layer {t.layer}'s gradient")
        if program.options.schedule == "ratrain" and i != last_w.get(t.layer, -1) + 1:
            _fail(stage, f"{t} does not start right after its layer's last W")


def _check_weights(program, stage: int, tasks) -> None:
    """zb1 (NOTE [zb1 schedule]): one W per (layer, micro-batch) of the stage, after its
    B, each layer's in micro-batch order; _check_in_flight's bounds."""
    if not any(t.kind == Kind.W for t in tasks):
        return
    b_at = {t.micro_batch: i for i, t in enumerate(tasks) if t.kind == Kind.B}
    seen: dict = {}
    for i, t in enumerate(tasks):
        if t.kind != Kind.W:
            continue
        if t.layer not in program.stages[stage] or b_at.get(t.micro_batch, len(tasks)) > i:
            _fail(stage, f"{t} does not follow its backward {stage}B{t.micro_batch} "
                         "on the stage of its layer")
        if seen.setdefault(t.layer, []) and seen[t.layer][-1] >= t.micro_batch:
            _fail(stage, f"{t} runs out of micro-batch order: {t.layer}'s gradient sums "
                         "its micro-batches in order")
        seen[t.layer].append(t.micro_batch)
    for layer in program.stages[stage]:
        if seen.get(layer) != list(range(program.micro_batches)):
            _fail(stage, f"layer {layer} has W's of micro-batches {seen.get(layer)}, not one "
                         f"of each of {program.micro_batches}")
    _check_in_flight(program, stage, tasks)
    if stage != pipeline_depth(program) - 1:
        _check_weights_before_backward(stage, tasks)


def _check_weights_before_backward(stage: int, tasks) -> None:
    """See NOTE [zb1 schedule]: on every stage but the last, B(m) follows the W's of the
    micro-batches before m (one micro-batch's W operands at a time)."""
    last_w = {t.micro_batch: i for i, t in enumerate(tasks) if t.kind == Kind.W}
    for i, t in enumerate(tasks):
        if t.kind != Kind.B:
            continue
        late = [m for m, j in last_w.items() if m < t.micro_batch and j > i]
        if late:
            _fail(stage, f"{t} runs before the W's of micro-batch {min(late)}: a B that is "
                         "not the last stage's follows the W's of earlier micro-batches")


def _check_in_flight(program, stage: int, tasks) -> None:
    """See NOTE [zb1 schedule]: at most 1F1B's min(P - s, M) micro-batches between their F and
    their B, and one more between their F and their last W."""
    bound = in_flight_micro_batches(program, stage)
    owed = {m: len(program.stages[stage]) for m in range(program.micro_batches)}
    before_b, before_w = set(), set()
    for t in tasks:
        if t.kind == Kind.F:
            before_b.add(t.micro_batch)
            before_w.add(t.micro_batch)
            if len(before_b) > bound:
                _fail(stage, f"{t} makes {len(before_b)} micro-batches in flight (F to B), "
                             f"more than {bound}")
            if len(before_w) > bound + 1:
                _fail(stage, f"{t} makes {len(before_w)} micro-batches in flight (F to last "
                             f"W), more than {bound + 1}")
        elif t.kind == Kind.B:
            before_b.discard(t.micro_batch)
        elif t.kind == Kind.W:
            owed[t.micro_batch] -= 1
            if not owed[t.micro_batch]:
                before_w.discard(t.micro_batch)


def _check_follows(stage: int, tasks, later: Kind, earlier: Kind) -> None:
    position = _Index(tasks)
    for i, t in enumerate(tasks):
        if t.kind == later:
            j = position(earlier, layer=t.layer)
            if j is None or j > i:
                _fail(stage, f"{t} is not preceded by its {earlier}")


def _check_norm(program, stage: int, tasks) -> None:
    """At most one NORM; before every UPD (after-norm), or after every UPD and PREF when
    the updates commit at the step end (NOTE [commit rule])."""
    norms = [i for i, t in enumerate(tasks) if t.kind == Kind.NORM]
    if len(norms) > 1:
        _fail(stage, f"{len(norms)} NORM tasks, not one")
    if not norms:
        return
    commit = commits_updates(program.options)
    for i, t in enumerate(tasks):
        if commit and t.kind in (Kind.UPD, Kind.PREF) and i > norms[0]:
            _fail(stage, f"{t} runs after {tasks[norms[0]]}: under the commit rule the NORM "
                         "ends the step's updates")
        if not commit and t.kind == Kind.UPD and i < norms[0]:
            _fail(stage, f"{t} runs before {tasks[norms[0]]}: under after-norm every update "
                         "waits for the global norm")


def _check_recovery(program, stage: int, tasks) -> None:
    forward_side = program.options.schedule == "ratrain"
    position = _Index(tasks)
    for i, t in enumerate(tasks):
        if t.kind != Kind.REC:
            continue
        b = min((j for j in (position(k, micro_batch=t.micro_batch) for k in BACKWARDS)
                 if j is not None), default=None)
        if b is None or b < i:
            _fail(stage, f"{t} does not precede its backward")
        recv = position(Kind.RECV_B, micro_batch=t.micro_batch)
        if forward_side and recv is not None and recv < i:
            _fail(stage, f"{t} comes after {tasks[recv]}: in ratrain mode recovery runs "
                         "on the forward side, before the wait for the gradient")


def _check_posts(stage: int, tasks) -> None:
    posts = {Kind.RECV_F: Kind.POST_F, Kind.RECV_B: Kind.POST_B}
    if not any(t.kind in (Kind.POST_F, Kind.POST_B) for t in tasks):
        return
    position = _Index(tasks)
    for i, t in enumerate(tasks):
        if t.kind in posts:
            j = position(posts[t.kind], micro_batch=t.micro_batch)
            if j is None or j > i:
                _fail(stage, f"{t} has no earlier {posts[t.kind]}")


def _check_shards(program, stage: int, tasks) -> None:
    """See NOTE [vocabulary-parallel schedule]: one S and one T per micro-batch, in the order
    S0 T0 S1 T1 ... (the pipeline group's collectives in one order on every rank); on
    the last stage S(m) after F(m) and T(m) before its B(m)."""
    if stage_vocab_layer(program, stage) is None:
        if any(t.kind in VOCAB_TASKS for t in tasks):
            _fail(stage, "S or T tasks in a program whose head is not vocabulary-parallel")
        return
    order = [(t.micro_batch, t.kind == Kind.T) for t in tasks if t.kind in VOCAB_TASKS]
    expected = [(m, is_t) for m in range(program.micro_batches) for is_t in (False, True)]
    if order != expected:
        _fail(stage, f"S and T tasks run as {order}, not S0 T0 S1 T1 ... once each")
    if stage != len(program.stages) - 1:
        return
    position = _Index(tasks)
    for m in range(program.micro_batches):
        f, s, t = (position(k, micro_batch=m) for k in (Kind.F, Kind.S, Kind.T))
        b = min(j for j in (position(k, micro_batch=m) for k in BACKWARDS) if j is not None)
        if not f < s < t < b:
            _fail(stage, f"micro-batch {m}: the last stage must run F, S, T, then its "
                         f"backward (positions {f}, {s}, {t}, {b})")


def _check_embedding(program, stage: int, tasks) -> None:
    """See NOTE [vocabulary-parallel schedule]: one E and one G per micro-batch, each in
    micro-batch order (G's add the shard's gradient in it), E(m) before G(m); on stage 0
    E(m) before F(m), which reads the lookups' sum, and G(m) after the backward of m,
    which makes the gradient it broadcasts."""
    if stage_embed_layer(program, stage) is None:
        if any(t.kind in EMBED_TASKS for t in tasks):
            _fail(stage, "E or G tasks in a program whose embedding is not split")
        return
    M, position = program.micro_batches, _Index(tasks)
    for kind in EMBED_TASKS:
        order = [t.micro_batch for t in tasks if t.kind == kind]
        if order != list(range(M)):
            _fail(stage, f"{kind} tasks run for micro-batches {order}, not 0..{M - 1} once "
                         "each in order")
    for m in range(M):
        e, g = position(Kind.E, micro_batch=m), position(Kind.G, micro_batch=m)
        if e > g:
            _fail(stage, f"micro-batch {m}: G runs before its E")
        if stage != 0:
            continue
        f = position(Kind.F, micro_batch=m)
        b = max(i for i, t in enumerate(tasks) if t.kind in BACKWARDS and t.micro_batch == m)
        if not e < f < b < g:
            _fail(stage, f"micro-batch {m}: stage 0 must run E, F, its backward, then G "
                         f"(positions {e}, {f}, {b}, {g})")


def _check_collective_order(schedule) -> None:
    """See NOTE [vocabulary-parallel schedule]: the pipeline group's collectives (S, T, E,
    G) are issued in one order on every stage, as MPI requires of a communicator."""
    orders = {stage: [(t.kind, t.micro_batch) for t in tasks if t.kind in PIPE_COLLECTIVES]
              for stage, tasks in schedule.items()}
    first = min(orders)
    for stage, order in orders.items():
        if order != orders[first]:
            at = next((i for i, (a, b) in enumerate(zip(order, orders[first])) if a != b),
                      min(len(order), len(orders[first])))
            _fail(stage, f"the pipeline group's collectives run in another order than on "
                         f"stage {first}: {[f'{k}{m}' for k, m in order[at:at + 3]]} at "
                         f"{at}, not {[f'{k}{m}' for k, m in orders[first][at:at + 3]]}")


def verify_schedule(program) -> None:
    """Raise ScheduleInvariantError (or a dry-run error) if an invariant is broken."""
    if not program.tasks:
        return
    for stage, tasks in program.tasks.items():
        _check_forward_backward(program, stage, tasks)
        _check_weights(program, stage, tasks)
        _check_syncs(program, stage, tasks)
        _check_ties(program, stage, tasks)
        _check_follows(stage, tasks, Kind.UPD, Kind.SYNC)
        _check_follows(stage, tasks, Kind.PREF, Kind.UPD)
        _check_norm(program, stage, tasks)
        _check_recovery(program, stage, tasks)
        _check_posts(stage, tasks)
        _check_shards(program, stage, tasks)
        _check_embedding(program, stage, tasks)
    _check_collective_order(program.tasks)
    _check_pipeline_comms(program.tasks)


def _check_pipeline_comms(tasks) -> None:
    """Pair every SEND with one RECV and prove deadlock freedom by a dry run. Only the
    order of pipeline messages, TIEs and the shards' S, T, E and G (with the last stage's
    F's and backwards they wait for or feed, and stage 0's) decides either (other tasks
    never wait on another rank),
    so a projection already proven is not run again."""
    first, last = min(tasks), max(tasks)
    shards = any(t.kind in VOCAB_TASKS for t in tasks[last])
    rows = any(t.kind in EMBED_TASKS for t in tasks[first])
    waits = lambda stage, t: t.kind in _LAST_WAITS and \
        ((shards and stage == last) or (rows and stage == first))
    _prove(tuple((stage, tuple(t for t in ts if t.kind in PIPELINE_COMMS or t.kind == Kind.TIE
                               or t.kind in PIPE_COLLECTIVES or waits(stage, t)))
                 for stage, ts in sorted(tasks.items())))


# See NOTE [vocabulary-parallel schedule]: a last stage's F(m) feeds every S(m), and its
# backward of m waits for every T(m); stage 0's F(m) waits for every E(m), and its
# backward of m feeds every G(m): the dry run needs them to see those waits
_LAST_WAITS = frozenset({Kind.F, Kind.B, Kind.BL})


@lru_cache(maxsize=32)  # a compile verifies the same few projections after every pass
def _prove(projection) -> None:
    dry_run(dict(projection))
