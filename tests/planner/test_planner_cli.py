"""`ratrain plan` (text, JSON, --min-clusters) and `ratrain compile --plan`."""
import json

import pytest

from ratrain.cli import main

PLAN = ["plan", "tiny", "--clusters", "4", "--global-batch", "8", "--seq-len", "32",
        "--budget", "30MB"]
ROW_KEYS = {"pp", "dp", "zero", "micro_batch_size", "micro_batches", "recompute", "schedule",
            "zero3_prefetch", "update_rule", "grad_accum",
            "feasible", "reason", "peak_bytes", "step_time_s", "tokens_per_s",
            "estimated_step_s", "placement", "bound", "pipeline_schedule", "vocab_parallel"}


def run_json(argv, capsys) -> dict:
    capsys.readouterr()
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def record():
    import io
    from contextlib import redirect_stdout
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(PLAN + ["--json", "--top", "4"]) == 0
    return json.loads(out.getvalue())


def test_json_rows_carry_exactly_the_documented_fields(record):
    assert (record["model"], record["clusters"], record["global_batch"], record["seq_len"],
            record["hw"], record["budget"]) == ("tiny", 4, 8, 32, "cpu", 30 * 10**6)
    rows = record["rows"]
    assert all(set(r) == ROW_KEYS for r in rows)
    feasible = [r for r in rows if r["feasible"]]
    assert len(feasible) == 4 and rows[:4] == feasible  # --top 4, best first
    assert rows[0]["reason"] is None and rows[0]["step_time_s"] > 0
    assert rows[0]["tokens_per_s"] == pytest.approx(8 * 32 / rows[0]["step_time_s"])
    for row in rows:
        assert row["pp"] * row["dp"] == 4
        assert row["dp"] * row["micro_batches"] * row["micro_batch_size"] == 8
        assert isinstance(row["peak_bytes"], int) and row["peak_bytes"] > 0
        assert (row["step_time_s"] is None) == (row["reason"] is not None)
        # a zb1 or vocabulary-parallel twin (NOTE [zb1 twins]) is simulated, never estimated
        assert (row["estimated_step_s"] is not None) == \
            (row["feasible"] and row["pipeline_schedule"] == "1f1b"
             and row["vocab_parallel"] == "none")
    infeasible = [r for r in rows if not r["feasible"]]
    assert infeasible and all(r["reason"] for r in infeasible)


def test_text_table_best_row_and_reasons(record, capsys):
    assert main(PLAN) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[0]  # the cpu profile's nodes, where 4 ranks need several
    assert head.startswith("plan tiny on 4 cpu ranks") and \
        head.endswith(": global batch 8 x 32 tokens, budget 30 MB (28.61 MiB) per rank")
    best = record["rows"][0]
    assert f"\n  1 {best['pp']:>4} {best['dp']:>5} {best['placement']:<9} {best['zero']:>4} " \
        in out
    batches = "micro-batch" if best["micro_batches"] == 1 else "micro-batches"
    grads = " (gradients reduce-scattered each micro-batch)" if best["grad_accum"] else ""
    name = (f"pp {best['pp']} x dp {best['dp']}, zero {best['zero']}{grads}, "
            f"{best['micro_batches']} {batches} of {best['micro_batch_size']}")
    assert f"\nbest: {name}, recompute auto, ratrain schedule: peak" in out
    assert "\ndo not fit (" in out and "\n  pp 1 x dp 4, zero 2, 2 micro-batches of 1" in out


