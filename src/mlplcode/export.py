"""Write the book as HTML, PDF, Markdown and plain text, evaluating nothing."""

import importlib.util
import json
import os
import re
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.dirname(os.path.dirname(HERE))
BOOK = os.path.join(CHECKOUT, "mlplcode.org")
TANGLER = os.path.join(CHECKOUT, "tangle", "tangle.py")
DEFAULT_DIRECTORY = os.path.join(CHECKOUT, "export", "build")

def export_file(name):
    """The path of a file this chapter tangles for pandoc or Typst."""
    return os.path.join(HERE, "export_files", name)

INSTALL = "pip install 'mlplcode[export]'"

class MissingTool(Exception):
    """An export tool that is not installed; the message says how to install it."""

def check_tools():
    """Refuse, before anything is written, when pypandoc, its pandoc or typst is
    missing."""
    try:
        import pypandoc
        import typst  # noqa: F401 (imported again where it is used)
    except ImportError as error:
        raise MissingTool(
            f"{error.name} is not installed; install the export tools with {INSTALL}"
        ) from None
    try:
        pypandoc.get_pandoc_path()
    except OSError:
        raise MissingTool(
            f"pypandoc finds no pandoc; install the export tools with {INSTALL}"
        ) from None

def load_tangler():
    """Import tangle/tangle.py from the checkout: only it knows where each block
    goes."""
    spec = importlib.util.spec_from_file_location("tangle", TANGLER)
    tangler = importlib.util.module_from_spec(spec)
    sys.modules["tangle"] = tangler  # its dataclasses look their module up here
    spec.loader.exec_module(tangler)
    return tangler

def read_book(path):
    """The tangler, and the book at PATH tangled in memory; refuses a book that does not
    tangle."""
    tangler = load_tangler()
    try:
        book = tangler.open_book(path)
        tangler.tangle_book(book)
    except tangler.Refusal as refusal:
        raise ValueError(f"the book does not tangle: {refusal}") from None
    return tangler, book

def block_file(book, i):
    """The file block I is tangled to, or None."""
    heading = book.doc.blocks[i].heading
    hidden = heading and (heading.commented or heading.archived)
    target = book.params[i]["tangle"][0]
    return None if target == "no" or hidden else target

def block_name(book, i):
    """The name a reference would give block I: its #+NAME, else its :noweb-ref, else
    None."""
    return book.doc.blocks[i].name or book.params[i].get("noweb-ref", (None,))[0]


def block_label(book, i):
    """Block I's label as plain text: its file, else <<name>>, else None."""
    file, name = block_file(book, i), block_name(book, i)
    return file or (f"<<{name}>>" if name else None)

def references(tangler, book, i):
    """The names block I refers to, in order; none unless the tangler expanded them."""
    mode = tangler.parameter(book, i, "noweb", "no")
    if i not in book.uses or not any(tangler.NOWEB_EXPANDS[mode]):
        return []
    return [
        match.group(1)
        for line in tangler.body(book, i)
        for match in tangler.NOWEB.finditer(line)
    ]

def definitions(tangler, book):
    """Each name the book refers to, with the blocks that define it: its parts, in
    order."""
    defined = {}
    for i, block in enumerate(book.doc.blocks):
        for name in references(tangler, book, i):
            if name not in defined:
                where = (book.doc.path, block.line)
                defined[name] = tangler.resolve(book, name, where)
    return defined

def anchors(book, defined):
    """A readable identifier for each block, unique in the book."""
    parts = {
        j: (name, k)
        for name, blocks in defined.items()
        for k, j in enumerate(blocks, 1)
    }
    ids, taken, files = [], set(), Counter()
    for i, block in enumerate(book.doc.blocks):
        file, name = block_file(book, i), block_name(book, i)
        if i in parts:
            name, k = parts[i]
            wanted = f"ref:{name}" + (f":{k}" if k > 1 else "")
        elif file:
            files[file] += 1
            wanted = f"file:{file}:{files[file]}"
        else:
            wanted = f"ref:{name}" if name else f"block:{block.line}"
        wanted = re.sub(r"[^\w.:/-]", "-", wanted)
        anchor, n = wanted, 1
        while anchor in taken:
            n += 1
            anchor = f"{wanted}~{n}"
        taken.add(anchor)
        ids.append(anchor)
    return ids

def cross_references(tangler, book):
    """Each block's file, name, links and definitions, by identifier; the index's
    entries."""
    defined = definitions(tangler, book)
    ids = anchors(book, defined)
    refers = [
        list(dict.fromkeys(references(tangler, book, i))) for i in range(len(ids))
    ]
    fragments = {
        name: {
            "name": name,
            "parts": [ids[j] for j in parts],
            "used_in": [ids[i] for i in range(len(ids)) if name in refers[i]],
        }
        for name, parts in defined.items()
    }
    blocks, files = {}, {}
    for i, anchor in enumerate(ids):
        file = block_file(book, i)
        if file:
            files.setdefault(file, []).append(anchor)
        entry = {
            "file": file,
            "name": block_name(book, i),
            "links": {name: fragments[name]["parts"][0] for name in refers[i]},
            "defines": [
                fragments[name] for name, parts in defined.items() if i in parts
            ],
        }
        blocks[anchor] = {
            key: value for key, value in entry.items() if value is not None
        }
    return {
        "blocks": blocks,
        "fragments": [fragments[name] for name in sorted(defined, key=str.lower)],
        "files": [{"path": path, "blocks": files[path]} for path in sorted(files)],
    }

