"""Suite-wide test plumbing: the one way golden files are compared and rewritten, and the
profile every test reads where no --hw is given. (The tiny model configs tests share are
tests/tiny_model.py's: this directory is on sys.path, so any test imports it.)

`pytest --update-goldens` (or RATRAIN_UPDATE_GOLDEN=1) rewrites every golden file a test
compares with; without it a mismatch fails and prints the actual text to review.
"""
import os
from pathlib import Path

import pytest

# The shipped cpu profile stands for this machine in every test (NOTE [this machine's
# profile]): the numbers tests assert are then the same on every machine, and no test
# runs a quick calibration. tests/hw/test_this_machine.py unsets it to test the choice.
os.environ["RATRAIN_DEFAULT_HW"] = "cpu"


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite the golden files with the text the tests produce")


def golden_text(actual: str) -> str:
    """What a golden file holds for `actual`: the text, ending in exactly one newline."""
    return actual.rstrip("\n") + "\n"


def assert_golden(path: Path, actual: str, update: bool = False) -> None:
    """`actual` equals the golden file `path` (compared as golden_text); with `update` the
    file is rewritten first, so the comparison passes and `git diff` shows the change."""
    path = Path(path)
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(golden_text(actual))
    assert path.exists(), f"no golden file {path}; create it with --update-goldens"
    expected = path.read_text()
    assert golden_text(actual) == expected, (
        f"text differs from golden {path.name}; review it and rerun with --update-goldens "
        f"if the change is intended. actual:\n{actual}")


@pytest.fixture
def golden(request):
    """golden(path, actual): assert_golden, rewriting under --update-goldens or the older
    RATRAIN_UPDATE_GOLDEN=1."""
    update = (request.config.getoption("--update-goldens")
              or os.environ.get("RATRAIN_UPDATE_GOLDEN") == "1")
    return lambda path, actual: assert_golden(path, actual, update)