def test_rows_say_whether_their_step_is_simulated_or_estimated(record, capsys):
    """The step column holds the simulated step, else the estimate, and `timed` says
    which; a simulated row shows its estimate beside it."""
    assert main(PLAN + ["--top", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#"))
    assert lines[header].split()[-4:] == ["s", "timed", "tokens/s", "bound"]
    shown = [r for r in record["rows"] if r["feasible"] and r["recompute"] == "auto"]
    for line, row in zip(lines[header + 1:header + 5], shown):
        fields = line.split()
        assert fields[3] == row["placement"] and fields[15] == row["bound"]
        if row["step_time_s"] is not None:
            assert fields[12:14] == [f"{row['step_time_s']:.4g}", "simulated"]
            ratio = row["estimated_step_s"] / row["step_time_s"] - 1
            assert line.endswith(f"estimate {row['estimated_step_s']:.4g} s ({ratio:+.1%})")
        else:
            assert fields[12:14] == [f"{row['estimated_step_s']:.4g}", "estimated"]
            assert row["reason"].removeprefix("not simulated: ") in line
    assert "estimated" in [line.split()[13] for line in lines[header + 1:header + 5]]


def test_link_options_replace_the_profiles_link(record, capsys):
    """plan --link-bandwidth/--link-latency as simulate takes them: a link 1000x slower
    makes every estimate and the best simulated step slower."""
    slow = run_json(PLAN + ["--top", "4", "--link-bandwidth", "10MB/s", "--link-latency",
                            "1ms"], capsys)
    fast = {(r["pp"], r["dp"], r["zero"], r["micro_batch_size"], r["grad_accum"]): r
            for r in record["rows"] if r["feasible"]}
    assert slow["rows"][0]["step_time_s"] > 2 * record["rows"][0]["step_time_s"]
    for row in slow["rows"]:
        key = (row["pp"], row["dp"], row["zero"], row["micro_batch_size"], row["grad_accum"])
        if row["feasible"] and key in fast and row["dp"] > 1:
            assert row["estimated_step_s"] > fast[key]["estimated_step_s"]


def test_min_clusters_reports_the_smallest_count(capsys):
    record = run_json(["plan", "tiny", "--min-clusters", "--global-batch", "8",
                       "--seq-len", "32", "--budget", "18MB"], capsys)
    assert record["smallest_clusters"] == record["clusters"] == 6
    best = record["rows"][0]
    assert best["pp"] * best["dp"] == 6 and best["feasible"]
    checked = min(best["micro_batches"], best["pp"])
    assert best["reason"].startswith(f"not simulated: memory checked with {checked} ")


def test_compile_plan_uses_the_best_row(record, tmp_path, capsys):
    out = tmp_path / "prog"
    assert main(["compile", "tiny", "--plan", "--clusters", "4", "--global-batch", "8",
                 "--seq-len", "32", "--budget", "30MB", "-o", str(out)]) == 0
    best = record["rows"][0]
    assert capsys.readouterr().out.startswith(
        f"planned for 4 ranks: pp {best['pp']} x dp {best['dp']}, zero {best['zero']}")
    options = json.loads((out / "program.json").read_text())["options"]
    for key in ("pp", "dp", "zero", "micro_batch_size", "micro_batches", "recompute",
                "schedule"):
        assert options[key] == best[key], key
    assert options["grad_accum"] == (best["grad_accum"] or "auto")
    assert (options["seq_len"], options["budget"]) == (32, 30 * 10**6)


@pytest.mark.parametrize("argv, message", [
    (["plan", "tiny", "--global-batch", "8"], "give --clusters N (or --nodes K), or --min-clusters"),
    (["plan", "tiny", "--min-clusters", "--clusters", "2", "--global-batch", "8",
      "--seq-len", "32", "--budget", "5MB"], "tiny fits on no cluster count up to 2"),
    (["compile", "tiny", "--clusters", "4", "-o", "{tmp}/a"], "--clusters steers only the planner: add --plan"),
    (["compile", "tiny", "--plan", "--pp", "2", "--clusters", "4", "--global-batch", "8",
      "-o", "{tmp}/b"], "--plan chooses the configuration without --pp"),
    (["compile", "tiny", "--plan", "--grad-accum", "scatter", "--clusters", "4",
      "--global-batch", "8", "-o", "{tmp}/d"],
     "--plan chooses the configuration without --grad-accum"),
    (["compile", "tiny", "--plan", "--clusters", "1", "--global-batch", "8",
      "--seq-len", "32", "--budget", "5MB", "-o", "{tmp}/c"],
     "no configuration of tiny on 1 rank(s) fits --budget 4.77 MiB"),
    (PLAN + ["--schedule", "keep-all", "--min-clusters"],
     "--min-clusters searches every candidate: give --schedule ratrain, baseline or all")])
def test_errors_are_one_line(argv, message, tmp_path, capsys):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_nothing_fits_is_said(capsys):
    assert main(["plan", "tiny", "--clusters", "1", "--global-batch", "8", "--seq-len", "32",
                 "--budget", "5MB"]) == 1   # NOTHING_FITS: scripts can tell
    out = capsys.readouterr().out
    assert "16 candidates" in out and ": 0 fit, 16 do not\n" in out
    assert "no candidate compiled within the budget" in out


STRATEGY_KEYS = {"strategy", "paper", "best", "note", "speedup"}


def test_schedule_all_lists_every_strategys_best(capsys):
    record = run_json(PLAN + ["--schedule", "all"], capsys)
    names = [s["strategy"] for s in record["strategies"]]
    assert names == ["ratrain", "tuned", "backward-checkpointing", "keep-all", "zero3-heavy"]
    assert all(set(s) == STRATEGY_KEYS for s in record["strategies"])
    ours = record["strategies"][0]["best"]
    for s in record["strategies"]:
        if s["best"] is not None:
            assert set(s["best"]) == ROW_KEYS and s["paper"]
            assert s["speedup"] == pytest.approx(ours["tokens_per_s"] / s["best"]["tokens_per_s"])
    # the rows are both schedules', the best of them first
    assert {r["schedule"] for r in record["rows"]} == {"ratrain", "baseline"}
    assert record["rows"][0]["step_time_s"] == min(
        s["best"]["step_time_s"] for s in record["strategies"][:2])
    main(PLAN + ["--schedule", "all"])
    out = capsys.readouterr().out
    table = out[out.index("\nstrategies, each at its best configuration"):]
    bc = next(s for s in record["strategies"] if s["strategy"] == "backward-checkpointing")
    assert f"\n  backward-checkpointing pp {bc['best']['pp']} x dp {bc['best']['dp']}, " in table
    assert f"{bc['speedup']:.3f}x\n" in table


def test_one_strategy_plans_only_its_candidates(capsys):
    record = run_json(PLAN + ["--schedule", "backward-checkpointing"], capsys)
    assert record["strategy"] == "backward-checkpointing"
    assert {(r["schedule"], r["recompute"]) for r in record["rows"]} == {("baseline", "full")}
    assert record["rows"][0]["step_time_s"] > 0


def test_compile_plan_takes_the_update_rule_of_the_best_row(tmp_path, after_norm_only_budget):
    """See NOTE [update rule fallback]: where only after-norm fits, the planned row says so and
    compile --plan compiles it that way (with commit it would not fit the budget)."""
    out = tmp_path / "prog"
    assert main(["compile", "tiny", "--plan", "--clusters", "1", "--global-batch", "8",
                 "--seq-len", "32", "--precision", "fp16", "--budget",
                 str(after_norm_only_budget), "-o", str(out)]) == 0
    options = json.loads((out / "program.json").read_text())["options"]
    assert options["update_rule"] == "after-norm"
