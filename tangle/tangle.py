#!/usr/bin/env python3
"""Tangle an Org file into source files, byte for byte as Emacs does.

This file is tangled from mlplcode.org (chapter "The tangler"); edit the
book, not this file, or edit this file and run --detangle.
"""

import argparse
import bisect
import difflib
import hashlib
import itertools
import json
import os
import re
import stat
import sys
import unicodedata
from dataclasses import dataclass, field

class Refusal(Exception):
    """A construct we will not tangle, located at FILE:LINE."""

    def __init__(self, path, line, reason):
        super().__init__(f"{path}:{line}: {reason}")
        self.path, self.line, self.reason = path, line, reason

@dataclass
class Heading:
    line: int
    level: int
    title: str | None
    tags: tuple
    parent: "Heading | None"
    commented: bool
    archived: bool
    properties: list = field(default_factory=list)
    block_count: int = 0

@dataclass
class Block:
    line: int
    language: str
    arguments: str
    headers: list
    name: str | None
    name_line: int | None
    heading: Heading | None
    number: int
    body_line: int
    raw_lines: list
    target: str | None
    name_hidden_by: int | None

@dataclass(frozen=True)
class Layout:
    bom: str
    newline: str

@dataclass
class Document:
    path: str
    lines: list
    layout: Layout
    blocks: list = field(default_factory=list)
    headings: list = field(default_factory=list)
    keyword_properties: list = field(default_factory=list)
    file_properties: list = field(default_factory=list)
    hidden_names: dict = field(default_factory=dict)

BOM = "\ufeff"


def read_org(path, data=None):
    """The lines of an Org file (DATA, or the file at PATH) as Emacs reads them, and its
    Layout."""
    if data is None:
        with open(path, "rb") as f:
            data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise Refusal(
            path,
            line,
            f"byte 0x{data[error.start]:02X} is not UTF-8; Emacs "
            "would guess another encoding: save the file as UTF-8",
        )
    bom = BOM if text.startswith(BOM) else ""
    text = text[len(bom) :]
    if "\0" in text:
        raise Refusal(
            path,
            text[: text.index("\0")].count("\n") + 1,
            "a NUL character: Emacs reads the file as binary",
        )
    newline = line_end(path, text)
    return text.split(newline), Layout(bom, newline)

def line_end(path, text):
    """The one line end that TEXT uses, as Emacs detects it; refuse a mix."""
    if "\r" not in text:
        return "\n"
    ends = re.finditer(r"\r\n|\r|\n", text)
    first = next(ends, None)
    if first is None:
        return "\n"
    for number, end in enumerate(ends, 2):
        if end.group() != first.group():
            raise Refusal(
                path,
                number,
                "this line ends differently from line 1 "
                "(\\r\\n, \\n or \\r): Emacs then keeps each \\r as part of "
                "its line; use one kind of line end",
            )
    return first.group()

ODD_BLANK = re.compile(
    "[\v\f\x1c-\x1f\x85\xa0\u1680\u2000-\u200b\u2028\u2029\u202f\u205f\u3000\ufeff]"
)
EMACS_BLANKS = " \t\f\xa0\u2000-\u200b\u202f\u205f\u3000"
HEADER_ODD_BLANK = re.compile("[\v\f\x1c-\x1f\x85\u2028\u2029\ufeff]")


def check_blanks(path, number, line, arguments=None):
    """Refuse a structural line holding a blank other than space and tab; from index
    ARGUMENTS on, where header arguments are, only control characters."""
    odd = ODD_BLANK.search(line, 0, len(line) if arguments is None else arguments)
    if not odd and arguments is not None:
        odd = HEADER_ODD_BLANK.search(line, arguments)
    if odd:
        name = unicodedata.name(odd.group(), "a control character")
        raise Refusal(
            path,
            number,
            f"{name} (U+{ord(odd.group()):04X}) in a line Org parses: "
            "Org's patterns take it for a blank in some places and not in others; "
            "write a space",
        )

HEADING = re.compile(r"\*+ ")
BEGIN_SRC = re.compile(
    rf"[ \t]*#\+begin_src(?![^{EMACS_BLANKS}])(?: +([^ \t]+))?(.*)", re.I
)
END_SRC = re.compile(r"[ \t]*#\+end_src[ \t]*", re.I)
BEGIN_RAW = re.compile(
    rf"[ \t]*#\+begin_(example|export|comment|verse)(?![^{EMACS_BLANKS}])", re.I
)
BEGIN_LATEX = re.compile(r"[ \t]*\\begin\{([A-Za-z0-9*]+)\}", re.I)
KEYWORD = re.compile(r"[ \t]*#\+([^ \t]*):[ \t]*(.*)")
PROPERTY_LINE = re.compile(r"[ \t]*:([^ \t]+):(?:([ \t]+)(.*?))?[ \t]*")
PROPERTIES_START = re.compile(r"[ \t]*:PROPERTIES:[ \t]*", re.I)
DRAWER_END = re.compile(r"[ \t]*:END:[ \t]*", re.I)
NAME_LINE = re.compile(r"[ \t]*#\+name:[ \t]*(.*?)[ \t]*$", re.I)

MAY_BE_STRUCTURE = re.compile(r"[ \t]*[*#:\\]")
MAY_BE_KEYWORD = re.compile(r"[ \t]*#")

AFFILIATED = re.compile(
    r"[ \t]*#\+(?:(CAPTION|RESULTS)(?:\[.*\])?"
    r"|(DATA|HEADERS?|LABEL|NAME|PLOT|RESNAME|RESULT|SOURCE|SRCNAME|TBLNAME)"
    r"|(ATTR_[-_A-Za-z0-9]+)):[ \t]*(.*?)[ \t]*",
    re.I,
)
OLD_NAMES = ("data", "label", "resname", "source", "srcname", "tblname")

COMPLEX_HEADING = re.compile(
    r"(\*+)(?: +(?:TODO|DONE))?(?: +\[#.\])?(?: +(.*?))??"
    r"(?:[ \t]+(:[^ \t]+:))?[ \t]*"
)
UNTAGGED_HEADING = re.compile(
    r"(\*+)(?: +(?:TODO|DONE))?(?: +\[#.\])?(?: +(.*?))??()[ \t]*"
)

ALNUM_CATEGORIES = {"Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nl", "Nd"}


def is_tag_text(text):
    """Whether TEXT (colons included) matches Org's [[:alnum:]_@#%:]+ as Emacs reads
    it."""
    return all(
        ch in ":_@#%"
        or (
            ch.isalnum()
            if ch.isascii()
            else unicodedata.category(ch) in ALNUM_CATEGORIES
        )
        for ch in text
    )

def parse_heading(number, line, parent):
    m = COMPLEX_HEADING.fullmatch(line)
    if m.group(3) and not is_tag_text(m.group(3)):
        m = UNTAGGED_HEADING.fullmatch(line)
    level, title = len(m.group(1)), m.group(2)
    tags = tuple(t for t in (m.group(3) or "").split(":") if t)
    while parent and parent.level >= level:
        parent = parent.parent
    return Heading(
        line=number,
        level=level,
        title=title,
        tags=tags,
        parent=parent,
        commented=bool(title and re.match(r"COMMENT(?: |$)", title))
        or bool(parent and parent.commented),
        archived="ARCHIVE" in tags or bool(parent and parent.archived),
    )

def parse_document(path, data=None):
    """Split an Org file into headings, property drawers and src blocks."""
    lines, layout = read_org(path, data)
    check_file_variables(path, lines)
    doc = Document(path, lines, layout)
    heading, open_ends = None, []
    i = read_file_drawer(doc)
    while i < len(lines):
        line, number = lines[i], i + 1
        if not MAY_BE_STRUCTURE.match(line):
            i += 1
            continue
        open_ends = [end for end in open_ends if end > i]
        limit = min(open_ends, default=None)
        if HEADING.match(line):
            heading = parse_heading(number, line, heading)
            doc.headings.append(heading)
            open_ends = []
            i = read_property_drawer(
                path, lines, after_planning(lines, i + 1), heading.properties
            )
        elif m := BEGIN_RAW.match(line):
            end = re.compile(rf"[ \t]*#\+end_{m.group(1)}[ \t]*", re.I)
            i = skip_raw(doc, i, i + 1, end.fullmatch, f"#+begin_{m.group(1)}", limit)
        elif (m := BEGIN_LATEX.match(line)) and (
            end := latex_end(lines, i, m.group(1), limit)
        ):
            i = skip_raw(doc, i, i, end.search, f"\\begin{{{m.group(1)}}}", limit)
        elif BEGIN_SRC.match(line):
            block, i = read_block(doc, i, heading, limit)
            doc.blocks.append(block)
        else:
            if (end := container_end(lines, i)) is not None:
                open_ends.append(end)
            if m := KEYWORD.fullmatch(line):
                check_keyword(doc, number, m.group(1).lower(), m.group(2).strip(" \t"))
            elif PROPERTIES_START.fullmatch(line):
                raise Refusal(
                    path,
                    number,
                    "Org reads a property drawer only right under a "
                    "heading or at the very top of the file (after # comment lines)",
                )
            i += 1
    first_heading_drawer(path, doc.headings)
    return doc

