"""The program format's JSON read as untrusted input (NOTE [a program directory is data],
rt/program.py): each field's type and range is checked where the codec reads it, and a
bad one is one FormatError line naming the file, the field and the fix.

The readers pass a `Path` of where they are (`rows[3].steps[0].offsets[2]`) to the
helpers below; every helper returns the value it checked or raises FieldError, which the
codec turns into FormatError with the file's name.
"""
from __future__ import annotations

import math
import re


class FormatError(ValueError):
    """A program file that does not hold what the format says; one line naming it."""


class FieldError(ValueError):
    """A field that is not what the format says; `path` names it within its file."""

    def __init__(self, path: str, what: str):
        super().__init__(f"{path} {what}")
        self.path, self.what = path, what


def refused(where: str, e: FieldError) -> FormatError:
    """The one line of a bad field of file `where`."""
    return FormatError(f"{where}: {e.path} {e.what}; recompile the program")


# Integers the format holds (offsets, sizes, counts) stay below this: numpy takes them,
# and no product of two of them overflows int64 (a sanity bound, not a memory limit).
LARGEST = 2 ** 48
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
COMMENT_LIMIT = 400                      # characters of one comment line
PRINTABLE = re.compile(r"[ -~]*")        # printable ASCII: no line break can hide in it


def at(path: str, key) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key


def field(d, key: str, path: str):
    """d[key] of a JSON object."""
    if not isinstance(d, dict):
        raise FieldError(path or "the file", f"must be a JSON object, got {_shown(d)}")
    if key not in d:
        raise FieldError(at(path, key), "is missing")
    return d[key]


def integer(value, path: str, low: int = 0, high: int = LARGEST) -> int:
    if type(value) is not int or not low <= value <= high:
        raise FieldError(path, f"must be an integer in [{low}, {high}], got {_shown(value)}")
    return value


def optional_integer(value, path: str, low: int = 0, high: int = LARGEST) -> int | None:
    return None if value is None else integer(value, path, low, high)


def integers(value, path: str, low: int = 0, high: int = LARGEST) -> tuple[int, ...]:
    """A list of integers in [low, high] (checked at once; the bad one named if any)."""
    values = listed(value, path)
    if not all(type(v) is int and low <= v <= high for v in values):
        for i, v in enumerate(values):
            integer(v, at(path, i), low, high)
    return tuple(values)


def number(value, path: str) -> float | int:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise FieldError(path, f"must be a finite number, got {_shown(value)}")
    return value


def listed(value, path: str, length: int | None = None) -> list:
    if not isinstance(value, list) or length is not None and len(value) != length:
        size = "" if length is None else f" of {length}"
        raise FieldError(path, f"must be a list{size}, got {_shown(value)}")
    return value


def text(value, path: str, limit: int = COMMENT_LIMIT) -> str:
    """A string the generated code may show in a comment: one line of printable ASCII."""
    if not isinstance(value, str) or len(value) > limit or not PRINTABLE.fullmatch(value):
        raise FieldError(path, f"must be one line of at most {limit} printable ASCII "
                         f"characters, got {_shown(value)}")
    return value


def name(value, path: str) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise FieldError(path, f"must be a name (letters, digits, _), got {_shown(value)}")
    return value


def one_of(value, path: str, choices) -> str:
    """`value`, one of `choices`; a list or object (from a hand-edited table) is none of
    them, and is not looked up: it cannot be hashed."""
    if not isinstance(value, (str, int, float, bool)) or value not in choices:
        shown = ", ".join(sorted(map(str, choices)))
        raise FieldError(path, f"must be one of {shown}, got {_shown(value)}")
    return value


def shape(value, path: str) -> tuple[int, ...]:
    dims = integers(value, path)
    if len(dims) > 8 or math.prod(dims) > LARGEST:
        raise FieldError(path, f"is not a tensor shape the format makes, got {list(dims)}")
    return dims


def param_value(value, path: str, depth: int = 0):
    """A call's parameter: a number, bool, None, a short printable string, or a list of
    those (the lowered calls' params, written with JSON lists for tuples)."""
    if value is None or type(value) in (bool, int):
        return integer(value, path, -LARGEST, LARGEST) if type(value) is int else value
    if type(value) is float:
        return number(value, path)
    if isinstance(value, str):
        return text(value, path, 200)
    if isinstance(value, list) and depth < 3 and len(value) <= 4096:
        return tuple(param_value(v, at(path, i), depth + 1) for i, v in enumerate(value))
    raise FieldError(path, f"must be a number, text or a list of them, got {_shown(value)}")


def params(value, path: str) -> tuple:
    pairs = []
    for i, pair in enumerate(listed(value, path)):
        key, v = listed(pair, at(path, i), 2)
        pairs.append((name(key, at(at(path, i), 0)), param_value(v, at(at(path, i), 1))))
    return tuple(pairs)


def _shown(value) -> str:
    shown = ascii(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."
