"""The book as a reader meets it: prose before every block, code lines that fit."""

import importlib.util
import shutil
import subprocess
import re
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parent.parent
BOOK = CHECKOUT / "mlplcode.org"

# The widest a line of code in the book may be: what the PDF and a laptop's
# web page show unwrapped at the book's code size.
WIDTH = 88

# Lines that may stand between a block's prose and the block itself.
AFFILIATED = re.compile(r"#\+(name|header|caption|attr_\w+|results)\b", re.I)

# Blocks that may follow a heading or another block directly, by the first
# line of their body, each with why.
WITHOUT_PROSE = {}


@pytest.fixture(scope="module")
def book():
    spec = importlib.util.spec_from_file_location("tangle", CHECKOUT / "tangle" / "tangle.py")
    tangler = importlib.util.module_from_spec(spec)
    sys.modules["tangle"] = tangler
    spec.loader.exec_module(tangler)
    return tangler.open_book(str(BOOK))


def line_above(lines, block):
    """The nearest line above BLOCK that is neither blank nor one of its keywords."""
    k = block.line - 1
    while k > 0 and (not lines[k - 1].strip() or AFFILIATED.match(lines[k - 1].strip())):
        k -= 1
    return lines[k - 1] if k > 0 else ""


def is_prose(line):
    text = line.strip()
    return bool(text) and not (
        line.startswith("*") or text.startswith("#+") or re.fullmatch(r":\w*:.*", text)
    )


def first_line(block):
    return next((line.strip() for line in block.raw_lines if line.strip()), "")


def test_every_block_has_prose_before_it(book):
    lines = book.doc.lines
    bare = [
        f"mlplcode.org:{block.line}: {first_line(block)[:60]} (after {line_above(lines, block)[:40]!r})"
        for block in book.doc.blocks
        if not is_prose(line_above(lines, block)) and first_line(block) not in WITHOUT_PROSE
    ]
    assert bare == [], f"{len(bare)} blocks with no prose before them:\n" + "\n".join(bare)


def test_the_exceptions_are_still_blocks_of_the_book(book):
    firsts = {first_line(block) for block in book.doc.blocks}
    assert set(WITHOUT_PROSE) <= firsts


def test_no_line_of_code_is_wider_than_the_page(book):
    wide = [
        f"mlplcode.org:{block.body_line + k}: {len(line)} columns"
        for block in book.doc.blocks
        for k, line in enumerate(block.raw_lines)
        if len(line.rstrip("\n")) > WIDTH
    ]
    assert wide == [], f"{len(wide)} lines over {WIDTH} columns:\n" + "\n".join(wide)


# The functions a step and a run go through, which Part I must define: the loop
# read in one sitting, with nothing of it left for later Parts.
MAIN_LINE = (
    "step", "judge", "carry_out", "conclude", "decide", "parse_action",
    "build_context", "authorize", "guard", "apply", "fold", "append_event",
    "read_file", "execute", "advance", "drive",
)


def part_of(book, heading):
    """The Part (level-1 heading) that HEADING lies in."""
    while heading is not None and heading.level > 1:
        heading = heading.parent
    return heading.title if heading else ""


def test_part_one_defines_every_function_of_the_main_line(book):
    where = {}
    for block in book.doc.blocks:
        for line in block.raw_lines:
            match = re.match(r"\s*def (\w+)\(", line)
            if match and match.group(1) in MAIN_LINE:
                where.setdefault(match.group(1), set()).add(part_of(book, block.heading))
    missing = [name for name in MAIN_LINE if "Part I: The loop" not in where.get(name, ())]
    assert missing == []


# A chapter or section named in the prose, as the book writes one: chapter "The
# journal", section "Paths", chapters "A" and "B".
REFERENCE = re.compile(r'\b(?:[Cc]hapter|[Ss]ection)s?\s+"[^"]+"')
VERBATIM = re.compile(r'(?<![^\s(\[{"\'])([=~])(?=\S)(.*?\S)?\1(?=[\s.,;:!?)\]}"\'-]|$)', re.S)
LINK = re.compile(r"\[\[.*?\]\]", re.S)


def prose_paragraphs(book):
    """Each paragraph of prose (not a block, heading, drawer, keyword or table), with
    the number of its first line."""
    paragraph, first, inside = [], 0, False
    for number, line in enumerate(book.doc.lines + [""], 1):
        text = line.strip()
        if re.match(r"#\+(begin|end)_", text, re.I):
            inside = text[2:7].lower() == "begin"
        if inside or not text or text[0] in "*#|:":
            if paragraph:
                yield first, "\n".join(paragraph)
            paragraph = []
            continue
        if not paragraph:
            first = number
        paragraph.append(line)


def test_every_chapter_and_section_the_prose_names_is_a_link(book):
    plain = []
    for first, text in prose_paragraphs(book):
        covered = [m.span() for m in VERBATIM.finditer(text)] + [m.span() for m in LINK.finditer(text)]
        for match in REFERENCE.finditer(text):
            a, b = match.span()
            if not any(x < b and a < y for x, y in covered):
                plain.append(f"mlplcode.org:{first + text[:a].count(chr(10))}: {match.group(0)}")
    assert plain == [], f"{len(plain)} references that are plain text:\n" + "\n".join(plain)


def test_an_edit_inside_a_chunk_that_part_two_fills_is_detangled_into_part_two(tmp_path):
    """resolve_path's refusal of a misleading path is a chunk used at an indentation in
    Part I and written in Part II: edited in the tangled file, it goes back to Part II."""
    for name in ("mlplcode.org", ".mlplcode.org.tangle.json"):
        shutil.copy(CHECKOUT / name, tmp_path / name)
    for name in ("src", "tangle"):
        shutil.copytree(CHECKOUT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    paths = tmp_path / "src" / "mlplcode" / "tools" / "paths.py"
    old = '\n            " give a path relative to the project root"\n'  # 4 of the 12 spaces: the prefix
    assert paths.read_text().count(old) == 1
    paths.write_text(paths.read_text().replace(old, old.replace("project root", "project's root")))
    tangler = [sys.executable, str(tmp_path / "tangle" / "tangle.py")]
    done = subprocess.run(tangler + ["--detangle", "mlplcode.org"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    before = (CHECKOUT / "mlplcode.org").read_text().splitlines()
    after = (tmp_path / "mlplcode.org").read_text().splitlines()
    changed = [k for k, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(before) == len(after) and len(changed) == 1
    assert after[changed[0]] == '        " give a path relative to the project\'s root"'  # without the prefix
    part_two = before.index("* Part II: Holding the line")
    assert changed[0] > part_two and before.index("* Part III: Stepping it by hand") > changed[0]
    check = subprocess.run(tangler + ["--check", "mlplcode.org"], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
