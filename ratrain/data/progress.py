"""Progress of a long piece of work over a known number of bytes (tokenizing a --data
path): done / total MiB, MiB/s and the time left, on stderr. A terminal gets one `\\r`
line redrawn; a log gets whole lines, the first within a second of the start (NOTE
[progress lines]).
"""
from __future__ import annotations

import sys
import time

FIRST_LINE_S = 1.0                      # the first line, however little is done
LOG_EVERY_S = 10.0                      # later lines in a log
REDRAW_S = 0.2                          # a terminal's line

# NOTE [progress lines]: tokenizing gigabytes takes minutes to hours, so silence until the
# end reads as a hang. The first line comes FIRST_LINE_S after the start even when no
# batch has finished yet (the caller ticks while it waits for the encoder), so a user sees
# within a second or two what is going on and how big it is; later lines carry the rate
# over everything done so far and the time left at that rate. In a log (not a terminal)
# a line every LOG_EVERY_S keeps a long job's log short.


class Progress:
    """Bytes done of `total`, shown as the module docstring says; `tick` redraws when due,
    `advance` adds done bytes and ticks."""

    def __init__(self, label: str, total: int, stream=None, clock=time.monotonic):
        self.label, self.total, self.done_bytes = label, max(total, 1), 0
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.clock = clock
        self.start = clock()
        self.next_at = self.start + FIRST_LINE_S

    def advance(self, nbytes: int) -> None:
        self.done_bytes += nbytes
        self.tick()

    def tick(self) -> None:
        now = self.clock()
        if now < self.next_at:
            return
        self.next_at = now + (REDRAW_S if self.live else LOG_EVERY_S)
        line = f"{self.label}: {self.status(now)}"
        self.stream.write(f"\r{line}  " if self.live else line + "\n")
        self.stream.flush()

    def status(self, now: float) -> str:
        """`12.0/50.0 MiB (24%), 2.1 MiB/s, 18 s left`."""
        elapsed = max(now - self.start, 1e-9)
        share = min(1.0, self.done_bytes / self.total)
        text = f"{_mib(self.done_bytes)}/{_mib(self.total)} MiB ({share:.0%})"
        if self.done_bytes == 0:
            return f"{text}, starting"
        rate = self.done_bytes / elapsed
        left = max(self.total - self.done_bytes, 0) / rate
        return f"{text}, {_mib(rate)} MiB/s, {_duration(left)} left"

    def stop(self) -> None:
        """End a drawn line, so that an error prints below it."""
        if self.live:
            self.stream.write("\n")
            self.stream.flush()

    def done(self, summary: str) -> None:
        elapsed = self.clock() - self.start
        rate = self.done_bytes / max(elapsed, 1e-9)
        line = f"{self.label}: {summary} in {elapsed:.1f} s ({_mib(rate)} MiB/s)"
        self.stream.write(("\r" + line + " " * 10 if self.live else line) + "\n")
        self.stream.flush()


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2 ** 20:.1f}"


def _duration(seconds: float) -> str:
    """`42 s`, `3 min 5 s`, `2 h 10 min`."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
