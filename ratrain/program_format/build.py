"""Build generated Cython into an extension module, cached by content hash: the key covers
the source, ratrain/kernels.pxd, and the Cython and Python versions, so an unchanged
program never rebuilds. Built modules live in the program directory (build/<key>/) and in
a per-user cache (RATRAIN_CACHE, default ~/.cache/ratrain) that programs with the same
generated code share.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from contextlib import contextmanager
from pathlib import Path

import Cython

from ratrain.settings import cache_root


class BuildError(RuntimeError):
    """The generated module did not compile; the message holds the compiler's output."""


def _package_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _pxd() -> Path:
    return Path(__file__).resolve().parents[1] / "kernels.pxd"


def build_key(source: str) -> str:
    digest = hashlib.sha256(source.encode())
    digest.update(_pxd().read_bytes())
    digest.update(f"{Cython.__version__} {sys.version} {sysconfig.get_platform()}".encode())
    return digest.hexdigest()


def module_name(key: str) -> str:
    return f"rtprog_{key[:20]}"


def _built(directory: Path, name: str) -> Path | None:
    found = sorted(directory.glob(f"{name}*{sysconfig.get_config_var('EXT_SUFFIX')}"))
    return found[0] if found else None


def user_cache() -> Path:
    return cache_root() / "build"


_SETUP = """\
from setuptools import Extension, setup
from Cython.Build import cythonize
setup(ext_modules=cythonize([Extension({name!r}, [{name!r} + ".pyx"],
                                       extra_compile_args=["-O2", "-Wno-unused-function"])],
                            include_path=[{root!r}], quiet=True),
      script_args=["build_ext", "--inplace", "-q"])
"""


def _compile(source: str, name: str, into: Path) -> Path:
    """Cythonize and compile in a scratch directory; move the .so and .pyx into `into`."""
    with tempfile.TemporaryDirectory(prefix="ratrain-build-") as scratch:
        work = Path(scratch)
        (work / f"{name}.pyx").write_text(source)
        (work / "setup.py").write_text(_SETUP.format(name=name, root=str(_package_root())))
        done = subprocess.run([sys.executable, "setup.py"], cwd=work, capture_output=True,
                              text=True)
        built = _built(work, name)
        if done.returncode != 0 or built is None:
            raise BuildError(f"building generated module {name} failed:\n"
                             f"{done.stdout[-4000:]}{done.stderr[-4000:]}")
        into.mkdir(parents=True, exist_ok=True)
        partial = into / f"{built.name}.{os.getpid()}.tmp"
        shutil.copy2(built, partial)
        os.replace(partial, into / built.name)
        return into / built.name


def build_module(source: str, directory: Path) -> Path:
    """Path of the compiled module for `source` under `directory`/build/<key>/, built (or
    copied from the user cache) when missing."""
    key = build_key(source)
    name, here = module_name(key), directory / "build" / key[:20]
    found = _built(here, name)
    if found is not None:
        return found
    with _locked(user_cache() / f"{key[:20]}.lock"):  # ranks of one job build it once
        cached = _built(user_cache() / key[:20], name)
        if cached is None:
            cached = _compile(source, name, user_cache() / key[:20])
    here.mkdir(parents=True, exist_ok=True)
    partial = here / f"{cached.name}.{os.getpid()}.tmp"
    shutil.copy2(cached, partial)
    os.replace(partial, here / cached.name)
    return here / cached.name


@contextmanager
def _locked(path: Path):
    """An exclusive lock file (flock): other processes wait until the holder is done."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_module(path: Path):
    """Import a built module from its file (its name carries the content key)."""
    import ratrain.kernels  # noqa: F401  (the C-API table generated code calls through)
    name = path.name.split(".")[0]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module
