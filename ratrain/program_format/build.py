"""Build generated Cython into an extension module, cached by content hash: the key covers
the source, ratrain/kernels.pxd, and the Cython and Python versions, so an unchanged
program never rebuilds. Built modules live only in the per-user cache (RATRAIN_CACHE,
default ~/.cache/ratrain, its build/ made 0700), which programs with the same generated
code share; a module is loaded only from a file there that this user owns and no one
else may write (NOTE [a program directory is data], rt/program.py).
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

import Cython

from ratrain.program_format.codec import HEADER
from ratrain.settings import cache_root

# NOTE [one build per code]: a generated module's first line names the model file it was
# compiled from (codec.HEADER), which nothing it compiles to depends on; the key leaves that
# line out (the line count kept, so a traceback's line numbers hold), and programs of one
# model and layout compiled in different places, or from copies of one config, share one
# build. Each build costs seconds (Cython about 2 s and the C compiler about 2 s for a
# tiny model's stage on 2 vCPUs) and stays in the cache; keyed by the whole text, every
# test's program was built anew, once per directory it was compiled into.


class BuildError(RuntimeError):
    """The generated module did not compile; the message holds the compiler's output."""


class CacheError(BuildError):
    """The build cache is not this user's own; the message is one line saying what to do."""


class BuildCancelled(BuildError):
    """The build was called off (`cancel` set) before it finished; nothing was cached."""


def _package_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _pxd() -> Path:
    return Path(__file__).resolve().parents[1] / "kernels.pxd"


def build_key(source: str) -> str:
    """What a built module is cached under: `source` without its provenance header (NOTE
    [one build per code]), kernels.pxd, and the Cython and Python versions."""
    first, newline, rest = source.partition("\n")
    if first.startswith(f"# {HEADER}"):
        source = newline + rest
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


def _compile(source: str, name: str, into: Path, cancel: threading.Event | None) -> Path:
    """Cythonize and compile in a scratch directory; move the .so and .pyx into `into`.
    `cancel`: when set, the compiler (its whole process group) is killed and
    BuildCancelled raised."""
    with tempfile.TemporaryDirectory(prefix="ratrain-build-") as scratch:
        work = Path(scratch)
        (work / f"{name}.pyx").write_text(source)
        (work / "setup.py").write_text(_SETUP.format(name=name, root=str(_package_root())))
        returncode, out = _run_setup(work, cancel)
        built = _built(work, name)
        if returncode != 0 or built is None:
            raise BuildError(f"building generated module {name} failed:\n{out[-8000:]}")
        into.mkdir(parents=True, exist_ok=True)
        partial = into / f"{built.name}.{os.getpid()}.tmp"
        shutil.copy2(built, partial)
        os.chmod(partial, 0o755)  # whatever the umask: check_owned refuses group-writable
        os.replace(partial, into / built.name)
        return into / built.name


def _run_setup(work: Path, cancel: threading.Event | None) -> tuple[int, str]:
    """(exit code, output) of the scratch directory's setup.py, in a session of its own
    so that a cancel kills the C compiler it started too."""
    proc = subprocess.Popen([sys.executable, "setup.py"], cwd=work, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    while True:
        try:
            out, _ = proc.communicate(timeout=0.05)
            return proc.returncode, out
        except subprocess.TimeoutExpired:
            if cancel is not None and cancel.is_set():
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise BuildCancelled("the build was cancelled") from None


def build_module(source: str, cancel: threading.Event | None = None) -> Path:
    """Path of the compiled module for `source` in the user cache, built when missing (the
    ranks of one job build it once); `cancel`: see _compile."""
    key = build_key(source)
    name, root = module_name(key), private_dir(user_cache())
    with _locked(root / f"{key[:20]}.lock"):
        found = _built(root / key[:20], name)
        if found is None:
            if cancel is not None and cancel.is_set():
                raise BuildCancelled("the build was cancelled")
            found = _compile(source, name, private_dir(root / key[:20]), cancel)
    return found


def build_all(sources, cancel: threading.Event | None = None) -> None:
    """Build the distinct `sources` into the user cache, two at a time (as the ranks of a
    two-stage job would); the first BuildError (or CacheError) raised; `cancel`: see
    _compile."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        list(pool.map(lambda source: build_module(source, cancel), sorted(set(sources))))


@contextmanager
def built_beside(sources):
    """build_all(`sources`) in a thread while the body runs (NOTE [build beside the
    check], cli/train.py); wait for it when the body returns, cancel it (the compilers
    killed, nothing cached) when it raises. A build that fails is left to the ranks,
    which build the same sources and say why."""
    cancel = threading.Event()

    def build():
        try:
            build_all(sources, cancel)
        except BuildError:
            pass
    thread = threading.Thread(target=build, name="ratrain-build", daemon=True)
    thread.start()
    try:
        yield
    except BaseException:
        cancel.set()
        raise
    finally:
        thread.join()


def private_dir(path: Path) -> Path:
    """`path`, made 0700 if missing; a CacheError unless it is a directory (not a link)
    that this user owns and no one else may write."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_owned(path)
    return path


def check_owned(path: Path) -> None:
    """A CacheError unless `path` is owned by this user, not a link, and not writable by
    group or others: what the runtime imports must be what this user built."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise CacheError(f"the build cache {path} is not private to this user (owner uid "
                         f"{info.st_uid}, mode {stat.filemode(info.st_mode)}): remove it, "
                         "or set RATRAIN_CACHE to a directory of your own")


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
    """Import a built module from its file in the user cache (its name carries the content
    key); the file and its directories up to the cache must be this user's own."""
    for part in (path, path.parent, path.parent.parent):
        check_owned(part)
    import ratrain.kernels  # noqa: F401  (the C-API table generated code calls through)
    name = path.name.split(".")[0]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module
