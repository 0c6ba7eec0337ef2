"""The vocabulary-parallel head and embedding under MPI (NOTE [vocabulary-parallel head],
NOTE [vocabulary-parallel embedding], ir/vocab.py): programs compiled with
--vocab-parallel (both: the head's and the embedding's rows; head: the head's alone)
train to the losses of the same program without it within 1e-6 relative at every one of
30 steps (fp32; pp 2 and pp 4, 1f1b and zb1, untied and tied embeddings), and save the
checkpoint the unsplit run saves (the rows gathered), which resumes; that transformers
loads it and scores it as ratrain does is tests/rt/test_vocab_parallel_formats_mpi.py's."""
import numpy as np
import pytest

from ratrain import models
from ratrain.cli import main as ratrain_main
from rt_reference import CONFIG, assert_same_checkpoint, mpirun, read_metrics, write_workdir

pytestmark = pytest.mark.mpi

T, M, B, STEPS = 16, 4, 2, 30
# NOTE [Adam and rounding] (tests/passes/test_compiled_semantics.py): the two programs sum
# the softmax and hn's gradient in other orders, and Adam turns a rounding difference of a
# gradient near eps into a parameter change of lr * dg / eps; eps 1e-3 keeps it below the
# tolerance (with 1e-6, tied pp 2 reached 1.3e-6 relative at step 25 of 30)
HYPER = ["--lr", "0.01", "--lr-schedule", "constant", "--eps", "1e-3", "--weight-decay", "0.1",
         "--seed", "3", "--no-shuffle"]
# three decoders: under --vocab-parallel both the embedding leaves the pipeline, whose
# layers (the decoders and the final norm) pp 4 needs four of
UNTIED = models.fill_defaults(dict(CONFIG, num_hidden_layers=3))
TIED = models.fill_defaults(dict(UNTIED, tie_word_embeddings=True))

CASES = {  # name -> (pp, pipeline schedule, tied, --vocab-parallel)
    "pp2-1f1b": (2, "1f1b", False, "both"),
    "pp2-zb1": (2, "zb1", False, "both"),
    "pp4-1f1b": (4, "1f1b", False, "both"),
    "pp4-zb1": (4, "zb1", False, "both"),
    "tied-pp2-1f1b": (2, "1f1b", True, "both"),
    "tied-pp2-zb1": (2, "zb1", True, "both"),
    "tied-pp4-1f1b": (4, "1f1b", True, "both"),
    "tied-pp4-zb1": (4, "zb1", True, "both"),
    "head-pp2-zb1": (2, "zb1", False, "head"),
    "head-tied-pp4-zb1": (4, "zb1", True, "head"),
}


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
    return {tied: write_workdir(tmp_path_factory.mktemp("vocab-tied" if tied else "vocab"),
                                TIED if tied else UNTIED, 64, T) for tied in (False, True)}


def compile_program(workdir, name: str, pp: int, schedule: str, vocab: str):
    """`vocab`: none, head, or both (given as the bare flag, which means both)."""
    out = workdir / f"{name}-{vocab}"
    flag = {"none": [], "head": ["--vocab-parallel", "head"], "both": ["--vocab-parallel"]}
    assert ratrain_main(["compile", str(workdir / "config.json"), "--seq-len", str(T),
                         "--pp", str(pp), "--micro-batches", str(M), "--micro-batch-size",
                         str(B), "--recompute", "none", "--precision", "fp32",
                         "--pipeline-schedule", schedule, "-o", str(out)]
                        + flag[vocab]) == 0
    return out


def train(workdir, program, ranks: int, steps: int = STEPS, *args):
    """(losses, final weights) of `steps` steps of `program`, saved at the end."""
    metrics, saved = (workdir / f"{program.name}.{kind}" for kind in ("jsonl", "saved"))
    run = mpirun(ranks, program, "--steps", steps, "--data", workdir / "tokens.npy",
                 "--metrics", metrics, "--save-dir", saved, *HYPER, *args, timeout=600)
    assert run.returncode == 0, run.stderr
    _, weights = models.load_pretrained(saved / f"step-{steps:06d}")
    return [r["loss"] for r in read_metrics(metrics)], weights