def first_heading_drawer(path, headings):
    """Refuse header-args in the drawer of a heading on line 1: Org 9.5 applies them
    file-wide."""
    if headings and headings[0].line == 1:
        for line, key, _ in headings[0].properties:
            if key.lower().startswith("header-args"):
                raise Refusal(
                    path,
                    line,
                    "a heading on line 1 makes Org 9.5 apply its "
                    "header-args to the whole file; put a line such as #+TITLE first",
                )

def read_file_drawer(doc):
    """Read a property drawer at the top of the file; return the index of the line after
    it."""
    i = 0
    while i < len(doc.lines) and re.match(r"[ \t]*#(?: |$)", doc.lines[i]):
        i += 1
    return read_property_drawer(doc.path, doc.lines, i, doc.file_properties)

def after_planning(lines, i):
    """Line index I, or the one after it when I is a heading's planning line."""
    if i < len(lines) and re.match(
        r"[ \t]*(SCHEDULED|DEADLINE|CLOSED):", lines[i], re.I
    ):
        return i + 1
    return i

def read_property_drawer(path, lines, i, properties):
    """Collect the :PROPERTIES: drawer at line index I into PROPERTIES; return the next
    index."""
    if i >= len(lines) or not PROPERTIES_START.fullmatch(lines[i]):
        return i
    for j in range(i + 1, len(lines)):
        if DRAWER_END.fullmatch(lines[j]):
            return j + 1
        if HEADING.match(lines[j]):
            break
        check_blanks(path, j + 1, lines[j])
        m = PROPERTY_LINE.fullmatch(lines[j])
        if not m:
            raise Refusal(
                path,
                j + 1,
                "malformed line in property drawer (Org would ignore the drawer)",
            )
        key, blank, value = m.group(1), m.group(2), m.group(3)
        if value and not blank.startswith(" "):
            raise Refusal(
                path,
                j + 1,
                f"a tab after :{key}: makes Org 9.5 ignore the whole "
                "drawer; write a space",
            )
        if key.lower().startswith("header-args"):
            check_header_args_property(path, j + 1, key, value)
        properties.append((j + 1, key, value or ""))
    raise Refusal(path, i + 1, "property drawer without :END: (Org reads it as text)")

def check_header_args_property(path, number, key, value):
    """Refuse a header-args property without a value."""
    if not value:
        raise Refusal(
            path, number, f"{key} without a value (Org versions treat it differently)"
        )

def skip_raw(doc, i, first, closes, what, limit):
    """Skip the element opened at line index I, from line FIRST to the line CLOSES
    accepts; return the next index."""
    open_src = None
    for j in range(first, len(doc.lines)):
        line = doc.lines[j]
        if closes(line):
            if open_src is not None:
                raise Refusal(
                    doc.path, open_src, f"#+begin_src without #+end_src inside {what}"
                )
            check_within(doc.path, i, j, limit, what)
            return j + 1
        if HEADING.match(line):
            raise Refusal(
                doc.path,
                j + 1,
                f"a heading line inside {what} ends it in Org: escape it as ',* '",
            )
        if BEGIN_SRC.match(line):
            open_src = j + 1
        elif END_SRC.fullmatch(line):
            open_src = None
        else:
            note_hidden_name(doc, j)
    raise Refusal(doc.path, i + 1, f"{what} without its end (Org reads it as text)")

def latex_end(lines, i, name, limit):
    """The pattern that ends the LaTeX environment NAME begun at line index I, or None
    if Org sees none."""
    end = re.compile(r"\\end\{" + re.escape(name) + r"\}[ \t]*$", re.I)
    for j in range(i, len(lines) if limit is None else limit):
        if j > i and HEADING.match(lines[j]):
            return None
        if end.search(lines[j]):
            return end
    return None

def note_hidden_name(doc, j):
    """Remember a #+NAME: line that Emacs's search for named blocks would find where Org
    sees no block."""
    if m := NAME_LINE.match(doc.lines[j]):
        doc.hidden_names.setdefault(m.group(1).lower(), j + 1)

def container_end(lines, i):
    """The index of the line that closes the element containing elements opened at line
    index I, or None."""
    line = lines[i]
    if m := re.match(rf"[ \t]*#\+begin_([^{EMACS_BLANKS}]+)", line, re.I):
        end = re.compile(rf"[ \t]*#\+end_{re.escape(m.group(1))}[ \t]*", re.I)
    elif re.match(r"[ \t]*#\+begin:? ", line, re.I):
        end = re.compile(r"[ \t]*#\+end:?[ \t]*", re.I)
    elif re.fullmatch(r"[ \t]*:[-\w]+:[ \t]*", line):
        end = DRAWER_END
    else:
        return None
    for j in range(i + 1, len(lines)):
        if HEADING.match(lines[j]):
            return None
        if end.fullmatch(lines[j]):
            return j
    return None

def check_within(path, i, j, limit, what):
    """Refuse an element from line index I to J that runs past LIMIT, the end of its
    container."""
    if limit is not None and j > limit:
        raise Refusal(
            path,
            i + 1,
            f"{what} runs past line {limit + 1}, where Org ends the "
            "element that contains it, so Org does not see it",
        )

OUTSIDE_KEYWORDS = {
    "setupfile": "pulls in settings from another file",
    "include": "pulls in text from another file",
    "todo": "changes the words that headings may start with",
    "seq_todo": "changes the words that headings may start with",
    "typ_todo": "changes the words that headings may start with",
}


def check_keyword(doc, number, key, value):
    """Refuse keywords that change what Emacs tangles; collect #+PROPERTY
    header-args."""
    if key == "property" and "header-args" in value.lower():
        check_blanks(doc.path, number, doc.lines[number - 1])
        if m := re.match(r"([^ \t]+)[ \t]+(.*)", value):
            name, rest = m.groups()
        else:
            name, rest = value, ""
        if name.lower().startswith("header-args"):
            check_header_args_property(doc.path, number, name, rest)
            doc.keyword_properties.append((number, name, rest))
    elif key in OUTSIDE_KEYWORDS:
        raise Refusal(
            doc.path, number, f"#+{key.upper()} {OUTSIDE_KEYWORDS[key]}; not supported"
        )
    elif key == "filetags" and "ARCHIVE" in value.split(":"):
        raise Refusal(
            doc.path,
            number,
            "#+FILETAGS: :ARCHIVE: archives the whole file; not supported",
        )

FILE_VARIABLES = (
    "file-local variables could change how Emacs tangles this file "
    "(org-src-preserve-indentation, the noweb syntax); not supported"
)


def check_file_variables(path, lines):
    """Refuse file-local variables, which could change how Emacs tangles this file."""
    for number, line in enumerate(lines[:2], 1):
        if "-*-" in line and re.search(r"\borg-", line):
            raise Refusal(path, number, FILE_VARIABLES)
    tail = len("\n".join(lines)) - 3000
    offset = 0
    for number, line in enumerate(lines, 1):
        if offset >= tail and re.search(r"local variables:", line, re.I):
            raise Refusal(path, number, FILE_VARIABLES)
        offset += len(line) + 1

def read_block(doc, i, heading, limit):
    """Read the src block starting at line index I; return it and the next index."""
    path, lines, number = doc.path, doc.lines, i + 1
    begin = BEGIN_SRC.match(lines[i])
    check_blanks(path, number, lines[i], begin.end(1) if begin.group(1) else None)
    for j in range(i + 1, len(lines)):
        line = lines[j]
        if line[:1] == "*" and HEADING.match(line):
            raise Refusal(
                path,
                j + 1,
                "a line starting with '* ' inside a block ends it in Org:"
                " escape it as ',* '",
            )
        if not MAY_BE_KEYWORD.match(line):
            continue
        if END_SRC.fullmatch(line):
            break
        if re.match(r"[ \t]*#\+end_src", line, re.I):
            raise Refusal(
                path,
                j + 1,
                "a line starting with #+end_src inside a block: Emacs's search for"
                " blocks stops there; escape it as ',#+end_src'",
            )
        note_hidden_name(doc, j)
    else:
        raise Refusal(
            path, number, "#+begin_src without #+end_src (Org reads it as text)"
        )
    check_within(path, i, j, limit, "the block")
    if not begin.group(1):
        raise Refusal(
            path,
            number,
            "a src block needs a language after a space: '#+begin_src python'",
        )
    headers, name, name_line, name_hidden_by = affiliated_keywords(doc, i)
    if heading:
        heading.block_count += 1
    block = Block(
        line=number, language=begin.group(1), arguments=begin.group(2).strip(" \t"),
        headers=headers, name=name, name_line=name_line, heading=heading,
        number=heading.block_count if heading else 0,
        body_line=number + 1, raw_lines=lines[i + 1 : j], target=target_above(lines, i),
        name_hidden_by=name_hidden_by,
    )
    return block, j + 1

