"""Tokenizing --data at scale (issue 41, item 4): MB/s of ratrain's path beside `tokenizers`'
own best `encode_batch` split and beside the path at the branch's base ("today"), all
measured in the same run on the same file, each in its own process (peak RSS of each).

    python bench/tokenize_data.py [--mb 50] [--base COMMIT] [--dir DIR]

The data is this machine's Python sources (stdlib, then site-packages) concatenated into
one .txt of --mb MB; the tokenizer a 1000-id byte-level BPE trained here on its first
2 MB. The library's best is chosen on the first --sample-mb MB among documents (the
source files) and line-aligned pieces of 4 MiB, 1 MiB, 256 KiB and 64 KiB, each with
encode_batch and encode_batch_fast (8 MiB of text per call), then measured on the whole
file. Today's path is the base commit's ratrain/data, extracted with `git show`.
Prints the ratios the acceptance asks for (>= 0.9x the library, >= 1.8x today), the
first progress line's time and the peak RSS; it asserts nothing (timings vary).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from bench_common import CPU_FLAGS, load  # noqa: E402

VOCAB = 1000
CONFIG = {"vocab_size": 1024, "eos_token_id": 0}
SPLITS = ("documents", 4 << 20, 1 << 20, 256 << 10, 64 << 10)
CALL_BYTES = 8 << 20


# ---- the data and the tokenizer ------------------------------------------------------------

def python_sources(mb: float):
    """(text, document start offsets in bytes) of this machine's .py files up to mb MB."""
    paths = sysconfig.get_paths()
    docs, starts, size = [], [], 0
    for root in dict.fromkeys((paths["stdlib"], paths["purelib"])):
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                if size >= mb * 1e6:
                    return "".join(docs), starts
                if not name.endswith(".py"):
                    continue
                try:
                    text = (Path(folder) / name).read_text("utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                if text.strip():
                    starts.append(size)
                    docs.append(text)
                    size += len(text.encode())
    return "".join(docs), starts


def prepare(work: Path, mb: float) -> None:
    """work/data.txt, work/starts.json and work/tok/tokenizer.json, unless made already."""
    if (work / "tok" / "tokenizer.json").is_file() and (work / "starts.json").is_file():
        return
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    text, starts = python_sources(mb)
    (work / "data.txt").write_text(text)
    (work / "starts.json").write_text(json.dumps(starts))
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([text[:2_000_000]], trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    (work / "tok").mkdir(exist_ok=True)
    bpe.save(str(work / "tok" / "tokenizer.json"))


def extract_base(base: str, into: Path) -> None:
    """The base commit's ratrain/__init__.py and ratrain/data/*.py under `into`."""
    names = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", base,
                            "ratrain/data/"], capture_output=True, text=True, check=True)
    for name in ["ratrain/__init__.py", *names.stdout.split()]:
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{base}:{name}"],
                              capture_output=True, text=True, check=True).stdout
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        (into / name).write_text(text)


# ---- the measured paths, each run in a child process ---------------------------------------

class FirstLine:
    """stderr that remembers when its first line and how many lines were written."""

    def __init__(self, stream, start: float):
        self.stream, self.start, self.first, self.lines = stream, start, None, 0

    def write(self, text: str) -> int:
        if "\n" in text:
            self.first = self.first if self.first is not None else time.monotonic() - self.start
            self.lines += text.count("\n")
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()

    def isatty(self):
        return False


def child_token_stream(work: Path, limit: int | None) -> dict:
    """ratrain's token_stream (whichever ratrain is on the path) into a fresh cache."""
    from ratrain.data import choose_tokenizer, token_stream
    data = work / "data.txt"
    if limit is not None:
        data = work / f"data-{limit}.txt"
        data.write_bytes((work / "data.txt").read_bytes()[:limit])
    for old in work.glob(f"{data.name}.*.tokens.*"):
        old.unlink()
    choice = choose_tokenizer(CONFIG, str(work / "tok"), None)
    start = time.monotonic()
    sys.stderr = FirstLine(sys.stderr, start)
    ids = token_stream(str(data), "--data", choice, CONFIG["vocab_size"])
    seconds = time.monotonic() - start
    digest = hashlib.sha256(np.asarray(ids).tobytes()).hexdigest()
    return {"seconds": seconds, "bytes": data.stat().st_size, "tokens": int(len(ids)),
            "sha256": digest,
            "first_line_s": sys.stderr.first, "lines": sys.stderr.lines}


def pieces(text: bytes, split, starts: list[int]) -> list[str]:
    """The file as documents, or as pieces of about `split` bytes ending at a line break."""
    if split == "documents":
        bounds = [*starts, len(text)]
        return [text[a:b].decode() for a, b in zip(bounds, bounds[1:]) if b > a]
    out, at = [], 0
    while at < len(text):
        end = min(len(text), at + split)
        if end < len(text) and (cut := text.rfind(b"\n", at, end)) > at:
            end = cut + 1
        out.append(text[at:end].decode())
        at = end
    return out