@pytest.fixture(scope="module")
def trained(workdirs):
    """(pp, schedule, tied, --vocab-parallel) -> that program's (losses, weights), each
    run once for the tests of this module."""
    runs = {}

    def run(pp: int, schedule: str, tied: bool, vocab: str):
        key = (pp, schedule, tied, vocab)
        if key not in runs:
            workdir, name = workdirs[tied], f"{'tied-' if tied else ''}pp{pp}-{schedule}"
            runs[key] = train(workdir, compile_program(workdir, name, pp, schedule, vocab),
                              pp)
        return runs[key]
    return run


@pytest.mark.parametrize("name", list(CASES))
def test_vocab_parallel_losses_match_the_unsplit_program(trained, name):
    pp, schedule, tied, vocab = CASES[name]
    split, split_weights = trained(pp, schedule, tied, vocab)
    whole, whole_weights = trained(pp, schedule, tied, "none")
    assert len(split) == len(whole) == STEPS
    np.testing.assert_allclose(split, whole, rtol=1e-6)
    assert split_weights.keys() == whole_weights.keys()   # the head gathered whole
    for key in whole_weights:
        np.testing.assert_allclose(split_weights[key], whole_weights[key], rtol=1e-4,
                                   atol=1e-5, err_msg=key)


@pytest.mark.parametrize("pp,schedule,tied", [(2, "zb1", False), (4, "zb1", True)])
def test_the_embedding_split_changes_no_bit_of_the_head_split(trained, pp, schedule, tied):
    """See NOTE [vocabulary-parallel embedding]: the lookups' sum adds zeros to each row, and
    each row's gradient takes the unsplit embedding's additions in its order (the same
    kernel, on the shard's tokens), so --vocab-parallel both trains to the bits of
    --vocab-parallel head: every loss, and the final weights."""
    both, both_weights = trained(pp, schedule, tied, "both")
    head, head_weights = trained(pp, schedule, tied, "head")
    assert both == head
    assert both_weights.keys() == head_weights.keys()
    for key in head_weights:
        np.testing.assert_array_equal(both_weights[key], head_weights[key], err_msg=key)


def test_vocab_parallel_resumes_bit_identically_from_the_unsplit_checkpoint(workdirs):
    """pp 2 x dp 2 (ZeRO 1: the shards' state gathered over DP, then their rows over the
    pipeline) with --vocab-parallel (both): 4 steps, then 4 more resumed from its
    checkpoint, are the uninterrupted run's 8 bit for bit; the checkpoint holds the plain
    program's files and tensors (the LM head and the embedding whole, with their
    moments), and the final ones are the same bytes."""
    workdir = workdirs[False]
    program = workdir / "resume-vocab"
    assert ratrain_main(["compile", str(workdir / "config.json"), "--seq-len", str(T),
                         "--pp", "2", "--dp", "2", "--zero", "1", "--micro-batches", "2",
                         "--micro-batch-size", str(B), "--recompute", "none", "--precision",
                         "fp32", "--vocab-parallel", "-o", str(program)]) == 0

    def run(name, *args):
        metrics, saved = workdir / f"{name}.jsonl", workdir / name
        done = mpirun(4, program, "--data", workdir / "tokens.npy", "--metrics", metrics,
                      "--save-dir", saved, *HYPER, *args, timeout=600)
        assert done.returncode == 0, done.stderr
        return [r["loss"] for r in read_metrics(metrics)], saved

    whole, whole_dir = run("resume-whole", "--steps", 8)
    first, first_dir = run("resume-first", "--steps", 4)
    resumed, resumed_dir = run("resume-rest", "--steps", 8, "--resume",
                               first_dir / "step-000004")
    assert first + resumed == whole
    checkpoint = first_dir / "step-000004"
    assert sorted(f.name for f in checkpoint.iterdir()) == [
        "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json", "optimizer-00001-of-00002.safetensors",
        "optimizer-00002-of-00002.safetensors", "trainer_state.json"]
    _, weights = models.load_pretrained(checkpoint)
    assert {k: v.shape for k, v in weights.items()} == models.param_shapes(UNTIED)
    assert_same_checkpoint(whole_dir / "step-000008", resumed_dir / "step-000008")
