"""`ratrain compile` and `ratrain inspect DIR`: program directories, --report, errors."""
import hashlib
import json
import re
import subprocess
import sys

import pytest

from ratrain.cli import main
from ratrain.hw import ProfileError, load_profile
from ratrain.ir.tasks import Kind, parse_tasks
from ratrain.passes.buffers import CATEGORIES
from ratrain.passes.pipeline import PIPELINE, _late_passes
from ratrain.units import parse_size

PASS_NAMES = [p.__name__ for p in PIPELINE + _late_passes()]
TINY = ["tiny", "--seq-len", "32"]
PP2_DP2 = ["--pp", "2", "--dp", "2", "--micro-batches", "4"]


def compile_to(out, *options):
    return main(["compile", *TINY, *options, "-o", str(out)])


@pytest.fixture(scope="module")
def program_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("programs") / "pp2dp2"
    assert compile_to(out, *PP2_DP2, "--recompute", "selective") == 0
    return out


def manifest_of(directory):
    return json.loads((directory / "program.json").read_text())


@pytest.mark.parametrize("text, nbytes", [
    ("20GB", 20 * 10**9), ("20GiB", 20 * 2**30), ("512MB", 512 * 10**6),
    ("512MiB", 512 * 2**20), ("1.5G", 1_500_000_000), ("1.5Gi", 3 * 2**29),
    ("4096", 4096), ("64kb", 64_000), ("2TiB", 2 * 2**40), (" 7 b ", 7), ("1e9", 10**9)])