def child_library(work: Path, split, call: str, limit: int | None) -> dict:
    """tokenizers alone: `call` over the split's texts, CALL_BYTES of text per call."""
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(work / "tok" / "tokenizer.json"))
    text = (work / "data.txt").read_bytes()[:limit]
    starts = [s for s in json.loads((work / "starts.json").read_text()) if s < len(text)]
    texts = pieces(text, split, starts)
    encode = getattr(tokenizer, call)
    start, tokens, at = time.monotonic(), 0, 0
    while at < len(texts):
        group, size = [], 0
        while at < len(texts) and size < CALL_BYTES:
            group.append(texts[at])
            size, at = size + len(texts[at]), at + 1
        tokens += sum(len(e.ids) for e in encode(group, add_special_tokens=False))
    return {"seconds": time.monotonic() - start, "bytes": len(text), "tokens": tokens}


def peak_rss_mib() -> float:
    """This process's peak RSS (VmHWM: ru_maxrss keeps the parent's peak across exec)."""
    for row in Path("/proc/self/status").read_text().splitlines():
        if row.startswith("VmHWM:"):
            return int(row.split()[1]) / 1024
    return float("nan")


def measure(args, *child: str, pythonpath: Path = REPO) -> dict:
    """Run this file as a child; its JSON line (with its own peak RSS) and the load
    around it."""
    before = load()
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    proc = subprocess.Popen([sys.executable, __file__, "--dir", str(args.dir), "--child",
                             *child], stdout=subprocess.PIPE, env=env, text=True)
    out = proc.stdout.read()
    if proc.wait():
        sys.exit(f"bench/tokenize_data.py: child {child} failed")
    result = json.loads(out.strip().splitlines()[-1])
    return {**result, "load": (before + load()) / 2,
            "mbs": result["bytes"] / 1e6 / result["seconds"]}


def line(name: str, r: dict) -> str:
    return (f"{name:44s} {r['mbs']:6.2f} MB/s  {r['seconds']:7.1f} s  peak RSS "
            f"{r['rss_mib']:6.0f} MiB  load {r['load']:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0, help="size of the text (MB)")
    parser.add_argument("--sample-mb", type=float, default=4.0, help="MB to pick the "
                        "library's best split on")
    parser.add_argument("--base", default=None, help="today's commit (default: the merge "
                        "base of HEAD and main)")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (kept)")
    parser.add_argument("--child", nargs="+", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        limit = None if rest[-1] == "all" else int(rest[-1])
        result = child_token_stream(args.dir, limit) if kind == "stream" else \
            child_library(args.dir, rest[0] if rest[0] == "documents" else int(rest[0]),
                          rest[1], limit)
        print(json.dumps({**result, "rss_mib": peak_rss_mib()}))
        return
    args.dir = args.dir or Path(tempfile.mkdtemp(prefix="ratrain-bench-tokenize-"))
    args.dir.mkdir(parents=True, exist_ok=True)
    base = args.base or subprocess.run(["git", "-C", str(REPO), "merge-base", "HEAD", "main"],
                                       capture_output=True, text=True).stdout.strip()
    flags = set(Path("/proc/cpuinfo").read_text().split())
    print(f"# {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), cpu flags: "
          f"{' '.join(f for f in CPU_FLAGS if f in flags)}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    prepare(args.dir, args.mb)
    size = (args.dir / "data.txt").stat().st_size
    print(f"# data {args.dir / 'data.txt'}: {size / 1e6:.1f} MB of Python sources; "
          f"byte-level BPE of {VOCAB} ids; today = {base[:12]}", flush=True)
    sample = int(args.sample_mb * 1e6)
    tried = {}
    for split in SPLITS:
        for call in ("encode_batch", "encode_batch_fast"):
            r = measure(args, "library", str(split), call, str(sample))
            tried[(split, call)] = r
            name = f"{split if split == 'documents' else f'{split >> 10} KiB pieces'}"
            print(line(f"  sample: {call} over {name}", r), flush=True)
    split, call = max(tried, key=lambda k: tried[k]["mbs"])
    with tempfile.TemporaryDirectory() as old:
        extract_base(base, Path(old))
        today = measure(args, "stream", "all", pythonpath=Path(old))
    library = measure(args, "library", str(split), call, "all")
    ours = measure(args, "stream", "all")
    small = measure(args, "stream", str(size // 5))
    name = split if split == "documents" else f"{split >> 10} KiB pieces"
    print(line(f"today's path ({base[:12]})", today))
    print(line(f"tokenizers' best: {call} over {name}", library))
    print(line("ratrain's path", ours))
    print(line(f"ratrain's path on the first {size // 5 / 1e6:.0f} MB", small))
    assert ours["sha256"] == today["sha256"], "ratrain's path made other ids than today's"
    print(f"ratrain / library best = {ours['mbs'] / library['mbs']:.2f}x (>= 0.9); "
          f"ratrain / today = {ours['mbs'] / today['mbs']:.2f}x (>= 1.8); tokens "
          f"{ours['tokens']:,}, ids identical to today's (sha256)")
    print(f"first progress line {ours['first_line_s']:.2f} s after the start (<= 2), "
          f"{ours['lines']} lines; peak RSS {ours['rss_mib']:.0f} MiB on {size / 1e6:.0f} MB, "
          f"{small['rss_mib']:.0f} MiB on {size // 5 / 1e6:.0f} MB (today "
          f"{today['rss_mib']:.0f} MiB)")
    print(f"# load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
