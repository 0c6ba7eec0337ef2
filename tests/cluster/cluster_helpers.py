"""Shared by the cluster tests: the skip reason, the CLI in a subprocess, a private state
directory and what the harness has left on the machine."""
import json
import os
import re
import subprocess
import sys

import pytest

from ratrain.cluster.netns import missing_requirement

REASON = missing_requirement()
needs_root = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def unique_name(tag: str) -> str:
    return f"{tag}{os.getpid() % 100000}"


def ratrain(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "ratrain.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def harness_leftovers(name: str) -> list[str]:
    """Every namespace, link, qdisc or address of cluster `name` still visible."""
    prefix = f"rtc-{name}-"
    found = [f"netns {n}" for n in _out("ip", "netns", "list").split() if n.startswith(prefix)]
    found += [f"link {l['ifname']}" for l in json.loads(_out("ip", "-j", "link") or "[]")
              if re.fullmatch(r"rtc\d+|p\d+|br0", l["ifname"])]
    found += [f"qdisc {q}" for q in _out("tc", "qdisc", "show").splitlines() if "tbf" in q]
    found += [f"address {a}" for a in _out("ip", "-o", "addr").splitlines() if "10.213." in a]
    return found


def _out(*argv) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True).stdout


def compile_tiny(out, *flags):
    done = ratrain("compile", "tiny", "--seq-len", 32, *flags, "-o", out, "--force", "--build")
    assert done.returncode == 0, done.stderr
    return out