def affiliated_keywords(doc, i):
    """The #+HEADER lines and the #+NAME above the block at line index I, and the line
    of a keyword that hides the block from Emacs's search by that name."""
    path, lines = doc.path, doc.lines
    headers, name, name_line, stop = [], None, None, None
    k = i - 1
    while k >= 0 and (m := AFFILIATED.fullmatch(lines[k])):
        header = (m.group(2) or "").lower() in ("header", "headers")
        check_blanks(path, k + 1, lines[k], m.start(4) if header else None)
        if (
            name is None
            and stop is None
            and not re.match(r"[ \t]*#\+[^ \t]+:", lines[k])
        ):
            stop = k + 1
        key, value = (m.group(1) or m.group(2) or m.group(3)).lower(), m.group(4)
        if key in OLD_NAMES:
            raise Refusal(
                path,
                k + 1,
                f"#+{key.upper()} is an old spelling of #+NAME; write #+NAME",
            )
        if key in ("header", "headers"):
            headers.insert(0, (k + 1, value))
        elif key == "name":
            if name is not None:
                raise Refusal(
                    path, k + 1, f"a second #+NAME for the block (line {name_line})"
                )
            if not value:
                raise Refusal(
                    path,
                    k + 1,
                    "#+NAME: without a name (Org would name the block \"\")",
                )
            name, name_line = value, k + 1
        k -= 1
    while k >= 0 and re.match(r"[ \t]*#\+[^ \t]+:", lines[k]):
        if re.match(r"[ \t]*#\+name:", lines[k], re.I):
            raise Refusal(
                path,
                k + 1,
                "#+NAME is separated from its block by another "
                "keyword (Org finds it for noweb but not for links)",
            )
        k -= 1
    return headers, name, name_line, stop if name_line else None

TARGET = re.compile(r"[^<]<<([^<>]+)>>[^>]")


def target_above(lines, i):
    """The <<target>> that Org's org-store-link finds at the start of line index I, or
    None."""
    start = max(i - 1, 0)
    text = "\n".join(lines[start : i + 2])
    here = len(lines[start]) + 1 if start < i else 0
    for m in TARGET.finditer(text):
        if m.start() > here:
            return None
        if m.end() >= here:
            return m.group(1)
    return None

HEADER_KEYS = {
    "tangle",
    "mkdirp",
    "padline",
    "noweb",
    "noweb-ref",
    "noweb-sep",
    "comments",
    "shebang",
    "tangle-mode",
    "exports",
    "results",
    "session",
    "eval",
    "cache",
    "hlines",
    "dir",
    "wrap",
    "var",
    "prologue",
    "epilogue",
    "no-expand",
}
INJECTING_KEYS = {
    "var": "injects assignments into the tangled code",
    "prologue": "injects code before the body",
    "epilogue": "injects code after the body",
    "no-expand": "changes how the body is expanded",
}

NOWEB_EXPANDS = {
    "no": (False, False),
    "yes": (True, True),
    "tangle": (True, None),
    "no-export": (True, True),
    "strip-export": (True, True),
}

def balanced_split(text, at_colon=True):
    """Split TEXT as org-babel-balanced-split does: where a blank is followed by ':'
    (dropping both), or with AT_COLON false at each space; never inside "quotes" or
    balanced brackets. Returns (offset, piece) pairs."""
    if at_colon and not re.search(r'["(\[]', text):
        # Nothing to balance: cut at each blank and colon, as the walk below would.
        cuts = [m.start() for m in re.finditer(r"[ \t]:", text)]
        pieces = zip(
            [0] + [cut + 1 for cut in cuts],
            [0] + [cut + 2 for cut in cuts],
            cuts + [len(text)],
        )
        return [(offset, text[a:b]) for offset, a, b in pieces if b > a]
    parts, partial, start, k = [], [], 0, 0
    while k < len(text):
        ch, before = text[k], text[k - 1] if k else ""
        if (ch == ":" and before in (" ", "\t")) if at_colon else ch == " ":
            if at_colon:
                partial.pop()
            if partial:
                parts.append((start, "".join(partial)))
            partial, start, k = [], k + (0 if at_colon else 1), k + 1
        elif ch in "([":
            end = balanced_end(text, k)
            partial += text[k:end] if end else ch
            k = end or k + 1
        elif ch == '"' and before != "\\":
            closing = CLOSING_QUOTE.search(text, k)
            partial += text[k : closing.end()] if closing else ch
            k = closing.end() if closing else k + 1
        else:
            partial.append(ch)
            k += 1
    if partial:
        parts.append((start, "".join(partial)))
    return parts

def balanced_end(text, k):
    """The index after the bracket that closes the one at K, as Org matches them, or
    None."""
    openings = [text[k]]
    for j in range(k + 1, len(text)):
        ch = text[j]
        if ch in "([":
            openings.append(ch)
        elif (openings[-1], ch) in (("(", ")"), ("[", "]")):
            openings.pop()
        if not openings:
            return j + 1
    return None

LISP_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"'}
CLOSING_QUOTE = re.compile(r'[^\\]"')
LISP_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]+)?")

def read_value(where, key, raw):
    """Turn a raw header value into what Org would see, or refuse it."""
    if raw is None:
        return None
    if raw[0] in "('`[" or raw == "*this*":
        mode = re.fullmatch(r"\(identity\s+#o([0-7]{3,4})\)", raw)
        if key == "tangle-mode" and mode:
            return int(mode.group(1), 8)
        raise Refusal(
            *where,
            f":{key} {raw}: Emacs evaluates this as Lisp; "
            "only (identity #oNNN) for :tangle-mode is accepted",
        )
    if re.match(rf'[{EMACS_BLANKS[2:]}]+"', raw):
        raise Refusal(
            *where,
            f":{key} {raw}: a blank such as a no-break space before a quoted value;"
            " Org versions read such quotes differently",
        )
    if raw[0] == '"':
        quoted = re.fullmatch(r'"((?:[^"\\]|\\.)*)"', raw)
        if not quoted:
            raise Refusal(*where, f":{key} {raw}: text after a quoted value")
        bad = [
            e for e in re.findall(r"\\(.)", quoted.group(1)) if e not in LISP_ESCAPES
        ]
        if bad:
            raise Refusal(*where, f":{key}: unsupported escape \\{bad[0]}")
        return re.sub(r"\\(.)", lambda e: LISP_ESCAPES[e.group(1)], quoted.group(1))
    if LISP_NUMBER.fullmatch(raw):
        raise Refusal(*where, f":{key} {raw}: Org reads this as a number")
    return raw

def parse_arguments(pieces):
    """Parse the header arguments in PIECES, (where, text) pairs, into {key: (value,
    where)}."""
    text = " ".join(t for _, t in pieces)
    if not text.strip(" \t") or text == "nil":
        return {}
    offsets = list(
        itertools.accumulate((len(t) + 1 for _, t in pieces[:-1]), initial=0)
    )
    parsed = {}
    for n, (k, part) in enumerate(balanced_split(text)):
        where = pieces[bisect.bisect_right(offsets, k) - 1][0]
        arg = part if n == 0 else ":" + part
        if not arg.startswith(":"):
            raise Refusal(
                *where,
                "switches and other text before the header arguments are not "
                f"supported (Org 9.7 honours -i, 9.5 does not): {part.strip()!r}",
            )
        m = re.search(r"([^ \t]+)[ \t]+([^ \t].*)", arg)
        key, raw = (
            (m.group(1), m.group(2).rstrip(" \t")) if m else (arg.rstrip(" \t"), None)
        )
        parsed[key[1:]] = (read_value(where, key[1:], raw), where)
        if key == ":var":
            check_var(where, raw)
    return parsed

def check_var(where, raw):
    """Refuse a :var value that Org's merge of header arguments could stop on."""
    pieces = [piece for _, piece in balanced_split(raw or "", at_colon=False)]
    joined = []
    for piece in pieces:
        if joined and (joined[-1].endswith("=") or piece.startswith("=")):
            joined[-1] += piece
        else:
            joined.append(piece)
    if not joined or not all(re.match(r"[^= \t]+[ \t]*=", v) for v in joined):
        raise Refusal(
            *where,
            f":var {raw or ''}: write NAME=VALUE (Emacs stops with an "
            "error on a :var without a name)",
        )