def test_parse_size(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "GB", "20 XB", "-1GB", "0", "1.2.3G"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_manifest_has_every_field(program_dir):
    manifest = manifest_of(program_dir)
    assert manifest["model"]["name"] == "tiny"
    assert manifest["model"]["config"]["num_hidden_layers"] == 4
    options = manifest["options"]
    assert (options["pp"], options["dp"], options["micro_batches"], options["seq_len"]) == (2, 2, 4, 32)
    assert (options["schedule"], options["recompute"], options["precision"]) == ("ratrain", "selective", "fp32")
    assert options["budget"] == load_profile("cpu")["usable_memory"] and options["hw"] == "cpu"
    assert manifest["world_size"] == 4 and manifest["ratrain_version"]
    assert "created" not in manifest and "seconds" not in manifest["passes"][0]
    assert manifest["ranks"] == {"0": {"stage": 0, "replica": 0}, "1": {"stage": 1, "replica": 0},
                                 "2": {"stage": 0, "replica": 1}, "3": {"stage": 1, "replica": 1}}
    layers = [layer for s in manifest["stages"] for layer in s["layers"]]
    assert layers == list(range(6)) and [s["stage"] for s in manifest["stages"]] == [0, 1]
    for stage in manifest["stages"]:
        assert 0 < stage["peak_bytes"] <= stage["arena_bytes"]
        assert sum(stage["peak_breakdown"].values()) == stage["peak_bytes"]


def test_hashes_match_files(program_dir):
    files = manifest_of(program_dir)["files"]
    on_disk = sorted(str(p.relative_to(program_dir)) for p in program_dir.rglob("*")
                     if p.is_file() and "build" not in p.parts and p.name != "program.json")
    assert sorted(files) == on_disk  # everything but the manifest and the build cache
    assert {"runtime.json", "code/stage0.pyx", "code/stage1.tasks.json",
            "code/stage1.legend.txt"} <= set(files)
    assert not [f for f in files if f.endswith(".pkl")]  # NOTE [program format]
    for relative, digest in files.items():
        assert hashlib.sha256((program_dir / relative).read_bytes()).hexdigest() == digest


def test_pass_files_in_pipeline_order(program_dir):
    names = sorted(p.name for p in (program_dir / "passes").iterdir())
    assert names == [f"{i:02d}_{name}.txt" for i, name in enumerate(PASS_NAMES, 1)]
    assert [p["name"] for p in manifest_of(program_dir)["passes"]] == PASS_NAMES
    planned = names.index(f"{PASS_NAMES.index('plan_memory') + 1:02d}_plan_memory.txt")
    text = (program_dir / "passes" / names[planned]).read_text()
    assert text.startswith("# after: plan_memory\n") and "FREE[" in text
    assert "FREE[" not in (program_dir / "passes" / names[planned - 1]).read_text()


def test_recompiles_are_byte_identical(program_dir, tmp_path):
    """Two compiles of the same inputs: every file equal (no times, dates or paths in
    what is written), so `diff -r` and content hashes see only real changes."""
    again = tmp_path / "again"
    assert compile_to(again, *PP2_DP2, "--recompute", "selective") == 0
    files = sorted(p.relative_to(program_dir) for p in program_dir.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    assert [f for f in files if (program_dir / f).read_bytes() != (again / f).read_bytes()] == []
    assert subprocess.run(["diff", "-r", str(program_dir), str(again)]).returncode == 0


def test_rank_files_parse_back(program_dir):
    ranks = [parse_tasks((program_dir / f"rank{r}.txt").read_text()) for r in range(4)]
    assert ranks[0] == ranks[2] and ranks[1] == ranks[3]
    for stage, tasks in enumerate(ranks[:2]):
        assert {t.stage for t in tasks} == {stage}
        assert sorted(t.micro_batch for t in tasks if t.kind == Kind.F) == [0, 1, 2, 3]
        assert any(t.kind == Kind.FREE for t in tasks) and any(t.kind == Kind.SYNC for t in tasks)
    line = (program_dir / "rank1.txt").read_text().splitlines()[0]
    assert line == str(ranks[1][0])


def test_memory_txt_is_the_plan_report(program_dir):
    text = (program_dir / "memory.txt").read_text()
    assert text.startswith("memory plan (budget") and "stage 0: peak" in text and "stage 1: peak" in text


def test_report_via_subprocess(tmp_path):
    out = tmp_path / "prog"
    result = subprocess.run([sys.executable, "-m", "ratrain.cli", "compile", *TINY, *PP2_DP2,
                             "--zero", "1", "-o", str(out), "--report"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = result.stdout
    for number, name in enumerate(PASS_NAMES, 1):
        assert re.search(rf"^\s+{number:02d} {name}\s+\d+\.\d ms$", report, re.M), name
    for stage in (0, 1):
        size = r"(?:[\d.]+ [KMG]iB|\d+ B)"
        row = re.search(rf"^\s+{stage} +({size}) +({size})((?: +{size}){{7}})$", report, re.M)
        assert row, report
    assert all(c in report for c in CATEGORIES)
    assert re.search(r"step [\d.e-]+ s, bubble \d+\.\d%", report)
    assert re.search(r"^\s+stage\s+busy s\s+exposed tail s$", report, re.M)
    assert len(re.findall(r"^\s+[01] +[\d.e-]+ +[\d.e-]+$", report, re.M)) == 2
    assert re.search(r"^  ratrain +peak [\d.]+ MiB", report, re.M)
    assert re.search(r"^  baseline +peak [\d.]+ MiB", report, re.M)
    assert (out / "program.json").is_file()


def test_budget_too_small_is_exit_2_with_breakdown(tmp_path, capsys):
    out = tmp_path / "prog"
    assert compile_to(out, *PP2_DP2, "--budget", "20MB") == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert lines[0].startswith("ratrain: error: ") and "20 MB (19.07 MiB)" in lines[0]
    # one error line; the breakdown below it indented, not a second "ratrain: error:"
    assert len(lines) > 1 and all(line.startswith("  ") for line in lines[1:])
    assert all(c in captured.err for c in ("params", "optimizer", "views", "activations"))
    assert "Traceback" not in captured.err and captured.out == ""
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_inspect_after_and_rank(program_dir, capsys):
    assert main(["inspect", str(program_dir), "--after", "insert_grad_sync", "--rank", "3"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("rank 3: 1POST_F0") and "1SYNC[L5]" in line
    assert "UPD" not in line and "FREE" not in line
    tasks = parse_tasks(line.split(":", 1)[1])
    assert {t.stage for t in tasks} == {1}


def test_inspect_default_is_last_pass_and_numbers_work(program_dir, capsys):
    assert main(["inspect", str(program_dir)]) == 0
    assert capsys.readouterr().out.startswith(f"# after: {PASS_NAMES[-1]}\n")
    assert main(["inspect", str(program_dir), "--after", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# after: schedule_pipeline\n") and "rank 0: 0F0" in out


def test_inspect_bad_pass_and_rank(program_dir, capsys):
    assert main(["inspect", str(program_dir), "--after", "nope"]) == 2
    assert "1 partition_stages" in capsys.readouterr().err
    assert main(["inspect", str(program_dir), "--rank", "4"]) == 2
    assert "ranks 0..3" in capsys.readouterr().err
    assert main(["inspect", str(program_dir), "--after", "1", "--rank", "0"]) == 2
    assert "no task lists yet" in capsys.readouterr().err


def test_inspect_writes_pngs(program_dir, tmp_path, capsys):
    schedule, memory = tmp_path / "schedule.png", tmp_path / "memory.png"
    assert main(["inspect", str(program_dir), "--rank", "0", "--schedule-png", str(schedule),
                 "--memory-png", str(memory)]) == 0
    for png in (schedule, memory):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "(2 stages)" in out and out.startswith("rank 0: ")   # --rank asks for its tasks
    assert main(["inspect", str(program_dir), "--schedule-png", str(schedule)]) == 0
    # pictures alone: only what was written, in seconds, not the lowered program
    bars = sum(t.kind != Kind.FREE for stage in (0, 1)
               for t in parse_tasks((program_dir / f"rank{stage}.txt").read_text()))
    assert capsys.readouterr().out == (f"wrote {schedule} ({bars} task bars, a dry run's "
                                       "times from the cpu profile in seconds; `ratrain "
                                       "simulate DIR --schedule-png` draws the simulated "
                                       "step)\n")


def test_overwrite_protection(tmp_path, capsys):
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    assert compile_to(other) == 2
    assert "not a program directory" in capsys.readouterr().err
    assert [p.name for p in other.iterdir()] == ["keep.txt"]
    out = tmp_path / "prog"
    assert compile_to(out) == 0
    assert compile_to(out, "--schedule", "baseline") == 2
    assert "--force" in capsys.readouterr().err
    assert manifest_of(out)["options"]["schedule"] == "ratrain"
    assert compile_to(out, "--schedule", "baseline", "--force") == 0
    assert manifest_of(out)["options"]["schedule"] == "baseline"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "prog"]


def test_mt3000_defaults(tmp_path):
    out = tmp_path / "prog"
    assert compile_to(out, "--hw", "mt3000", "--dp", "2") == 0
    options = manifest_of(out)["options"]
    assert (options["precision"], options["zero"], options["budget"]) == ("fp16", 2, 20 * 10**9)
    hw = manifest_of(out)["hw"]
    assert (hw["ranks_per_node"], hw["inter_node_bandwidth"]) == (4, 3.7e9)  # one shared port


def test_unknown_profile_lists_known():
    with pytest.raises(ProfileError, match="known profiles are cpu, mt3000"):
        load_profile("no-such-machine")


def test_building_the_parser_does_not_import_jax():
    code = ("import sys; from ratrain.cli import build_parser; build_parser(); "
            "print('jax' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_program_options_need_a_program_dir(capsys):
    assert main(["inspect", "tiny", "--rank", "0"]) == 2
    assert "--rank need a program DIR" in capsys.readouterr().err


def test_compile_defaults_to_train_micro_batch_rule(tmp_path):
    """See NOTE [default micro-batches]: no global batch to divide, so 4, not 1."""
    assert compile_to(tmp_path / "prog", "--pp", "2") == 0
    assert manifest_of(tmp_path / "prog")["options"]["micro_batches"] == 4
    assert compile_to(tmp_path / "one", "--pp", "2", "--micro-batches", "1") == 0
    assert manifest_of(tmp_path / "one")["options"]["micro_batches"] == 1


def test_global_batch_without_plan_says_what_to_do(tmp_path, capsys):
    assert compile_to(tmp_path / "prog", "--global-batch", "8") == 2
    assert capsys.readouterr().err == (
        "ratrain: error: --global-batch steers only the planner: add --plan to let it "
        "choose the layout, or drop it and give --pp, --dp and --micro-batches yourself\n")


def test_clip_must_be_positive(tmp_path, capsys):
    assert compile_to(tmp_path / "prog", "--clip", "0") == 2
    assert "--clip must be a positive" in capsys.readouterr().err


def test_too_many_stages_is_one_line(tmp_path, capsys):
    assert compile_to(tmp_path / "prog", "--pp", "9") == 2
    assert capsys.readouterr().err.splitlines() == [
        "ratrain: error: cannot split 6 layers into 9 stages: every stage needs at least one "
        "layer (use --pp <= 6)"]


def test_task_costs_follow_the_profile():
    from ratrain.compiler import compile_graph, trace_for
    from ratrain.sim.costs import task_cost_model
    from ratrain.sim.kernels import graph_seconds
    from ratrain.passes.residuals import rebuild_node_indices
    from ratrain.ir.tasks import Task
    from ratrain.models import get_config
    from ratrain.passes.layer_buffers import layer_param_count
    from ratrain.passes.program import CompileOptions
    options = CompileOptions(pp=2, dp=4, micro_batches=2, seq_len=32, recompute="full")
    program = compile_graph(trace_for(get_config("tiny"), "tiny", options), options)[0]
    profile = load_profile("mt3000")
    cost = task_cost_model(program, profile)
    # compute tasks: the kernels' node costs on the profile, as the simulator charges
    # them (NOTE [a compute task's seconds]); mt3000 has no measured ones: the roofline
    fwd = lambda l: sum(graph_seconds(program.graph.kinds[program.graph.layers[l].kind],
                                      "fwd", profile, "fp32"))
    assert cost(Task(1, Kind.F, micro_batch=0)) == pytest.approx(
        sum(fwd(l) for l in program.stages[1]))
    kind = program.graph.kinds[program.graph.layers[3].kind]   # full: the nodes that
    rebuild = rebuild_node_indices(kind, "full")                # remake its residuals
    assert 0 < len(rebuild) < len(kind.fwd.nodes)
    assert cost(Task(1, Kind.REC, micro_batch=0, layer=3)) == pytest.approx(
        sum(graph_seconds(kind, "fwd", profile, "fp32")[i] for i in rebuild))
    grad_bytes = 4 * layer_param_count(program, 3)
    # stage 1's DP group is ranks 1, 3 (node 0) and 5, 7 (node 1) of 4 per node: reduce-
    # scatter within the node, all-reduce of half the bytes across the 2 nodes with the
    # node's 2 members sharing its port, all-gather within the node (NOTE [node memory])
    within = profile["link_latency"] + grad_bytes / 2 / profile["link_bandwidth"]
    across = 2 * profile["inter_node_latency"] + \
        grad_bytes / 2 / (profile["inter_node_bandwidth"] / 2)
    assert cost(Task(1, Kind.SYNC, layer=3)) == pytest.approx(2 * within + across)
    message = program.layer_cost(program.stages[0][-1]).output_bytes
    assert cost(Task(0, Kind.SEND_F, micro_batch=0)) == pytest.approx(
        profile["link_latency"] + message / profile["link_bandwidth"])
    assert cost(Task(1, Kind.RECV_F, micro_batch=0)) == 0.0


def test_failed_write_leaves_no_directory(tmp_path, monkeypatch):
    import ratrain.programs as programs

    def broken_manifest(*args):
        raise OSError("disk full")
    monkeypatch.setattr(programs, "build_manifest", broken_manifest)
    with pytest.raises(OSError, match="disk full"):
        compile_to(tmp_path / "prog")
    assert list(tmp_path.iterdir()) == []


def test_update_rule_flag_reaches_the_options(tmp_path, capsys):
    """--update-rule (NOTE [commit rule]): commit by default, after-norm on request; the
    lowered program of an fp16 run shows which."""
    for rule in ("commit", "after-norm"):
        out = tmp_path / rule
        flags = ("--precision", "fp16") + (("--update-rule", rule) if rule != "commit" else ())
        assert compile_to(out, *flags) == 0
        assert manifest_of(out)["options"]["update_rule"] == rule
    with pytest.raises(SystemExit) as exit_:
        main(["compile", *TINY, "--update-rule", "later", "-o", str(tmp_path / "x")])
    assert exit_.value.code == 2
    assert "invalid choice: 'later'" in capsys.readouterr().err


def test_update_rule_help_says_what_it_does(capsys):
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--update-rule {commit,after-norm}" in text and "rolls it back" in text


def test_a_long_step_is_written_as_a_periodic_program(tmp_path, capsys):
    """See NOTE [periodic programs]: 48 micro-batches on 2 stages compile from instances; the
    manifest holds each stage's period, the dumps say what they show, and --expand writes
    the whole step."""
    out = tmp_path / "periodic"
    assert compile_to(out, "--pp", "2", "--micro-batches", "48") == 0
    assert "compiling an instance of 8 micro-batches" in capsys.readouterr().err
    periods = json.loads((out / "program.json").read_text())["periods"]
    assert {s: (p["shift"], p["instance"] + (p["count"] - 1) * p["shift"])
            for s, p in periods.items()} == {"0": (2, 48), "1": (1, 48)}
    lower = (out / "passes" / f"{len(PASS_NAMES):02d}_lower.txt").read_text().splitlines()
    assert lower[1] == "# periodic program of 48 micro-batches (NOTE [periodic programs]); " \
                       "`ratrain compile --expand` writes the whole step"
    assert max(t.micro_batch or 0 for t in parse_tasks((out / "rank0.txt").read_text())) < 12
    whole = tmp_path / "whole"
    assert compile_to(whole, "--pp", "2", "--micro-batches", "48", "--expand") == 0
    assert json.loads((whole / "program.json").read_text())["periods"] == {}
    assert max(t.micro_batch or 0 for t in parse_tasks((whole / "rank0.txt").read_text())) == 47


def test_the_report_dry_runs_a_periodic_program_as_its_whole_step():
    """--report's dry run expands a periodic program's tasks (periodic_program.
    expanded_schedule), costing each repeat as the task it repeats: the whole step's time."""
    from ratrain import models
    from ratrain.compiler import compile_graph, simulate, trace_for
    from ratrain.passes.program import CompileOptions
    options = CompileOptions(pp=2, micro_batches=48, seq_len=32)
    graph = trace_for(models.get_config("tiny"), "tiny", options)
    periodic, whole = compile_graph(graph, options)[0], compile_graph(graph, options, True)[0]
    assert periodic.periods and not whole.periods
    profile = load_profile("cpu")
    assert simulate(periodic, profile).makespan == pytest.approx(simulate(whole, profile).makespan,
                                                                 rel=1e-12)


def test_a_program_directory_rebuilds_with_the_split_it_records(program_dir):
    """See NOTE [a recorded split is kept]: a directory compiled when the costs balanced the
    layers otherwise (another profile, an older cost model) rebuilds to the stages its
    program.json records, not to today's balance; a split that is not one is refused."""
    import copy

    from ratrain.compiler import recompile
    from ratrain.errors import UserError
    from ratrain.programs import read_manifest
    manifest = read_manifest(program_dir)
    recorded = [s["layers"] for s in manifest["stages"]]
    assert [list(s) for s in recompile(manifest).stages] == recorded
    layers = [l for s in recorded for l in s]
    for cut in range(1, len(layers)):
        other = [layers[:cut], layers[cut:]]
        if other == recorded:
            continue
        older = copy.deepcopy(manifest)
        for stage, split in zip(older["stages"], other):
            stage["layers"] = split
        assert [list(s) for s in recompile(older).stages] == other
        assert [list(s) for s in recompile(older, 2).stages] == other
    older["stages"][1]["layers"] = []
    with pytest.raises(UserError, match="recorded split"):
        recompile(older)
