"""RUN/train.log: what `ratrain train` showed on the terminal, kept in the run directory.

The command's stdout and stderr (its own lines and the ranks' relayed by rt/launch.py)
are copied into the log as they are written; lines printed before the run directory
exists are held and written first when it does (NOTE [the run's log]).
"""
from __future__ import annotations

import sys
import threading
from pathlib import Path

TRAIN_LOG = "train.log"

# NOTE [the run's log]: every `ratrain train` appends to RUN/train.log what the terminal
# showed, stdout and stderr in the order written (the output relays run on threads, so
# writes take a lock): a resumed run adds its lines after the earlier jobs'. The lines
# before RUN exists (the weights line, "compiling ...") are held in memory and written
# when the start writes RUN; a start that fails before that writes nothing, and a new
# run undone after a failed start (NOTE [a failed start is undone]) loses its log with
# the rest. The final `ratrain: error:` line of a UserError is printed by the CLI after
# the command returns and is not in the log; a job's own error lines are.


class TerminalLog:
    """Within the block, sys.stdout and sys.stderr are copied into the log: held until
    `open(path)`, appended to the file after it."""

    def __init__(self):
        self.held, self.file, self.lock, self.streams = [], None, threading.Lock(), None

    def __enter__(self):
        self.streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = (_Tee(s, self) for s in self.streams)
        return self

    def __exit__(self, *exc) -> None:
        sys.stdout, sys.stderr = self.streams
        self.close()

    def record(self, text: str) -> None:
        with self.lock:
            if self.file is not None:
                self.file.write(text)
                self.file.flush()
            else:
                self.held.append(text)

    def open(self, path: Path) -> None:
        """Append from now on to `path`, the held lines first."""
        with self.lock:
            self.file = open(path, "a", encoding="utf-8")
            self.file.write("".join(self.held))
            self.file.flush()
            self.held = []

    def close(self) -> None:
        with self.lock:
            if self.file is not None:
                self.file.close()
            self.file = None


class _Tee:
    """A text stream that writes through to `stream` and records into a TerminalLog."""

    def __init__(self, stream, log: TerminalLog):
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        written = self.stream.write(text)
        self.log.record(text)
        return written

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):  # fileno, isatty, encoding, ...: the stream's
        return getattr(self.stream, name)