def inherited_property(doc, heading, name):
    """The value of property NAME at HEADING, as (where, text) pieces in Org's order.

    The nearest level that sets NAME wins outright; NAME+ values on the
    way up are appended after it.
    """
    pieces = []
    for properties in property_levels(doc, heading, name):
        base = [p for p in properties if p[1].lower() == name]
        if len(base) > 1:
            raise Refusal(doc.path, base[1][0], f"{name} set twice in one drawer")
        base = [p for p in base if p[2] != "nil"]
        more = [p for p in properties if p[1].lower() == name + "+"]
        pieces[:0] = [((doc.path, line), value) for line, _, value in base + more]
        if base:
            return pieces
    return keyword_property(doc, name) + pieces

def property_levels(doc, heading, name):
    """The property drawers that inheritance of NAME visits from HEADING: its own, its
    ancestors', the file's."""
    top = None
    while heading:
        yield heading.properties
        top, heading = heading, heading.parent
    if top and top.level > 1:
        if any(key.lower() in (name, name + "+") for _, key, _ in doc.file_properties):
            raise Refusal(
                doc.path,
                top.line,
                f"Org 9.5 skips the file's {name} for a heading "
                "with no level-1 heading above it; add one",
            )
        return
    yield doc.file_properties

def keyword_property(doc, name):
    """The value of property NAME set by #+PROPERTY lines, as (where, text) pieces."""
    pieces = []
    for line, key, value in doc.keyword_properties:
        if key.lower() == name:
            pieces = [((doc.path, line), value)]
        elif key.lower() == name + "+":
            pieces.append(((doc.path, line), value))
    return [] if " ".join(t for _, t in pieces) == "nil" else pieces

def block_parameters(doc, block):
    """Merge a block's header arguments: properties, then the block line, then
    #+HEADER."""
    params = {"tangle": ("no", (doc.path, block.line))}
    for name in ("header-args", "header-args:" + block.language.lower()):
        params.update(parse_arguments(inherited_property(doc, block.heading, name)))
    params.update(parse_arguments([((doc.path, block.line), block.arguments)]))
    for line, text in reversed(block.headers):
        params.update(parse_arguments([((doc.path, line), text)]))
    return params

def tangle_target(doc, value, where):
    """The path that a :tangle value names, relative to the org file's directory, or a
    refusal."""
    if value is None:
        raise Refusal(*where, ":tangle needs a value: a file name or no")
    if value == "yes":
        raise Refusal(
            *where,
            ":tangle yes names the file after the language "
            "(.python without ob-python); write the file name",
        )
    path = "/".join(part for part in value.split("/") if part != ".")
    if (
        not path
        or os.path.isabs(value)
        or value.startswith("~")
        or os.path.normpath(path) != path
        or path.split("/")[0] == ".."
        or re.search(r"[\x00-\x1f\x7f]", path)
    ):
        raise Refusal(
            *where,
            f":tangle {value!r}: write a plain path inside the org file's directory",
        )
    if path in (os.path.basename(doc.path), database_name(doc.path)):
        raise Refusal(
            *where, f":tangle {value}: would overwrite the tangler's own files"
        )
    return path

EXPANDED_LANGUAGES = {
    **dict.fromkeys(["C", "C++", "D", "cpp"], "ob-C"),
    "R": "ob-R",
    "awk": "ob-awk",
    "calc": "ob-calc",
    **dict.fromkeys(["clojure", "clojurescript"], "ob-clojure"),
    "dot": "ob-dot",
    "fortran": "ob-fortran",
    "gnuplot": "ob-gnuplot",
    "java": "ob-java",
    "julia": "ob-julia",
    "latex": "ob-latex",
    "lilypond": "ob-lilypond",
    "lisp": "ob-lisp",
    "scheme": "ob-scheme",
    "sql": "ob-sql",
    "sqlite": "ob-sqlite",
}
COMMENT_STARTS = {
    "python": "# ",
    "sh": "# ",
    "bash": "# ",
    "shell": "# ",
    "emacs-lisp": ";; ",
    "elisp": ";; ",
}

def check_parameters(doc, block, params):
    """Refuse header arguments that we cannot tangle as every Org does, on a used
    block."""
    for key, (value, where) in params.items():
        if key == "noweb-prefix":
            raise Refusal(
                *where, ":noweb-prefix is not known to Org 9.5; not supported"
            )
        if key not in HEADER_KEYS:
            raise Refusal(
                *where,
                f":{key} is not a header argument this tangler knows "
                "(Emacs would ignore a misspelt one without a word)",
            )
        if value is None:
            raise Refusal(
                *where,
                f":{key} needs a value (Org versions read a bare key differently)",
            )
    value, where = params.get("noweb", ("no", None))
    if value not in NOWEB_EXPANDS:
        raise Refusal(*where, f":noweb {value}: use one of {', '.join(NOWEB_EXPANDS)}")

def check_tangled(doc, block, params):
    """Refuse what a tangled block's output depends on beyond the subset: language,
    injected code, comments, modes."""
    if block.language in EXPANDED_LANGUAGES:
        raise Refusal(
            doc.path,
            block.line,
            f"{block.language} blocks are expanded by"
            f" {EXPANDED_LANGUAGES[block.language]} when the user's configuration"
            " loads it (ob-C wraps C in main()), so what Emacs writes depends on it",
        )
    for key, (value, where) in params.items():
        if key in INJECTING_KEYS:
            raise Refusal(
                *where,
                f":{key} {INJECTING_KEYS[key]}; not supported on a tangled block",
            )
    comments, where = params.get("comments", ("no", None))
    if comments not in ("no", "link", "yes"):
        raise Refusal(*where, f":comments {comments}: use one of no, link, yes")
    mode, where = params.get("tangle-mode", (None, None))
    if mode is not None and not isinstance(mode, int):
        raise Refusal(
            *where,
            ":tangle-mode: write (identity #o755); other forms differ between Org"
            " versions",
        )
    if mode is not None and mode < 0o100:
        raise Refusal(
            *where,
            f":tangle-mode (identity #o{mode:03o}): Org 9.5 applies it, Org 9.6 and"
            " later stop on a mode whose octal form is not three digits",
        )
    if comments != "no":
        if block.language not in COMMENT_STARTS:
            raise Refusal(
                doc.path,
                block.line,
                f":comments link for {block.language!r} blocks is not "
                "supported (Emacs takes the comment syntax from the language's mode)",
            )
        if block.heading is None:
            raise Refusal(
                doc.path,
                block.line,
                ":comments link needs the block to be under a heading "
                "(Org links a block above the first one by the text of its line)",
            )

UNESCAPE = re.compile(r"^([ \t]*,*),(\*|#\+)")

ODD_LEAD = re.compile(rf"[ \t]*[{EMACS_BLANKS[2:]}]")


def org_cut(lines, solid):
    """The indentation Org measures over the lines it counts (those whose first
    character after spaces and tabs is no blank to Emacs), or None if it counts none."""
    counted = [indentation(lines[k]) for k in solid if not ODD_LEAD.match(lines[k])]
    return min(counted, default=None)

def indentation(line):
    """Column of the first non-blank character, counting a tab to the next multiple of
    8."""
    column = 0
    for ch in line:
        if ch == " ":
            column += 1
        elif ch == "\t":
            column = column // 8 * 8 + 8
        else:
            break
    return column

def normalize_body(doc, block):
    """The block's code as Org hands it to the tangler, one string per line.

    Commas that escape '*' and '#+' are removed and the common indentation
    is cut. Whatever Org 9.5 and Org 9.7-9.8 would cut differently is refused.
    """
    lines = [
        UNESCAPE.sub(r"\1\2", line) if "," in line else line for line in block.raw_lines
    ]
    where = lambda k: (doc.path, block.body_line + k)
    solid = [k for k, line in enumerate(lines) if line.strip(" \t")]
    if not solid:
        raise Refusal(
            doc.path,
            block.line,
            "empty block (Org would tangle a lone blank line, which "
            "--detangle could not map back)",
        )
    if solid[0] != 0:
        raise Refusal(
            *where(0),
            "blank line at the start of a block (Org versions disagree on it)"
        )
    if solid[-1] != len(lines) - 1:
        raise Refusal(
            *where(len(lines) - 1),
            "blank line at the end of a block (Org versions disagree on it)"
        )
    cut = min(indentation(lines[k]) for k in solid)
    odd = next((k for k in solid if ODD_LEAD.match(lines[k])), None)
    if odd is not None and org_cut(lines, solid) != cut and any(
        indentation(lines[k]) for k in solid
    ):
        blank = lines[odd].lstrip(" \t")[0]
        raise Refusal(
            *where(odd),
            f"{unicodedata.name(blank, 'FORM FEED')} (U+{ord(blank):04X})"
            " after this line's indentation: Org does not count the line when it"
            " measures the block's indentation, and Org versions cut it differently",
        )
    if indentation(lines[0]) > cut:
        raise Refusal(
            *where(0), "first line indented deeper than the rest (Org trims it)"
        )
    if cut == 0:
        return lines
    body = []
    for k, line in enumerate(lines):
        lead = line[: len(line) - len(line.lstrip(" \t"))]
        if "\t" in lead:
            raise Refusal(
                *where(k),
                "tab in the indentation of an indented block (Org versions cut it"
                " differently)"
            )
        if not line.strip(" \t"):
            if len(line) > cut:
                raise Refusal(
                    *where(k),
                    "whitespace-only line wider than the block's indentation (Org"
                    " versions disagree on it)"
                )
            body.append("")
        else:
            body.append(line[cut:])
    return body

