"""String in, string out: each lifecycle pass on a small hand-written task list.

The model has four layers on two stages: L0 the embedding and L1 a decoder on stage 0,
L2 a decoder and L3 the head on stage 1; two micro-batches. Each test writes the tasks a
pass receives as text and asserts the text of what it returns.
"""
from functools import lru_cache

import pytest

from ratrain import models
from ratrain.ir.tasks import format_tasks, parse_tasks
from ratrain.models.trace import trace_model
from ratrain.passes.insert_grad_sync import insert_grad_sync
from ratrain.passes.insert_prefetch import insert_prefetch
from ratrain.passes.insert_recovery import insert_recovery
from ratrain.passes.insert_tied_sum import insert_tied_sum
from ratrain.passes.insert_update import insert_update
from ratrain.passes.program import CompileOptions, Program
from ratrain.passes.verify_schedule import verify_schedule
from tiny_model import MINI, tiny_config

CONFIG = tiny_config(MINI, filled=False, num_key_value_heads=None)

# the 1F1B lists lower_comms leaves (schedule_1f1b, then a POST before each receive)
SKELETON = {0: "0F0 0SEND_F0 0POST_B0 0F1 0SEND_F1 0RECV_B0 0POST_B1 0B0 0RECV_B1 0B1",
            1: "1POST_F0 1RECV_F0 1F0 1POST_F1 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"}


@lru_cache(maxsize=None)
def _graph(tied: bool):
    return trace_model(models.fill_defaults({**CONFIG, "tie_word_embeddings": tied}),
                       micro_batch_size=1, seq_len=4)


def program(tasks: dict, tied=False, scatter_grads=(), **options):
    """A Program of the four-layer model over `tasks` (stage -> task text)."""
    o = CompileOptions(pp=2, micro_batches=2, micro_batch_size=1, seq_len=4, **options)
    return Program(_graph(tied), o, stages=((0, 1), (2, 3)),
                   tasks={s: parse_tasks(text) for s, text in tasks.items()},
                   scatter_grads=frozenset(scatter_grads))


def text(program) -> dict:
    return {s: format_tasks(ts) for s, ts in program.tasks.items()}


# ---- insert_recovery ------------------------------------------------------------------

def test_insert_recovery_rebuilds_on_the_forward_side_before_each_gradient_wait():
    out = insert_recovery(program(SKELETON, recompute="full"))
    assert text(out) == {
        0: "0F0 0SEND_F0 0POST_B0 0F1 0SEND_F1 0REC[L1]0 0RECV_B0 0POST_B1 0B0 "
           "0REC[L1]1 0RECV_B1 0B1",
        1: SKELETON[1]}  # the last stage never waits for a gradient: B rebuilds (NOTE
    # [backward-time recovery]); only decoders are recomputed
    assert out.recompute == {(1, 0): "full", (1, 1): "full", (2, 0): "full", (2, 1): "full"}


def test_insert_recovery_places_nothing_in_the_baseline_or_without_recompute():
    assert text(insert_recovery(program(SKELETON, recompute="full", schedule="baseline"))) \
        == SKELETON
    none = insert_recovery(program(SKELETON, recompute="none"))
    assert text(none) == SKELETON and none.recompute == {}


# ---- insert_grad_sync -----------------------------------------------------------------

def test_insert_grad_sync_splits_the_last_backward_and_syncs_after_each_piece():
    """See NOTE [sync issue point]: SYNC[L] right after L's piece of the step's last B; the
    stage's first layer after the SEND_B the previous stage waits for."""
    out = insert_grad_sync(program(SKELETON))
    assert text(out) == {
        0: "0F0 0SEND_F0 0POST_B0 0F1 0SEND_F1 0RECV_B0 0POST_B1 0B0 0RECV_B1 "
           "0B[L1]1 0SYNC[L1] 0B[L0]1 0SYNC[L0]",
        1: "1POST_F0 1RECV_F0 1F0 1POST_F1 1B0 1SEND_B0 1RECV_F1 1F1 "
           "1B[L3]1 1SYNC[L3] 1B[L2]1 1SEND_B1 1SYNC[L2]"}
    verify_schedule(out)


def test_insert_grad_sync_leaves_a_scattered_layer_s_wait_after_the_pieces():
    """A layer reduce-scattered in every B only waits: its SYNC follows the pieces."""
    out = insert_grad_sync(program(SKELETON, scatter_grads={3}, dp=2, zero=2,
                                   grad_accum="scatter"))
    assert text(out)[1] == ("1POST_F0 1RECV_F0 1F0 1POST_F1 1B0 1SEND_B0 1RECV_F1 1F1 "
                            "1B[L3]1 1B[L2]1 1SEND_B1 1SYNC[L3] 1SYNC[L2]")
    verify_schedule(out)


def test_insert_grad_sync_in_the_baseline_ends_each_list_with_the_syncs():
    out = insert_grad_sync(program(SKELETON, schedule="baseline"))
    assert text(out) == {0: SKELETON[0] + " 0SYNC[L1] 0SYNC[L0]",
                         1: SKELETON[1] + " 1SYNC[L3] 1SYNC[L2]"}


