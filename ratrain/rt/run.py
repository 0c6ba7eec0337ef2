"""`python -m ratrain.rt DIR` under mpiexec: open and check the program, allocate the
arena, train for --steps and write metrics on rank 0.

Set-up errors (wrong world size, corrupted program, bad data) are agreed on by all ranks
and printed once as one line; any error while running aborts the whole job (no hang).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from ratrain.ir.vocab import base_name
from ratrain.optim import LossScaler, starting_scaler
from ratrain.rt.checkpoint import (check_save_dir, checkpoint_name, export_config,
                                   find_resume_checkpoint, load_checkpoint, tokenizer_contents,
                                   tokenizer_files)
from ratrain.rt.data import (Batches, DataError, prepare_program_text_data, text_settings,
                             token_stream_identity, training_rows)
from ratrain.rt.evaluate import due, evaluate, held_out
from ratrain.rt.job import Job, Weights, with_resume
from ratrain.rt.load import SetupError, open_program
from ratrain.rt.loggers import loggers_problem, open_loggers
from ratrain.rt.loss_plot import write_loss_plot
from ratrain.rt.metrics import MetricsLog, StepMetrics, Throughput, rss_bytes
from ratrain.rt.program import CodeError, stage_code, trusted_line
from ratrain.rt.start import checkpoints_problem, data_order, resume_problem
from ratrain.rt.stop import (CHECKPOINT, command_text, exit_code, listen, received,
                             resume_text, signal_name)
from ratrain.rt.trace import TaskTrace
from ratrain.rt.train_options import (add_training_options, check_run_length,
                                      check_run_numbers, learning_rate, optimizer_at,
                                      resume_argv)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ratrain.rt", description="Run a program "
                                "directory written by `ratrain compile` on pp x dp MPI ranks "
                                "(start it with mpiexec -n <pp*dp>).")
    p.add_argument("program", metavar="DIR", help="program directory (program.json, ...)")
    add_training_options(p)
    p.add_argument("--quiet", action="store_true", help="no progress line per step")
    p.add_argument("--resume-command", default=None, metavar="TEXT", help="the command a "
                   f"stopped run prints to resume it, {CHECKPOINT} standing for the checkpoint "
                   "written (default: this mpiexec command with --resume; `ratrain run` and "
                   "`ratrain train` pass theirs)")
    return p


def initial_state(args, config: dict, names=None):
    """(params, moments, state of a resumed run): seeded, from --init-from or from
    --resume; only the parameters `names` (a rank's stage's), if given. The checkpoint's
    files and shapes were checked against `config` before (checkpoints_problem)."""
    from ratrain import models
    if args.init_from is None and args.resume is None:
        return models.init_params(config, args.seed, names), None, {}
    source, flag = (args.resume, "--resume") if args.resume else (args.init_from, "--init-from")
    try:
        return load_checkpoint(source, names) if args.resume else \
            (models.load_pretrained(source, names)[1], None, {})
    except (OSError, ValueError, KeyError) as e:
        raise SetupError(f"cannot load {flag} {source}: {e}") from None


def prepare(args, world_size: int, rank: int = 0) -> Job:
    """Everything a job starts from (program, initial state, batches), or a SetupError;
    `args` is left alone (the job's `resume` is --resume resolved)."""
    if (problem := check_run_length(args) or check_run_numbers(args) or
            loggers_problem(args.log_to, args.metrics)) is not None:
        raise SetupError(problem)
    manifest, program = open_program(args.program, world_size, args.trust_program_code)
    o, config = program.options, program.graph.config
    stage = program.coords(rank)[0]
    try:  # this rank's module, built (once per job) or found in the user cache
        stage_code(program, stage, args.trust_program_code)
    except CodeError as e:
        raise SetupError(str(e)) from None
    args = with_resume(args, resolved_resume(args.resume))
    if (problem := checkpoints_problem(args, config)) is not None:
        raise SetupError(problem)
    params, moments, state = initial_state(args, config, {
        base_name(name) for layer in program.stages[stage]
        for name, _ in program.layer_params(layer)})
    global_batch = o.dp * o.micro_batches * o.micro_batch_size
    text = text_settings(args, config, build=False)  # NOTE [tokenize once] (rt/data.py)
    try:
        stream = token_stream_identity(args.data, text)
        if (problem := resume_problem(args, state, stream)) is not None:
            raise SetupError(problem)
        rows = training_rows(args.data, o.seq_len, int(config["vocab_size"]), text)
        held = held_out(args, o.seq_len + 1, global_batch, text)
    except ValueError as e:  # DataError, or the eval flags
        raise SetupError(str(e)) from None
    shuffle, seed = data_order(args, state)
    batches = Batches(rows, global_batch, shuffle, seed)
    return Job(program=program, weights=Weights(params, moments), batches=batches,
               held_out=held, step=state.get("step", 0),
               data_order={"shuffle": shuffle, "seed": seed},
               scaler=loss_scaler(args, o.precision, state),
               skipped_steps=state.get("skipped_steps", 0),
               elapsed=float(state.get("elapsed_s", 0.0)),  # NOTE [elapsed across resumes]
               checkpoint=checkpoint_contents(args, manifest, config, stream),
               throughput=Throughput.of_manifest(manifest), resume=args.resume)


def resolved_resume(resume: str | None) -> str | None:
    """The checkpoint directory --resume names (rt/checkpoint.find_resume_checkpoint), or
    a SetupError; None without --resume."""
    if not resume:
        return resume
    try:
        return str(find_resume_checkpoint(resume))
    except ValueError as e:
        raise SetupError(str(e)) from None


def checkpoint_contents(args, manifest: dict, config: dict, stream: dict) -> dict:
    """What every checkpoint holds besides the weights: the config.json to write (the one
    the model was read from, kept in the manifest as hf_config; the filled one for programs
    compiled before it was), the tokenizer files to copy (NOTE [checkpoints transformers
    loads]) and the identity of the token stream (NOTE [token stream identity])."""
    hf_config = manifest.get("model", {}).get("hf_config") or config
    return {"config": export_config(hf_config),
            "tokenizer": tokenizer_contents(tokenizer_files(
                getattr(args, "tokenizer", None), args.resume, args.init_from)),
            "token_stream": stream}


# NOTE [checkpoints transformers loads]: a checkpoint directory is meant to be handed to
# transformers.AutoModelForCausalLM.from_pretrained and AutoTokenizer as is. So its
# config.json is the user's dict, not ratrain's filled-in copy (whose extra keys a newer
# transformers may read differently), with the dtype set to float32 as the weights are;
# and the tokenizer files of --tokenizer, the resumed checkpoint or --init-from are
# copied in, in that order of preference (choose_tokenizer's, so a checkpoint holds the
# tokenizer its run tokenized with).


def loss_scaler(args, precision: str, state: dict) -> LossScaler:
    """The loss scale the run starts from: a resumed fp16 run's, else the flags' (checked
    by check_run_numbers)."""
    scaler = starting_scaler(precision, args.initial_loss_scale, args.loss_scale_window)
    saved = state.get("loss_scale")
    if precision == "fp16" and saved is not None:
        scaler.scale, scaler.growth_tracker = saved["scale"], saved["growth_tracker"]
    return scaler


def check_writable(path: str | None, flag: str) -> None:
    if path is None:
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        open(path, "a").close()
    except OSError as e:
        raise SetupError(f"cannot write {flag} {path}: {e.strerror}") from None


def tokenize_on_rank0(args, comms) -> str | None:
    """NOTE [tokenize once] (rt/data.py): rank 0 tokenizes the text data `ratrain run`
    has not (started directly under mpiexec) while the others wait; its error, if any."""
    from ratrain.rt import comm
    if comms.rank != 0:
        return None
    try:
        prepare_program_text_data(args, args.program)
    except (DataError, SetupError) as e:
        return str(e)
    except OSError as e:
        return f"cannot read {e.filename}: {e.strerror}"
    except Exception as e:  # a bug: say where and stop everyone
        comm.abort_job(f"ratrain: rank 0 failed tokenizing: {type(e).__name__}: {e}")
    return None


def main(argv=None) -> int:
    listen()  # again for callers other than rt/__main__.py (which listens before imports)
    args = build_parser().parse_args(argv)
    from ratrain.rt import comm
    comms = comm.Communicators()
    if args.trust_program_code and comms.rank == 0 and args.resume_command is None:
        print(trusted_line(args.program), flush=True)  # `ratrain run` said it already
    errors = comms.agree_on_errors(tokenize_on_rank0(args, comms))
    if errors:
        if comms.rank == 0:
            print(f"ratrain: error: {errors[0]}", file=sys.stderr)
        return 2
    job = agreed_setup(comms, lambda: _set_up(args, comms))
    return 2 if job is None else train(args, comms, job)


def _set_up(args, comms) -> Job:
    job = prepare(args, comms.size, comms.rank)
    if comms.rank == 0:
        check_writable(args.metrics, "--metrics")
        if args.save_dir and (problem := check_save_dir(args.save_dir)) is not None:
            raise SetupError(problem)
    return job


def agreed_setup(comms, set_up, user_errors=(SetupError,)):
    """What `set_up()` returns on every rank, or None once the ranks agree that one of
    them met a user error (`user_errors`: rank 0 prints the first, one line); any other
    exception is a bug, which stops the job naming the rank."""
    from ratrain.rt import comm
    job, error = None, None
    try:
        job = set_up()
    except user_errors as e:
        error = str(e)
    except Exception as e:  # a bug, not a user error: say where and stop everyone
        comm.abort_job(f"ratrain: rank {comms.rank} failed at set-up: {type(e).__name__}: {e}")
    errors = comms.agree_on_errors(error)
    if errors:
        if comms.rank == 0:
            print(f"ratrain: error: {errors[0]}", file=sys.stderr)
        return None
    return job


def train(args, comms, job: Job) -> int:
    """Run the steps from job's to --steps, or until a stop signal (NOTE [stopping at one
    step], rt/stop.py); the exit code: 0, or 128 + the signal after a stop."""
    from ratrain.rt import comm
    from ratrain.rt.executor import RankExecutor
    args, program, batches = job.options(args), job.program, job.batches
    if comms.rank == 0 and not args.quiet:
        print(f"{comms.size} ranks up: building the stage code (cached after the first "
              "build) and the arenas", flush=True)
    try:
        executor = RankExecutor(program, comms, *job.weights.take(), job.step,
                                args.progress_us * 1e-6)
    except Exception as e:
        comm.abort_job(f"ratrain: rank {comms.rank} failed at set-up (arena and initial "
                       f"state): {type(e).__name__}: {e}")
    st = executor.state
    st.scaler, st.skipped_steps = job.scaler, job.skipped_steps
    if program.options.precision == "fp16":  # overflow is expected: the scaler skips the step
        np.seterr(over="ignore", invalid="ignore")
    if args.trace:
        executor.trace = TaskTrace(comms.rank, st.stage, args.program)
    log = MetricsLog(args.metrics if comms.rank == 0 else None, args.steps,
                     job.throughput, job.elapsed,
                     _loggers(args) if comms.rank == 0 else ())
    tokens_per_step = batches.global_batch * program.options.seq_len
    if comms.rank == 0 and not args.quiet and job.step < args.steps:
        print(f"first step: {job.step + 1}/{args.steps} (it also warms up)", flush=True)
    stop, saved = 0, None
    for k in range(job.step, args.steps):
        if stop := comms.agree_on_stop(received()):
            break
        start, scale = time.perf_counter(), st.scaler.scale
        losses = _run_step(executor, batches.step(k), optimizer_at(args, k + 1))
        gathered = comms.gather_to_root((losses, executor.arena_bytes, rss_bytes(),
                                         executor.peak_bytes, executor.planned_peak_bytes))
        seconds = time.perf_counter() - start
        eval_loss = evaluate(executor, comms, job.held_out) \
            if due(job.held_out, k + 1, args.steps) else None
        if comms.rank == 0:
            try:
                _log_step(args, log, k + 1, gathered, tokens_per_step, seconds,
                          _gradient_metrics(program, st, scale), eval_loss)
            except OSError as e:
                comm.abort_job(f"ratrain: rank 0 failed writing metrics: {e}")
        if args.save_dir and (k + 1 == args.steps or args.save_every and
                              (k + 1) % args.save_every == 0):
            saved = _save(args, comms, executor, job, log.elapsed())
    if stop and args.save_dir and executor.step > job.step and saved != executor.step:
        saved = _save(args, comms, executor, job, log.elapsed())
    executor.finish()
    if executor.trace is not None:
        executor.trace.write(args.trace)
    if comms.rank == 0:
        _finish_log(args, log)
    if comms.rank == 0 and stop:
        print(stop_line(args, comms.size, stop, executor.step, job.step, saved),
              file=sys.stderr, flush=True)
    return exit_code(stop) if stop else 0


def stop_line(args, world_size: int, number: int, step: int, first: int,
              saved: int | None) -> str:
    """The one line a stopped run ends with: where it stopped, the checkpoint to continue
    from (the one just written, else the one it resumed from) and the command that does."""
    at = f"after step {step} of {args.steps}" if step > first else \
        f"before step {step + 1} of {args.steps}"
    checkpoint = Path(args.save_dir) / checkpoint_name(saved) if saved is not None \
        else args.resume if step == first else None
    if checkpoint is None:
        return f"ratrain: stopped by {signal_name(number)} {at}; " + (
            "no step was trained" if step == first else
            "nothing saved (--save-dir DIR makes a run resumable)")
    command = resume_text(args.resume_command or mpiexec_command(args, world_size),
                          checkpoint)
    return (f"ratrain: stopped by {signal_name(number)} {at}; checkpoint {checkpoint}; "
            f"resume with: {command}")


def mpiexec_command(args, world_size: int) -> str:
    """This run's own command line (started under mpiexec directly) with --resume."""
    return command_text(["mpiexec", "-n", world_size, sys.executable, "-m", "ratrain.rt",
                         args.program, *resume_argv(args),
                         *(["--quiet"] if args.quiet else [])])


def _run_step(executor, tokens, optimizer) -> list[float]:
    """One step; any error aborts the job with the rank, task and call it happened at."""
    from ratrain.rt import comm
    try:
        return executor.run_step(tokens, optimizer)
    except Exception as e:
        task, call = executor.position
        where = f"{call.op}, {call.note}" if call is not None and call.note else \
            getattr(call, "op", "-")
        comm.abort_job(f"ratrain: rank {executor.comms.rank} failed at task {task} (call "
                       f"{where}): {type(e).__name__}: {e}")


def _save(args, comms, executor, job: Job, elapsed: float) -> int:
    """Write a checkpoint, every stage its own files (NOTE [checkpoints without
    gathering]); then remove the ones --keep-last no longer keeps. The step saved."""
    from ratrain.rt import comm
    from ratrain.rt.checkpoint import (finish_checkpoint, prune_checkpoints, staging_dir,
                                       write_stage)
    path, contents = Path(args.save_dir) / checkpoint_name(executor.step), job.checkpoint
    staging, error = None, None
    if comms.rank == 0:
        try:
            staging = staging_dir(path)
        except OSError as e:
            error = str(e)
    staging = comms.broadcast_from_root(staging)
    executor.settle()   # nothing in flight on the DP group while shards are gathered
    if staging is not None:
        try:
            write_stage(executor.program, executor.state, comms, Path(staging))
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
    errors = comms.agree_on_errors(error and f"rank {comms.rank}: {error}")
    if comms.rank != 0:
        return executor.step
    try:
        if errors:
            raise RuntimeError("; ".join(errors))
        finish_checkpoint(executor.program, Path(staging), path, contents["config"],
                          {"step": executor.step, **job.data_order, "data": args.data,
                           "token_stream": contents["token_stream"], "elapsed_s": elapsed,
                           **_scaler_state(executor)}, contents["tokenizer"])
        removed = prune_checkpoints(args.save_dir, args.keep_last, path)
    except Exception as e:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        why = str(e) if errors else f"{type(e).__name__}: {e}"  # errors: already "rank R: ..."
        comm.abort_job(f"ratrain: writing checkpoint {path} failed: {why}")
    if not args.quiet:
        print(f"saved {path}", *(f"removed {old.name} (keep-last {args.keep_last})"
                                 for old in removed), sep="\n", flush=True)
    return executor.step


def _scaler_state(executor) -> dict:
    """What a resumed run needs to scale and count steps exactly as this one would."""
    st, fp16 = executor.state, executor.program.options.precision == "fp16"
    scaler = {"scale": st.scaler.scale, "growth_tracker": st.scaler.growth_tracker}
    return {"loss_scale": scaler if fp16 else None, "skipped_steps": st.skipped_steps}


def _gradient_metrics(program, st, scale: float) -> dict:
    """Norm, loss scale (of fp16 programs) and skips of the step just run; every rank
    has the same (the norm and the overflow flag come from one world all-reduce)."""
    finite = st.grad_norm is not None and np.isfinite(st.grad_norm)
    return {"grad_norm": st.grad_norm if finite else None, "skipped": st.overflow,
            "loss_scale": scale if program.options.precision == "fp16" else None,
            "skipped_steps": st.skipped_steps}


def _log_step(args, log: MetricsLog, step: int, gathered, tokens: int, seconds: float,
              gradients: dict, eval_loss: float | None = None):
    losses = [loss for rank in gathered for loss in rank[0]]
    per_rank = list(zip(*gathered))
    elapsed, eta = log.clock(step)
    metrics = StepMetrics(step, float(np.mean(losses)), tokens / seconds, seconds,
                          learning_rate(args, step), list(per_rank[1]), list(per_rank[2]),
                          arena_peak_bytes=list(per_rank[3]),
                          planned_peak_bytes=list(per_rank[4]), eval_loss=eval_loss,
                          elapsed_s=elapsed, eta_s=eta, **log.rate_fields(seconds),
                          **gradients)
    log.write(metrics)
    if not args.quiet and _is_shown(args, step, log.steps[0].step, eval_loss is not None):
        print(metrics.progress_line(args.steps), flush=True)


def _loggers(args) -> list:
    """Rank 0's --log-to loggers (rt/loggers.py); one that fails to open is said and left
    out: metrics.jsonl still has every step."""
    try:
        return open_loggers(args.log_to, args.metrics, vars(args))
    except Exception as e:  # a library's own failure (a W&B setting, a full disk)
        print(f"ratrain: warning: --log-to {args.log_to} failed: {type(e).__name__}: {e}; "
              f"the steps are in {args.metrics} only", file=sys.stderr, flush=True)
        return []


def _is_shown(args, step: int, first: int, evaluated: bool) -> bool:
    """Whether `step` gets a progress line: every --log-every steps, the job's first
    and the last, and every evaluation."""
    return step % args.log_every == 0 or step in (first, args.steps) or evaluated


def _finish_log(args, log: MetricsLog) -> None:
    """Rank 0 after the last step: the loggers closed, the loss plot beside --metrics,
    then the summary."""
    log.close()
    if args.metrics and log.steps:
        try:
            plot = write_loss_plot(args.metrics)
        except (OSError, ValueError, ImportError) as e:  # the run itself is done
            print(f"ratrain: warning: no loss plot: {type(e).__name__}: {e}", file=sys.stderr,
                  flush=True)
        else:
            if not args.quiet:
                print(f"plotted the loss in {plot}", flush=True)
    if not args.quiet:
        print(log.summary(), flush=True)