NOWEB = re.compile(r"<<([^ \t\n](?:.*?[^ \t\n])?)>>")

@dataclass(frozen=True)
class Piece:
    """A stretch of one output line and where it came from.

    kind is "code" (a line of a block's body), "prefix" (text left of a noweb
    reference, repeated on each line of its expansion) or "text" (anything
    else: padding, shebang, comments, separators, text right of a reference).
    """

    text: str
    kind: str
    block: int
    k: int
    org_line: int

def line_text(line):
    return "".join(piece.text for piece in line)

@dataclass
class Output:
    path: str
    lines: list
    text: str
    mode: int | None
    mkdirp: bool
    org_line: int
    shown: str

@dataclass
class Book:
    """One parsed org file and what tangling it needs to look up."""

    doc: Document
    params: list
    names: dict
    refs: dict
    uses: dict = field(default_factory=dict)
    checked: set = field(default_factory=set)
    bodies: dict = field(default_factory=dict)
    expanded: int = 0

def open_book(path, data=None):
    """Parse PATH (or DATA, as if it were PATH's bytes) and index its blocks by #+NAME
    and :noweb-ref."""
    doc = parse_document(path, data)
    params = [block_parameters(doc, block) for block in doc.blocks]
    names, refs = {}, {}
    for i, block in enumerate(doc.blocks):
        if block.name is not None:
            other = names.setdefault(block.name.lower(), i)
            if other != i:
                raise Refusal(
                    path,
                    block.name_line,
                    f"#+NAME: {block.name} is also used at line"
                    f" {doc.blocks[other].name_line} (Org matches names ignoring case)",
                )
        ref = params[i].get("noweb-ref", (None,))[0]
        if ref is not None and not (block.heading and block.heading.commented):
            refs.setdefault(ref, []).append(i)
    return Book(doc, params, names, refs)

def parameter(book, i, key, default=None):
    return book.params[i].get(key, (default,))[0]

def body(book, i):
    """The normalized body of block I, its header arguments checked once."""
    if i not in book.bodies:
        check_parameters(book.doc, book.doc.blocks[i], book.params[i])
        book.bodies[i] = normalize_body(book.doc, book.doc.blocks[i])
    return book.bodies[i]

def resolve(book, name, where):
    """The blocks a noweb reference names: a #+NAME first, then :noweb-ref."""
    if re.search(r"\(.*\)", name):
        raise Refusal(*where, f"<<{name}>> asks Emacs to run a block; not supported")
    for properties in [h.properties for h in book.doc.headings] + [
        book.doc.file_properties
    ]:
        for _, key, value in properties:
            if key.upper() in ("ID", "CUSTOM_ID") and value == name:
                raise Refusal(
                    *where,
                    f"<<{name}>> names a heading's {key}; Org would insert its text",
                )
    if name.lower() in book.doc.hidden_names:
        raise Refusal(
            *where,
            f"<<{name}>>: a #+NAME: {name} line inside a raw block (line "
            f"{book.doc.hidden_names[name.lower()]}) would shadow it in Emacs",
        )
    named = book.names.get(name.lower())
    if named is not None:
        block = book.doc.blocks[named]
        if block.name != name:
            raise Refusal(
                *where,
                f"<<{name}>> matches #+NAME: {block.name} only when case is ignored;"
                " Emacs ignores it only while case-fold-search is on (the default,"
                " which a user's configuration may change): write it as in #+NAME",
            )
        if block.name_hidden_by:
            raise Refusal(
                *where,
                f"<<{name}>>: Emacs's search for #+NAME: {name} stops at the blank "
                f"inside the keyword on line {block.name_hidden_by} and inserts"
                " nothing",
            )
        if not (block.heading and block.heading.commented):
            return [named]
    if name in book.refs:
        return book.refs[name]
    raise Refusal(*where, f"<<{name}>> names no block (Emacs would insert nothing)")

def text_lines(text, block, org_line):
    """Split TEXT into output lines made of one unmappable piece each."""
    return [[Piece(part, "text", block, -1, org_line)] for part in text.split("\n")]

def join_lines(head, tail):
    """Concatenate two texts held as lines: TAIL's first line continues HEAD's last."""
    if not head:
        return tail
    joint = [p for p in head[-1] + tail[0] if p.text or p.kind != "text"] or head[-1]
    return head[:-1] + [joint] + tail[1:]

MAX_NOWEB_DEPTH = 100
MAX_EXPANSION = 5_000_000


def expand(book, i, top, stack=()):
    """Block I's body with noweb references replaced, as a list of piece lines.

    TOP says whether I is a tangled block or a referenced one.
    """
    block = book.doc.blocks[i]
    if i in stack:
        raise Refusal(
            book.doc.path,
            block.line,
            "noweb reference loops back to this block " "(Emacs would never finish)",
        )
    if len(stack) > MAX_NOWEB_DEPTH:
        raise Refusal(
            book.doc.path,
            block.line,
            f"noweb references nested more than "
            f"{MAX_NOWEB_DEPTH} deep (Emacs's Lisp stack may not hold them)",
        )
    book.uses[i] = book.uses.get(i, 0) + 1
    code = body(book, i)
    noweb = parameter(book, i, "noweb", "no")
    expands = NOWEB_EXPANDS[noweb][0 if top else 1]
    lines = []
    for k, text in enumerate(code):
        org_line = block.body_line + k
        matches = list(NOWEB.finditer(text)) if expands is not False else []
        if matches and expands is None:
            raise Refusal(
                book.doc.path,
                org_line,
                f"a referenced block with :noweb {noweb} is "
                "expanded by Org 9.8 but not by 9.5; use :noweb yes",
            )
        if not matches:
            lines.append([Piece(text, "code", i, k, org_line)])
            continue
        current, start = [], 0
        for match in matches:
            prefix = text[start : match.start()]
            pieces = [Piece(prefix, "prefix", i, k, org_line)] if prefix else []
            expansion = expand_reference(
                book, match.group(1), (book.doc.path, org_line), stack + (i,)
            )
            for n, line in enumerate(expansion):
                if n == 0:
                    current = current + pieces + line
                else:
                    lines.append(current)
                    current = pieces + line
            start = match.end()
        if text[start:]:
            current.append(Piece(text[start:], "text", i, k, org_line))
        lines.append(current)
    book.expanded += sum(len(piece.text) + 1 for line in lines for piece in line)
    if book.expanded > MAX_EXPANSION:
        raise Refusal(
            book.doc.path,
            block.line,
            f"noweb expansion passes {MAX_EXPANSION:,} characters here (references"
            " that multiply at each level); the tangler stops rather than fill memory",
        )
    return lines

def expand_reference(book, name, where, stack):
    """The expansion of <<NAME>>: its blocks joined by their :noweb-sep."""
    result = []
    blocks = resolve(book, name, where)
    for n, j in enumerate(blocks):
        result = join_lines(result, expand(book, j, False, stack))
        if n + 1 < len(blocks):
            separator = parameter(book, j, "noweb-sep", "\n")
            result = join_lines(
                result, text_lines(separator, j, book.doc.blocks[j].line)
            )
    return result

def link_comment(book, i, target):
    """The ':comments link' lines around block I, in Emacs's exact format."""
    block = book.doc.blocks[i]
    heading = block.heading
    if not (block.name or heading.title) or any(
        key.upper() == "CUSTOM_ID" for _, key, _ in heading.properties
    ):
        raise Refusal(
            book.doc.path,
            block.line,
            ":comments link under a heading with no title (Org names it 'No heading')"
            " or with a CUSTOM_ID (Org links to it) is not supported",
        )
    search = block.target or block.name or "*" + link_heading(heading.title)
    name = block.name or f"{heading.title}:{block.number}"
    if re.search(r"%(start-line|source-name)", search + name):
        raise Refusal(
            book.doc.path,
            block.line,
            f":comments link: Org would replace the %-key in {search!r}",
        )
    if (
        re.search(r"[][\\\n]", search)
        or "//" in search
        or "/~" in search
        or {".", ".."} & set(search.split("/"))
    ):
        raise Refusal(
            book.doc.path,
            block.line,
            f":comments link: Org would escape the link to {search!r}",
        )
    org = os.path.relpath(
        book.doc.path,
        os.path.join(os.path.dirname(book.doc.path), os.path.dirname(target)),
    )
    return (
        comment_line(block.language, f"[[file:{org}::{search}][{name}]]"),
        comment_line(block.language, f"{name} ends here"),
    )