def labelled_text(path):
    """The book at PATH for pandoc: each block's :anchor, each link to a heading
    checked, and its cross-references at the end.

    Refuses a book that does not tangle, or that has a broken link.
    """
    tangler, book = read_book(path)
    links = cross_references(tangler, book)
    lines = list(book.doc.lines)
    for block, anchor in zip(book.doc.blocks, links["blocks"]):
        lines[block.line - 1] += f' :anchor "{anchor}"'
    lines = with_heading_links(tangler, book, lines)
    data = json.dumps(links, ensure_ascii=True)
    return "\n".join(lines + ["", "#+begin_export mlplcode", data, "#+end_export", ""])

def headings_by_title(tangler, book):
    """The book's headings by the title a link names them with: a list for each."""
    titled = {}
    for heading in book.doc.headings:
        if heading.title:
            titled.setdefault(tangler.link_heading(heading.title), []).append(heading)
    return titled

def only_heading(where, title, headings):
    """The one heading of HEADINGS that the link at WHERE names by TITLE; refuses none,
    several, or one the export leaves out."""
    broken = f"the book has a broken link: {where}: [[*{title}]] names"
    if not headings:
        raise ValueError(f"{broken} no heading")
    if len(headings) > 1:
        lines = ", ".join(str(heading.line) for heading in headings)
        raise ValueError(f"{broken} {len(headings)} headings, on lines {lines}")
    if headings[0].commented or headings[0].archived:
        raise ValueError(
            f"{broken} a COMMENT or archived heading, which is not exported"
        )
    return headings[0]

NOT_PROSE = re.compile(r"[ \t]*(?:#(?:\+|[ \t]|$)|:)|\*+ ")
VERBATIM_ELEMENT = re.compile(
    r"[ \t]*(?:#\+begin_(?:src|example|export|comment)(?![^ \t])|:[-\w]+:[ \t]*$)", re.I
)


def prose(tangler, lines):
    """Each paragraph of LINES in which Org reads links: its first line's index, its
    text."""
    start = i = 0
    while i <= len(lines):
        line = lines[i] if i < len(lines) else ""
        if line.strip() and not NOT_PROSE.match(line):
            i += 1
            continue
        if start < i:
            yield start, "\n".join(lines[start:i])
        if VERBATIM_ELEMENT.match(line):
            i = tangler.container_end(lines, i) or i
        i += 1
        start = i

VERBATIM = (
    r"(?<![^\s\-({'\"])(?P<marker>[=~])\S(?:[^\n]*?(?:\n[^\n]*?)?\S)?(?P=marker)"
    r"(?![^\s\-.,:!?;'\")}\[])"
)
HEADING_LINK = r"\[\[\*(?P<target>[^][]+)\](?:\[(?P<description>.+?)\])?\]"
TEXT_OBJECTS = re.compile(f"{VERBATIM}|{HEADING_LINK}", re.S)


def one_line(text):
    """TEXT with each line break, and the blanks around it, one blank, as Org reads a
    link."""
    return re.sub(r"[ \t]*\n[ \t]*", " ", text)

def position(first, text, offset):
    """The line index and the column of OFFSET in TEXT, a paragraph from line index
    FIRST."""
    before = text[:offset]
    return first + before.count("\n"), offset - (before.rfind("\n") + 1)

def heading_links(tangler, book):
    """Each link of the prose to a heading: where it is, the heading's line, its text.

    Refuses a link to a heading that the book does not have exactly once, or that the
    export leaves out.
    """
    titled, links = headings_by_title(tangler, book), []
    for first, text in prose(tangler, book.doc.lines):
        for match in TEXT_OBJECTS.finditer(text):
            if match.group("target") is None:
                continue
            start, end = (position(first, text, k) for k in match.span())
            title = tangler.link_heading(one_line(match.group("target")))
            where = f"{book.doc.path}:{start[0] + 1}"
            heading = only_heading(where, title, titled.get(title, []))
            description = one_line(match.group("description") or title)
            links.append({"start": start, "end": end, "heading": heading.line,
                          "description": description})
    return links

HEADING_MARK = "MLPLCODE-HEADING"


def headline_levels(lines):
    """How deep the export's headings go: H: of the book's #+OPTIONS, else Org's 3."""
    levels = 3
    for line in lines:
        if line.startswith("*"):
            break
        if options := re.match(r"[ \t]*#\+options:(.*)", line, re.I):
            for found in re.finditer(r"(?<!\S)H:(\d+)", options.group(1)):
                levels = int(found.group(1))
    return levels


