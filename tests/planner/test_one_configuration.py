"""One description of a configuration (docs/DESIGN.md section 10): CompileOptions' fields
are the compiler's FLAGS and compile's flags, a Candidate's fields are CompileOptions
fields passed by name, a Row holds its Candidate and reads back from its JSON record,
and the defaults the commands share are set once."""
from dataclasses import fields, replace

import pytest

from ratrain.cli import build_parser
from ratrain.cli.options import dest, flag_of
from ratrain.compiler import FLAGS
from ratrain.planner import Candidate, Search
from ratrain.planner.search import Row
from ratrain.program_format.options import (DEFAULT_SEQ_LEN, MAX_DEFAULT_MICRO_BATCHES,
                                            NOT_FLAGS, CompileOptions, default_micro_batches)

OPTION_FIELDS = [f.name for f in fields(CompileOptions)]


def test_flags_are_the_option_fields_a_flag_sets():
    assert FLAGS == tuple(f for f in OPTION_FIELDS if f not in NOT_FLAGS)
    assert "pp" in FLAGS and "hw" not in FLAGS and "stage_speeds" not in FLAGS


def test_compile_takes_a_flag_per_field():
    sub = next(a for a in build_parser()._actions if a.choices and "compile" in a.choices)
    taken = {dest(flag) for action in sub.choices["compile"]._actions
             for flag in action.option_strings}
    assert set(FLAGS) <= taken
    assert dest(flag_of("zero3_prefetch")) == "zero3_prefetch"


SEARCH = Search(config={}, name="tiny", global_batch=8, seq_len=64,
                profile={"name": "cpu"}, budget=10**9, precision="fp16")


def test_a_candidate_builds_its_options_field_by_field():
    c = Candidate(2, 2, 2, 1, 4, "selective", "baseline", zero3_prefetch=None,
                  update_rule="after-norm", grad_accum="scatter", placement="dp")
    assert {f.name for f in fields(Candidate)} <= set(OPTION_FIELDS)
    o = c.options(SEARCH)
    assert all(getattr(o, f.name) == getattr(c, f.name) for f in fields(c)
               if getattr(c, f.name) is not None)
    assert o.zero3_prefetch == CompileOptions().zero3_prefetch  # None: the default
    assert (o.seq_len, o.budget, o.hw, o.precision) == (64, 10**9, "cpu", "fp16")
    # a zb1 twin keeps its gradients local (NOTE [zb1 twins])
    twin = replace(c, pipeline_schedule="zb1", grad_accum=None)
    assert twin.options(SEARCH).grad_accum == "local"


def test_a_row_holds_its_candidate_and_reads_back_from_its_record():
    c = Candidate(1, 2, 2, 4, 1, "auto", "ratrain", placement="dp")
    row = Row(c, feasible=True, reason=None, peak_bytes=1 << 20, step_time_s=1.5,
              tokens_per_s=None, estimated_step_s=1.4, bound="compute")
    assert row.candidate == c and (row.pp, row.dp, row.placement) == (1, 2, "dp")
    record = row.to_json()
    assert list(record)[:len(fields(Candidate))] == [f.name for f in fields(Candidate)]
    assert Row(**record) == row
    assert replace(row, bound=None).candidate == c
    with pytest.raises(TypeError, match="peak_bytes"):
        Row(c, feasible=True, reason=None, step_time_s=None, tokens_per_s=None,
            estimated_step_s=None)
    with pytest.raises(AttributeError):
        row.seq_len  # noqa: B018  (not a candidate field: the search's)


def test_defaults_set_once():
    assert CompileOptions().seq_len == DEFAULT_SEQ_LEN
    assert default_micro_batches() == MAX_DEFAULT_MICRO_BATCHES
    assert [default_micro_batches(n) for n in (1, 2, 3, 6, 8, 7)] == [1, 2, 3, 3, 4, 7]