def comment_line(language, text):
    """TEXT commented out as Emacs's comment-region does it for LANGUAGE."""
    indent = text[: len(text) - len(text.lstrip(" \t"))]
    return indent + COMMENT_STARTS[language] + text[len(indent) :]

def link_heading(title):
    """The search text Org makes of a heading's title: a leading COMMENT dropped,
    cookies blanked, blanks squeezed, ends trimmed."""
    text = re.sub(r"\[[0-9]*(?:%|/[0-9]*)\]", " ", re.sub(r"^COMMENT[ \t]+", "", title))
    return re.sub(r"[ \t]+", " ", text).strip(" \t\n\r")

def tangle_book(book):
    """Every file the book writes, in the order Emacs writes them."""
    targets, spellings = {}, {}
    for i, block in enumerate(book.doc.blocks):
        heading = block.heading
        if heading and (heading.commented or heading.archived):
            continue
        value, where = book.params[i]["tangle"]
        if value == "no":
            continue
        path = tangle_target(book.doc, value, where)
        if spellings.setdefault(path, value) != value:
            raise Refusal(
                *where,
                f":tangle {value} names the same file as :tangle {spellings[path]}; "
                "Emacs would write it twice, once for each spelling: write one",
            )
        check_tangled(book.doc, block, book.params[i])
        targets.setdefault(path, []).append(i)
    return [assemble(book, path, blocks) for path, blocks in targets.items()]

def assemble(book, path, blocks):
    """Join the blocks of one file: padding, shebang, link comments, bodies."""
    lines, mkdirp = [], False
    for n, i in enumerate(blocks):
        block = book.doc.blocks[i]
        shebang, mode = parameter(book, i, "shebang"), parameter(book, i, "tangle-mode")
        if n and (shebang or mode is not None):
            raise Refusal(
                book.doc.path,
                block.line,
                ":shebang and :tangle-mode belong on the first "
                f"block of {path} (Org versions place and apply them differently)",
            )
        mkdirp = mkdirp or parameter(book, i, "mkdirp") not in (None, "no")
        code = expand(book, i, True)
        text, last = line_text(code[0]), line_text(code[-1])
        if text[:1] in (" ", "\t") or last[-1:] in (" ", "\t") or not text or not last:
            raise Refusal(
                book.doc.path,
                block.line,
                "the expanded block starts or ends with " "whitespace, which Org trims",
            )
        if n and parameter(book, i, "padline") != "no":
            lines.append([Piece("", "text", i, -1, block.line)])
        if shebang:
            lines.append([Piece(shebang, "text", i, -1, block.line)])
        comments = parameter(book, i, "comments") in ("link", "yes")
        if comments:
            begin, end = link_comment(book, i, path)
            lines.append([Piece(begin, "text", i, -1, block.line)])
        lines += code
        if comments:
            lines.append([Piece(end, "text", i, -1, block.line)])
    first = blocks[0]
    mode = parameter(book, first, "tangle-mode")
    if mode is None and parameter(book, first, "shebang"):
        mode = 0o755
    text = "".join(line_text(line) + "\n" for line in lines)
    return Output(
        path,
        lines,
        text,
        mode,
        mkdirp,
        book.doc.blocks[first].line,
        os.path.join(os.path.dirname(book.doc.path), path),
    )

def base_of(org_path):
    """The directory an org file's :tangle paths are relative to."""
    return os.path.dirname(os.path.abspath(org_path))

def database_name(org_path):
    return "." + os.path.basename(org_path) + ".tangle.json"

def database_text(outputs):
    """The hash database: what the last tangle wrote, for --detangle and --check."""
    files = {
        out.path: {"sha256": sha256(out.text), "executable": executable(out.mode)}
        for out in outputs
    }
    note = "written by tangle/tangle.py; --detangle compares the tangled files with it"
    return json.dumps({"about": note, "files": files}, indent=1, sort_keys=True) + "\n"