# ---- insert_update --------------------------------------------------------------------

SYNCED = {0: "0B0 0B[L1]1 0SYNC[L1] 0B[L0]1 0SYNC[L0]",
          1: "1B0 1SEND_B0 1B[L3]1 1SYNC[L3] 1B[L2]1 1SEND_B1 1SYNC[L2]"}


@pytest.mark.parametrize("options, tails", [
    ({}, ("0UPD[L1] 0UPD[L0]", "1UPD[L3] 1UPD[L2]")),             # in SYNC order
    ({"clip": 1.0}, ("0UPD[L1] 0UPD[L0] 0NORM", "1UPD[L3] 1UPD[L2] 1NORM")),  # commit
    ({"clip": 1.0, "update_rule": "after-norm"},                 # layer order, see
     ("0NORM 0UPD[L0] 0UPD[L1]", "1NORM 1UPD[L2] 1UPD[L3]")),    # NOTE [update order after NORM]
    ({"clip": 1.0, "schedule": "baseline"},
     ("0NORM 0UPD[L1] 0UPD[L0]", "1NORM 1UPD[L3] 1UPD[L2]")),
], ids=["plain", "commit", "after-norm", "baseline"])
def test_insert_update_after_the_last_sync(options, tails):
    out = insert_update(program(SYNCED, **options))
    assert text(out) == {s: f"{SYNCED[s]} {tail}" for s, tail in enumerate(tails)}


# ---- insert_tied_sum ------------------------------------------------------------------

UPDATED = {0: SYNCED[0] + " 0UPD[L1] 0UPD[L0]", 1: SYNCED[1] + " 1UPD[L3] 1UPD[L2]"}


def test_insert_tied_sum_moves_the_tied_sync_and_update_behind_a_tie():
    """See NOTE [tied weights]: L0 and L3 share the embedding; each stage's TIE sums the
    copies after the other layers' updates, then syncs and updates its copy."""
    out = insert_tied_sum(program(UPDATED, tied=True))
    assert text(out) == {
        0: "0B0 0B[L1]1 0SYNC[L1] 0B[L0]1 0UPD[L1] 0TIE[L0] 0SYNC[L0] 0UPD[L0]",
        1: "1B0 1SEND_B0 1B[L3]1 1B[L2]1 1SEND_B1 1SYNC[L2] 1UPD[L2] 1TIE[L3] 1SYNC[L3] "
           "1UPD[L3]"}


def test_insert_tied_sum_puts_the_tie_before_an_after_norm_norm():
    tasks = {0: SYNCED[0] + " 0NORM 0UPD[L0] 0UPD[L1]",
             1: SYNCED[1] + " 1NORM 1UPD[L2] 1UPD[L3]"}
    out = insert_tied_sum(program(tasks, tied=True, clip=1.0, update_rule="after-norm"))
    assert text(out) == {
        0: "0B0 0B[L1]1 0SYNC[L1] 0B[L0]1 0TIE[L0] 0SYNC[L0] 0NORM 0UPD[L0] 0UPD[L1]",
        1: "1B0 1SEND_B0 1B[L3]1 1B[L2]1 1SEND_B1 1SYNC[L2] 1TIE[L3] 1SYNC[L3] 1NORM "
           "1UPD[L2] 1UPD[L3]"}


def test_insert_tied_sum_leaves_untied_models_alone():
    assert text(insert_tied_sum(program(UPDATED))) == UPDATED


# ---- insert_prefetch ------------------------------------------------------------------

def test_insert_prefetch_follows_each_update():
    out = insert_prefetch(program(UPDATED))
    assert text(out) == {0: SYNCED[0] + " 0UPD[L1] 0PREF[L1] 0UPD[L0] 0PREF[L0]",
                         1: SYNCED[1] + " 1UPD[L3] 1PREF[L3] 1UPD[L2] 1PREF[L2]"}


def test_insert_prefetch_gathers_in_layer_order_after_speculative_updates():
    """See NOTE [gather order under the commit rule]: ZeRO 1 under the commit rule."""
    tasks = {s: t + f" {s}NORM" for s, t in UPDATED.items()}
    out = insert_prefetch(program(tasks, dp=2, zero=1, clip=1.0))
    assert text(out) == {0: SYNCED[0] + " 0UPD[L1] 0UPD[L0] 0PREF[L0] 0PREF[L1] 0NORM",
                         1: SYNCED[1] + " 1UPD[L3] 1UPD[L2] 1PREF[L2] 1PREF[L3] 1NORM"}


def test_insert_prefetch_in_the_baseline_builds_the_views_after_all_updates():
    out = insert_prefetch(program(UPDATED, schedule="baseline"))
    assert text(out) == {0: UPDATED[0] + " 0PREF[L1] 0PREF[L0]",
                         1: UPDATED[1] + " 1PREF[L3] 1PREF[L2]"}


def test_insert_prefetch_adds_nothing_under_zero3():
    assert text(insert_prefetch(program(UPDATED, dp=2, zero=3))) == UPDATED
