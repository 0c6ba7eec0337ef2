"""Notes are checked as GHC's lint-notes checks them; the rule is DESIGN.md section 10's.

A heading is the note's name in brackets after NOTE, then a colon, not after "see"; it
opens its line (after indentation and a comment marker or a docstring's quotes) and is
written once, where the reasoning lives. Every other mention is a reference: "see" before
it, or no colon after it. Every reference names a heading and every heading is referenced.
A name may wrap onto the next line of its comment, docstring or string literal; in
Markdown, code spans and blocks quote the syntax and hold no mentions.
"""
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("ratrain", "native", "tests", "bench", "docs", "README.md", "setup.py")
SUFFIXES = {".py", ".pyx", ".pxd", ".pxi", ".c", ".h", ".md", ".json"}
MENTION = re.compile(r"(see\s+)?NOTE\s+\[([^\]]{1,200})\](:?)", re.IGNORECASE)
# what a name's line break carries with it: a string literal closed and reopened, the
# next line's indentation and comment marker
WRAP = re.compile(r"""["']?\s*\n\s*(?:#|//|\*(?!/))?\s*(?:[rbf]?["'])?""")
LINE_OPENER = re.compile(r'\s*(?:#|//|/\*|\*|[rbf]?"""|[rbf]?\'\'\')?\s*')
MARKDOWN_CODE = re.compile(r"`[^`]*`")


def note_name(raw: str) -> str:
    """The name as written once unwrapped: `raw` with its line breaks (and the comment
    markers and string quotes around them) joined by one space, or by none after a
    hyphen."""
    return re.sub(r"- ", "-", " ".join(WRAP.sub(" ", raw).split()))


def mentions(text: str):
    """(name, is heading?, line, opens its line?) of every mention in `text`."""
    for m in MENTION.finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        yield (note_name(m.group(2)), bool(m.group(3)) and not m.group(1),
               text.count("\n", 0, m.start()) + 1,
               bool(LINE_OPENER.fullmatch(text[start:m.start()])))


def unquoted(path, text: str) -> str:
    """`text` with Markdown's code spans and blocks blanked (newlines kept)."""
    if Path(path).suffix != ".md":
        return text
    return MARKDOWN_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def scan(files) -> tuple[dict, dict, list]:
    """headings: name -> [where]; references: name -> [where]; and where a heading does
    not open its line. `files` are (path, text); where is 'path:line'."""
    headings, references, buried = {}, {}, []
    for path, text in files:
        for name, heading, line, opens in mentions(unquoted(path, text)):
            (headings if heading else references).setdefault(name, []).append(f"{path}:{line}")
            if heading and not opens:
                buried.append(f"{path}:{line}: NOTE [{name}]: does not open its line")
    return headings, references, buried


def problems(headings: dict, references: dict, buried: list) -> list[str]:
    """Every broken reference, duplicate heading, unreferenced note and heading in the
    middle of a line, one line each."""
    out = [f"{w}: NOTE [{n}] has no heading" for n, ws in references.items()
           if n not in headings for w in ws]
    out += [f"NOTE [{n}] has {len(ws)} headings: {', '.join(ws)}"
            for n, ws in headings.items() if len(ws) > 1]
    out += [f"{ws[0]}: NOTE [{n}] is referenced from nowhere"
            for n, ws in headings.items() if n not in references]
    return sorted(out + buried)


def _files():
    me = Path(__file__).resolve()
    for source in SOURCES:
        top = ROOT / source
        for path in sorted([top] if top.is_file() else top.rglob("*")):
            if path.suffix in SUFFIXES and path.is_file() and path != me and \
                    "__pycache__" not in path.parts and "build" not in path.parts:
                yield path.relative_to(ROOT), path.read_text(errors="replace")


def test_every_note_has_one_heading_and_every_reference_names_one():
    found = problems(*scan(_files()))
    assert found == [], "\n".join(found)


def test_the_checker_finds_each_kind_of_defect():
    files = [("a.py", "# NOTE [kept]: why.\nx = 1  # see NOTE [kept]: here, because\n"
                      "# NOTE [twice]: one.\n# NOTE [twice]: two.\n# (NOTE [twice])\n"
                      "# NOTE [alone]: nobody cites it.\n"),
             ("b.py", '"""Uses NOTE [missing] and NOTE [kept\n    ]. NOTE [inline]: no."""\n'),
             ("c.md", "Quoted: `NOTE [quoted]:`. Cited: NOTE [inline].\n")]
    assert problems(*scan(files)) == [
        "NOTE [twice] has 2 headings: a.py:3, a.py:4",
        "a.py:6: NOTE [alone] is referenced from nowhere",
        "b.py:1: NOTE [missing] has no heading",
        "b.py:2: NOTE [inline]: does not open its line"]


def test_a_name_wraps_across_comment_lines_and_string_literals():
    text = ('# see NOTE [a long\n#   name] here\nhelp = ("see NOTE [a long "\n'
            '        "name]")\n"""see NOTE [a\n    long name]"""\n# NOTE [model-\n# sized]\n')
    assert Counter(n for n, *_ in mentions(text)) == {"a long name": 3, "model-sized": 1}