def sha256(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def executable(mode):
    return bool(mode is not None and mode & 0o100)


def read_bytes(path):
    """A file's bytes, or None when there is no file there (nothing, or a directory)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None

def write_atomically(directory, name, data, mode):
    """Replace NAME in the open DIRECTORY with the bytes DATA so that a crash leaves the
    old file or the new, never half."""
    temporary = f".{name}.{os.getpid()}.tangle"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(temporary, flags, 0o600, dir_fd=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        os.unlink(temporary, dir_fd=directory)
        raise

def write_file(base, path, data, mode):
    """Make PATH under BASE a file holding DATA with MODE, creating its directories and
    following no link; return whether its bytes changed."""
    directory, name = os.path.split(path)
    fd = open_directory(base, directory)
    try:
        try:
            file = os.open(name, READ_FLAGS, dir_fd=fd)
        except OSError:
            # No file, or a link put there after the check: the rename replaces it.
            file = None
        if file is not None:
            try:
                info = os.fstat(file)
                if stat.S_ISREG(info.st_mode) and read_all(file) == data:
                    if stat.S_IMODE(info.st_mode) != mode:
                        os.fchmod(file, mode)
                    return False
            finally:
                os.close(file)
        write_atomically(fd, name, data, mode)
        return True
    finally:
        os.close(fd)

def file_mode(mode):
    """The mode Emacs leaves: the block's mode, or 0666 less the umask."""
    if mode is not None:
        return mode
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask

def write_outputs(book, outputs, allow_special_modes=False):
    """Write each output (and the database) whose bytes differ, set each mode; return
    the paths written."""
    base = base_of(book.doc.path)
    files = [
        (
            out.path,
            out.text.encode("utf-8"),
            file_mode(out.mode),
            out.mkdirp,
            out.org_line,
        )
        for out in outputs
    ]
    files.append(
        (
            database_name(book.doc.path),
            database_text(outputs).encode("utf-8"),
            file_mode(None),
            False,
            1,
        )
    )
    for out in outputs:
        check_mode(book, out, allow_special_modes)
    check_writable(book, files)
    return [
        path for path, data, mode, _, _ in files if write_file(base, path, data, mode)
    ]

def check_writable(book, files):
    """Refuse, before anything is written, any of FILES that cannot be written as a
    plain file."""
    base = base_of(book.doc.path)
    paths = {path for path, *_ in files}
    name_max, path_max = os.pathconf(base, "PC_NAME_MAX"), os.pathconf(
        base, "PC_PATH_MAX"
    )
    made = set()
    for path, _, _, mkdirp, org_line in files:
        parts, full = path.split("/"), os.path.join(base, path)
        where = (book.doc.path, org_line)
        if len(full.encode()) >= path_max or any(
            len(p.encode()) > name_max for p in parts
        ):
            raise Refusal(
                *where, f"{path}: the name is longer than the file system allows"
            )
        check_confined(base, path, where)
        for n in range(1, len(parts)):
            prefix = "/".join(parts[:n])
            if prefix in paths or (
                os.path.lexists(os.path.join(base, prefix))
                and not os.path.isdir(os.path.join(base, prefix))
            ):
                raise Refusal(
                    *where,
                    f"{path} cannot be written: {prefix} is a file, not a directory",
                )
        if os.path.isdir(full):
            raise Refusal(*where, f"{path} cannot be written: it is a directory")
        directory = os.path.dirname(path)
        if (
            directory
            and directory not in made
            and not os.path.isdir(os.path.join(base, directory))
        ):
            if not mkdirp:
                raise Refusal(
                    *where, f"directory {directory} does not exist; add :mkdirp yes"
                )
            made |= {"/".join(parts[:n]) for n in range(1, len(parts))}
        existing = os.path.dirname(full)
        while not os.path.isdir(existing):
            existing = os.path.dirname(existing)
        if not os.access(existing, os.W_OK | os.X_OK):
            raise Refusal(
                *where,
                f"{path} cannot be written: no permission to write in {existing}",
            )

def check_confined(base, path, where):
    """Refuse a target PATH under BASE inside .git, at or below a link, or sharing its
    file with another name."""
    parts = path.split("/")
    if any(is_git_name(part) for part in parts):
        raise Refusal(
            *where,
            f"{path} is inside .git, where git runs hooks and reads its settings;"
            " the tangler does not write there",
        )
    for n in range(1, len(parts) + 1):
        prefix = "/".join(parts[:n])
        if os.path.islink(os.path.join(base, prefix)):
            raise Refusal(
                *where,
                f"{path} cannot be written: {prefix} is a symbolic link, which would"
                " carry the write elsewhere; the tangler writes plain files only",
            )
    try:
        info = os.lstat(os.path.join(base, path))
    except (FileNotFoundError, NotADirectoryError):
        return
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        raise Refusal(
            *where, f"{path} cannot be written: it is not a plain file (a FIFO?)"
        )
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        raise Refusal(
            *where,
            f"{path} cannot be written: it has {info.st_nlink} names (hard links),"
            " and a write or a mode would reach the others",
        )

def is_git_name(part):
    """Whether some file system may read the path component PART as .git."""
    core = "".join(ch for ch in part if unicodedata.category(ch) != "Cf")
    return core.casefold().rstrip(". ") in (".git", "git~1")

SPECIAL_MODES = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWOTH


def check_mode(book, out, allowed):
    """Refuse a :tangle-mode with setuid, setgid, sticky or world-writable bits, unless
    ALLOWED."""
    if out.mode is not None and out.mode & SPECIAL_MODES and not allowed:
        raise Refusal(
            book.doc.path,
            out.org_line,
            f"{out.path}: :tangle-mode {out.mode:o} sets setuid, setgid, sticky or"
            " world-writable bits; pass --allow-special-modes if that is meant",
        )

def open_directory(base, directory, create=True):
    """An open descriptor for DIRECTORY under BASE, reached one component at a time
    without following a link; missing components are made when CREATE."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    for part in directory.split("/") if directory else []:
        try:
            if create:
                try:
                    os.mkdir(part, dir_fd=fd)
                except FileExistsError:
                    pass
            child = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd
            )
        finally:
            os.close(fd)
        fd = child
    return fd

def read_in_tree(base, path):
    """The bytes of PATH under BASE, reached without following a link, or None when
    there is no file there."""
    directory, name = os.path.split(path)
    try:
        fd = open_directory(base, directory, create=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        file = os.open(name, READ_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        return None
    finally:
        os.close(fd)
    try:
        return read_all(file) if stat.S_ISREG(os.fstat(file).st_mode) else None
    finally:
        os.close(file)

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


def read_all(fd):
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)

def orphans(book, outputs):
    """Python files the book does not write, in the directories it writes Python into.

    Files the last tangle wrote (per the database) that no block writes
    now are reported too, wherever they are.
    """
    base = base_of(book.doc.path)
    produced = {out.path for out in outputs}
    previous = read_database(book.doc.path).get("files", {})
    owned = {os.path.dirname(p) for p in produced | set(previous) if p.endswith(".py")}
    found = {
        p
        for p in previous
        if p not in produced and os.path.exists(os.path.join(base, p))
    }
    for directory in owned:
        full = os.path.join(base, directory)
        if os.path.isdir(full):
            found |= {
                os.path.join(directory, name)
                for name in os.listdir(full)
                if name.endswith(".py")
                and os.path.join(directory, name) not in produced
            }
    return sorted(found)

def read_database(org_path):
    """The database of the last tangle of ORG_PATH: {} when there is none yet."""
    name = database_name(org_path)
    text = read_bytes(os.path.join(base_of(org_path), name))
    if text is None:
        return {}
    try:
        database = json.loads(text)
    except ValueError:
        database = None
    files = database.get("files") if isinstance(database, dict) else None
    if not isinstance(files, dict) or not all(
        isinstance(record, dict) and isinstance(record.get("sha256"), str)
        for record in files.values()
    ):
        raise Refusal(
            os.path.join(os.path.dirname(org_path), name),
            1,
            "not a tangle database; delete it and tangle again",
        )
    return database

def origin(line):
    """The org line an output line comes from: its code if it has some."""
    code = [p for p in line if p.kind == "code"]
    return (code or line)[-1].org_line

def hunk_range(start, length):
    """A unified-diff range, as diff(1) writes it."""
    if length == 1:
        return str(start + 1)
    return f"{start + 1 if length else start},{length}"

def split_lines(text):
    """TEXT as lines that keep their newline; only \\n ends a line."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]

def labelled_diff(org_name, path, disk, out):
    """A unified diff from the file on disk to the book's text, each hunk naming its org
    line."""
    old = split_lines(disk.decode("utf-8", "replace"))
    new = split_lines(out.text)
    diff = [f"--- {path} (on disk)\n", f"+++ {path} (tangled from {org_name})\n"]
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for group in matcher.get_grouped_opcodes(3):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        changed = next(op for op in group if op[0] != "equal")
        at = min(changed[3], len(out.lines) - 1)
        diff.append(
            f"@@ -{hunk_range(i1, i2 - i1)} +{hunk_range(j1, j2 - j1)} @@ "
            f"{org_name}:{origin(out.lines[at])}\n"
        )
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                diff += [" " + line for line in old[a1:a2]]
                continue
            diff += ["-" + line for line in old[a1:a2]]
            diff += ["+" + line for line in new[b1:b2]]
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
        for line in diff
    )

def check(book, outputs):
    """Compare what the book would write with the disk; return the problems as text."""
    base, name = base_of(book.doc.path), book.doc.path
    problems = []
    for out in outputs:
        try:
            check_confined(base, out.path, (name, out.org_line))
        except Refusal as refusal:
            # Not read: a diff against a link's target would print what it points to.
            problems.append(f"unsafe: {refusal}\n")
            continue
        disk = read_in_tree(base, out.path)
        if disk is None:
            problems.append(
                f"missing: {out.shown} (tangled from {name}:{out.org_line})\n"
            )
        elif disk != out.text.encode("utf-8"):
            problems.append(labelled_diff(name, out.shown, disk, out))
        elif (
            actual := stat.S_IMODE(os.stat(os.path.join(base, out.path)).st_mode)
        ) != file_mode(out.mode):
            problems.append(
                f"mode: {out.shown} is {actual:04o}, the book gives "
                f"{file_mode(out.mode):04o} ({name}:{out.org_line})\n"
            )
    database = database_name(book.doc.path)
    if read_bytes(os.path.join(base, database)) != database_text(outputs).encode(
        "utf-8"
    ):
        problems.append(
            f"stale: {database} does not match {name}; tangle to rewrite it\n"
        )
    problems += [
        f"not in the book: {path} (no block of {name} writes it)\n"
        for path in orphans(book, outputs)
    ]
    return problems

@dataclass(frozen=True)
class Spot:
    """Where an output line can be written back: line K of block BLOCK, after PREFIX."""

    block: int
    k: int
    prefix: str

def spot(line):
    """The block line an output line copies, or None when it mixes or adds text."""
    *prefixes, last = line
    if last.kind != "code" or any(p.kind != "prefix" for p in prefixes):
        return None
    return Spot(last.block, last.k, line_text(prefixes))

def what_is(line):
    """Name the kind of line a tangled file holds that no block line maps to."""
    if len(line) == 1 and line[0].text == "":
        return "the blank line Org puts between two blocks"
    if any(p.kind == "code" for p in line):
        return "a line that joins a noweb reference with text around it"
    return "a line the tangler adds (shebang, comment or :noweb-sep)"

def map_edit(book, out, old, new, opcode):
    """Map one differing stretch of a tangled file to edits (block, k1, k2, new
    lines)."""
    _, i1, i2, j1, j2 = opcode
    if i1 == i2:
        return [map_insertion(book, out, old, new, i1, j1, j2)]
    if j1 == j2:
        check_not_emptied(book, out, i1, i2)
    for i in range(i1, i2):
        if spot(out.lines[i]) is None:
            raise Refusal(
                out.shown, i + 1, f"the change touches {what_is(out.lines[i])}"
            )
    runs = block_runs(out, i1, i2)
    if len(runs) == 1:
        return [edit(book, out, runs[0], j1, new[j1:j2])]
    if j2 - j1 not in (0, i2 - i1):
        raise Refusal(
            out.shown,
            i1 + 1,
            "the change spans more than one block and adds or removes lines"
            f" ({book.doc.path}:{origin(out.lines[i1])} to"
            f" :{origin(out.lines[i2 - 1])}); edit one block at a time",
        )
    line_for_line = j2 > j1
    return [
        edit(
            book,
            out,
            run,
            j1 + run[0] - i1,
            new[j1 + run[0] - i1 : j1 + run[-1] + 1 - i1] if line_for_line else [],
        )
        for run in runs
    ]

def block_runs(out, i1, i2):
    """Lines I1..I2 of OUT cut into runs of consecutive lines of one block each (as line
    index lists)."""
    runs = []
    for i in range(i1, i2):
        here, before = spot(out.lines[i]), spot(out.lines[i - 1]) if runs else None
        if before and (here.block, here.k, here.prefix) == (
            before.block,
            before.k + 1,
            before.prefix,
        ):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs

def check_not_emptied(book, out, i1, i2):
    """Refuse deleting lines I1..I2 of OUT when that deletes every line of a block."""
    for b in {s.block for i in range(i1, i2) if (s := spot(out.lines[i]))}:
        lines = [
            i
            for i, line in enumerate(out.lines)
            if any(p.kind == "code" and p.block == b for p in line)
        ]
        if all(i1 <= i < i2 for i in lines):
            raise Refusal(
                out.shown,
                lines[0] + 1,
                "the change deletes every line of the block at"
                f" {book.doc.path}:{book.doc.blocks[b].line}; delete the block in the"
                " book instead",
            )

def map_insertion(book, out, old, new, i1, j1, j2):
    """Map lines NEW[J1:J2] inserted before line I1 of OUT to one edit."""
    while i1 > 0 and spot(out.lines[i1 - 1]) is None and new[j2 - 1] == old[i1 - 1]:
        i1, j1, j2 = i1 - 1, j1 - 1, j2 - 1
    above = spot(out.lines[i1 - 1]) if i1 > 0 else None
    below = spot(out.lines[i1]) if i1 < len(old) else None
    if (
        above
        and below
        and (above.block, above.k + 1, above.prefix)
        != (below.block, below.k, below.prefix)
    ):
        raise Refusal(
            out.shown,
            i1 + 1,
            "lines added between two blocks: it is not clear which block they"
            " belong to",
        )
    if not (above or below):
        raise Refusal(out.shown, i1 + 1, "lines added where no block is next to them")
    target = above or below
    k = above.k + 1 if above else below.k
    return check_edit(book, out, target, i1, j1, new[j1:j2], k, k)

def edit(book, out, run, j1, lines):
    """The edit that replaces the block lines of RUN (line indexes of OUT) with LINES
    (from line J1)."""
    first, last = spot(out.lines[run[0]]), spot(out.lines[run[-1]])
    return check_edit(book, out, first, run[0], j1, lines, first.k, last.k + 1)

def check_edit(book, out, target, i, j1, lines, k1, k2):
    """The edit (block, k1, k2, lines without their prefix) for TARGET's lines K1..K2,
    or a refusal."""
    uses = book.uses[target.block]
    if uses > 1:
        name = book.doc.blocks[target.block].name or "a :noweb-ref block"
        raise Refusal(
            out.shown,
            i + 1,
            f"the change is inside {name}, which is expanded in {uses} places",
        )
    for j, line in enumerate(lines, j1):
        if not line.startswith(target.prefix):
            raise Refusal(
                out.shown,
                j + 1,
                f"the line must start with the noweb prefix {target.prefix!r}",
            )
    return target.block, k1, k2, [line[len(target.prefix) :] for line in lines]

def escape(line):
    """Add the comma Org needs before a line's leading '*' or '#+'."""
    return re.sub(r"^([ \t]*)(,*(?:\*|#\+))", r"\1,\2", line)

def write_back(book, edits):
    """The org file's lines with EDITS applied to block bodies, indentation and escapes
    kept."""
    lines = list(book.doc.lines)
    for block_index, k1, k2, new in sorted(
        edits, key=lambda e: (e[0], e[1]), reverse=True
    ):
        block = book.doc.blocks[block_index]
        solid = [line for line in block.raw_lines if line.strip(" \t")]
        cut = min(indentation(line) for line in solid)
        start = block.body_line - 1
        lines[start + k1 : start + k2] = [
            " " * cut + escape(line) if line else "" for line in new
        ]
    return lines

def detangle(path, allow_special_modes=False):
    """Write edits made in tangled files back into the org file at PATH."""
    book = open_book(path)
    outputs = tangle_book(book)
    recorded = read_database(path).get("files")
    if recorded is None:
        raise Refusal(
            path, 1, f"no {database_name(path)}: tangle once before detangling"
        )
    base, edits, edited = base_of(path), [], []
    expected = {out.path: out.text for out in outputs}
    for out in outputs:
        check_confined(base, out.path, (path, out.org_line))
    for out in outputs:
        disk = read_in_tree(base, out.path)
        record = recorded.get(out.path)
        if (
            disk is None
            or record is None
            or disk == out.text.encode("utf-8")
            or hashlib.sha256(disk).hexdigest() == record["sha256"]
        ):
            continue
        if sha256(out.text) != record["sha256"]:
            raise Refusal(
                out.shown,
                1,
                f"both {path} and {out.shown} changed since the last tangle; "
                "keep one side's change (git diff shows both) and run again",
            )
        try:
            text = disk.decode("utf-8")
        except UnicodeDecodeError:
            raise Refusal(out.shown, 1, "not UTF-8")
        if not text.endswith("\n"):
            raise Refusal(
                out.shown, text.count("\n") + 1, "no newline at the end of the file"
            )
        old = [line_text(line) for line in out.lines]
        new = text[:-1].split("\n")
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        edits += [
            e
            for op in matcher.get_opcodes()
            if op[0] != "equal"
            for e in map_edit(book, out, old, new, op)
        ]
        edited.append(out.path)
        expected[out.path] = text
    if not edits:
        return []
    layout = book.doc.layout
    data = (layout.bom + layout.newline.join(write_back(book, edits))).encode("utf-8")
    check_written_back(path, data, expected)
    write_file(
        base_of(path), os.path.basename(path), data, stat.S_IMODE(os.stat(path).st_mode)
    )
    book = open_book(path)
    write_outputs(book, tangle_book(book), allow_special_modes)
    return edited

def check_written_back(path, data, expected):
    """Refuse a write-back unless the new org DATA tangles to exactly the EXPECTED
    files.

    EXPECTED holds the edited files as they are on disk, and every other
    file as the book wrote it before.
    """
    try:
        produced = {out.path: out.text for out in tangle_book(open_book(path, data))}
    except Refusal as refusal:
        raise Refusal(path, refusal.line, f"the edit cannot be written back: {refusal}")
    for name, wanted in expected.items():
        if produced.get(name) != wanted:
            raise Refusal(
                os.path.join(os.path.dirname(path), name),
                1,
                "the edit cannot be "
                "written back so that tangling reproduces this file exactly",
            )

class OneLineErrors(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see --help)\n")

def main(argv=None):
    parser = OneLineErrors(
        prog="tangle.py",
        description=(
            "Write the src blocks of Org files into their files, as Emacs's"
            " org-babel-tangle does (Org 9.5-9.8), refusing what Org versions tangle"
            " differently."
        ),
    )
    parser.add_argument(
        "files",
        nargs="*",
        metavar="FILE.org",
        help="org files to tangle (default: mlplcode.org beside tangle/)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and show a diff if any tangled file differs",
    )
    mode.add_argument(
        "--detangle",
        action="store_true",
        help="write edits made in tangled files back into the org file",
    )
    parser.add_argument(
        "--allow-special-modes",
        action="store_true",
        help="let :tangle-mode set setuid, setgid, sticky or world-writable bits"
        " (refused otherwise)",
    )
    args = parser.parse_args(argv)
    files = args.files or [
        os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mlplcode.org"
        )
    ]
    for path in files:
        if not os.path.isfile(path):
            parser.error(f"{path}: no such file")
    status = 0
    for path in files:
        try:
            status |= run(path, args)
        except Refusal as refusal:
            print(refusal, file=sys.stderr)
            status = 1
        except OSError as error:
            print(f"{error.filename or path}: {error.strerror}", file=sys.stderr)
            status = 1
    return status

def run(path, args):
    """Tangle, check or detangle one org file; return the exit status."""
    name = os.path.relpath(path)
    if args.detangle:
        edited = detangle(path, args.allow_special_modes)
        print(
            f"{name}: "
            + (
                f"wrote back the edits in {', '.join(edited)}"
                if edited
                else "no tangled file was edited"
            )
        )
        return 0
    book = open_book(path)
    outputs = tangle_book(book)
    if args.check:
        problems = check(book, outputs)
        sys.stdout.write("".join(problems))
        verdict = count(len(problems), "problem") if problems else "all match the book"
        print(f"{name}: {count(len(outputs), 'file')}, {verdict}")
        return 1 if problems else 0
    for orphan in orphans(book, outputs):
        print(f"not in the book: {orphan} (no block of {name} writes it)")
    written = [
        p
        for p in write_outputs(book, outputs, args.allow_special_modes)
        if p != database_name(path)
    ]
    print(f"{name}: {count(len(outputs), 'file')}, {len(written)} written")
    for p in written:
        print(f"  wrote {p}")
    return 0

def count(n, noun):
    return f"{n} {noun}{'' if n == 1 else 's'}"

if __name__ == "__main__":
    sys.exit(main())