def mark_heading(tangler, lines, heading, levels):
    """Put the property MLPLCODE-HEADING, the heading's line, in its drawer; or, below
    LEVELS, a target with it in its title."""
    number = heading.line
    if heading.level > levels:
        line = lines[number - 1]
        tags = heading.tags and re.search(r"[ \t]+:[^ \t]+:[ \t]*$", line)
        end = tags.start() if tags else len(line.rstrip(" \t"))
        lines[number - 1] = f"{line[:end]} <<heading:{number}>>{line[end:]}"
        return
    i = tangler.after_planning(lines, number)
    mark = f":{HEADING_MARK}: {number}"
    if i < len(lines) and tangler.PROPERTIES_START.fullmatch(lines[i]):
        lines[i] += "\n" + mark
    else:
        lines[i - 1] += "\n" + "\n".join([":PROPERTIES:", mark, ":END:"])

def with_heading_links(tangler, book, lines):
    """LINES with each link to a heading on one line, its target the heading's line,
    and each heading named marked with it."""
    links, levels = heading_links(tangler, book), headline_levels(book.doc.lines)
    named = {link["heading"] for link in links}
    for heading in book.doc.headings:
        if heading.line in named:
            mark_heading(tangler, lines, heading, levels)
    for link in reversed(links):
        (a, i), (b, j) = link["start"], link["end"]
        text = f"[[*heading:{link['heading']}][{link['description']}]]"
        lines[a] = lines[a][:i] + text + lines[b][j:]
        lines[a + 1 : b + 1] = [None] * (b - a)
    return [line for line in lines if line is not None]

def parsed(text):
    """The labelled org TEXT read by pandoc: its document tree, as JSON."""
    import pypandoc

    return pypandoc.convert_text(text, "json", format="org+gfm_auto_identifiers")

def pandoc(document, writer, options):
    """DOCUMENT, the tree that parsed gives, converted by pandoc's WRITER, through the
    book's filter, as bytes."""
    import pypandoc

    converted = pypandoc.convert_text(
        document,
        writer,
        format="json",
        extra_args=[
            "--standalone",
            "--toc",
            "--lua-filter=" + export_file("book.lua"),
            *options,
        ],
    )
    return converted.encode("utf-8")

def html(document):
    """One web page that needs no other file: the stylesheet and the script go inside
    it."""
    with open(export_file("book.css"), encoding="utf-8") as f:
        style = f.read()
    with open(export_file("book.js"), encoding="utf-8") as f:
        script = f.read()
    return pandoc(
        document,
        "html5",
        [
            "--toc-depth=2",
            "--number-sections",
            "--metadata=lang=en",
            "--metadata=document-css=false",
            "--variable=header-includes=<style>\n" + style + "</style>",
            "--variable=include-after=<script>\n" + script + "</script>",
        ],
    )

PDF_CLOCK = 0  # seconds since 1970: any fixed instant will do

def pdf(document):
    """The book typeset by Typst, with its own fonts only and a fixed clock."""
    import typst

    source = pandoc(
        document,
        "typst",
        ["--toc-depth=2", "--template=" + export_file("book-template.typ")],
    )
    return typst.compile(source, ignore_system_fonts=True, timestamp=PDF_CLOCK)

def markdown(document):
    """GitHub Markdown, under the book's title: every chapter one heading level down."""
    return pandoc(
        document,
        "gfm",
        [
            "--toc-depth=3",
            "--shift-heading-level-by=1",
            "--template=" + export_file("book-template.md"),
        ],
    )

def plain_text(document):
    """Plain text, by Project Gutenberg's conventions: chapter titles in capitals."""
    return pandoc(document, "plain+gutenberg", ["--toc-depth=2"])

FORMS = [
    ("mlplcode.html", html),
    ("mlplcode.md", markdown),
    ("mlplcode.txt", plain_text),
    ("mlplcode.pdf", pdf),
]

def export_book(path, directory):
    """Write every form of the book at PATH into DIRECTORY; return the paths written."""
    check_tools()
    document = parsed(labelled_text(path))
    os.makedirs(directory, exist_ok=True)
    written = []
    for name, form in FORMS:
        output = os.path.join(directory, name)
        print(f"export: writing {output}", flush=True)
        content = form(document)
        with open(output, "wb") as f:
            f.write(content)
        written.append(output)
    return written

def command_export(args):
    """mlplcode export: the book in four forms; a missing tool is one line and status
    1."""
    if not os.path.isfile(BOOK):
        raise ValueError(
            f"export needs the book of a source checkout; {BOOK} not found"
        )
    try:
        written = export_book(BOOK, args.to)
    except MissingTool as missing:
        print(f"mlplcode export: {missing}", file=sys.stderr)
        return 1
    print(f"export: {len(written)} files in {args.to}")
    return 0
