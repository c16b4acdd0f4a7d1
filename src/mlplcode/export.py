"""Write the book as HTML, PDF, Markdown and plain text, evaluating nothing."""
import importlib.util
import os
import sys

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BOOK = os.path.join(CHECKOUT, "mlplcode.org")
TANGLER = os.path.join(CHECKOUT, "tangle", "tangle.py")
DEFAULT_DIRECTORY = os.path.join(CHECKOUT, "export", "build")

def export_file(name):
    """The path of a file this chapter tangles for pandoc or Typst: filter, stylesheet, template."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "export_files", name)

INSTALL = "pip install 'mlplcode[export]'"

class MissingTool(Exception):
    """An export tool that is not installed; the message says how to install it."""

def check_tools():
    """Refuse, before anything is written, when pypandoc, its pandoc, or typst is missing."""
    try:
        import pypandoc
        import typst  # noqa: F401 (imported again where it is used)
    except ImportError as error:
        raise MissingTool(f"{error.name} is not installed; install the export tools with {INSTALL}") from None
    try:
        pypandoc.get_pandoc_path()
    except OSError:
        raise MissingTool(f"pypandoc finds no pandoc; install the export tools with {INSTALL}") from None

def load_tangler():
    """Import tangle/tangle.py from the checkout: only the tangler knows where each block goes."""
    spec = importlib.util.spec_from_file_location("tangle", TANGLER)
    tangler = importlib.util.module_from_spec(spec)
    sys.modules["tangle"] = tangler  # its dataclasses look their module up here
    spec.loader.exec_module(tangler)
    return tangler

def block_label(book, i):
    """Block I's label: the file it tangles to, else the <<name>> it is used by, else None."""
    block, params = book.doc.blocks[i], book.params[i]
    hidden = block.heading and (block.heading.commented or block.heading.archived)
    if params["tangle"][0] != "no" and not hidden:
        return params["tangle"][0]
    name = block.name or params.get("noweb-ref", (None,))[0]
    return f"<<{name}>>" if name else None

def labelled_text(path):
    """The book at PATH with each block's label on its #+begin_src line, as :label "...".

    Refuses a book that does not tangle.
    """
    tangler = load_tangler()
    try:
        book = tangler.open_book(path)
        tangler.tangle_book(book)
    except tangler.Refusal as refusal:
        raise ValueError(f"the book does not tangle: {refusal}") from None
    lines = list(book.doc.lines)
    for i, block in enumerate(book.doc.blocks):
        label = block_label(book, i)
        if label:
            lines[block.line - 1] += f' :label "{label}"'
    return "\n".join(lines)

def pandoc(text, writer, options):
    """The labelled org TEXT converted by pandoc's WRITER, through the book's filter, as bytes."""
    import pypandoc
    converted = pypandoc.convert_text(text, writer, format="org+gfm_auto_identifiers", extra_args=[
        "--standalone", "--toc", "--lua-filter=" + export_file("book.lua"), *options])
    return converted.encode("utf-8")

def html(text):
    """One web page that needs no other file: the stylesheet goes inside it."""
    with open(export_file("book.css"), encoding="utf-8") as f:
        style = f.read()
    return pandoc(text, "html5", ["--toc-depth=2", "--number-sections", "--metadata=lang=en",
                                  "--metadata=document-css=false",
                                  "--variable=header-includes=<style>\n" + style + "</style>"])

PDF_CLOCK = 0  # seconds since 1970: any fixed instant will do

def pdf(text):
    """The book typeset by Typst, with its own fonts only and a fixed clock."""
    import typst
    source = pandoc(text, "typst", ["--toc-depth=2", "--template=" + export_file("book-template.typ")])
    return typst.compile(source, ignore_system_fonts=True, timestamp=PDF_CLOCK)

def markdown(text):
    """GitHub Markdown, under the book's title: every chapter one heading level down."""
    return pandoc(text, "gfm", ["--toc-depth=3", "--shift-heading-level-by=1",
                                "--template=" + export_file("book-template.md")])

def plain_text(text):
    """Plain text, by Project Gutenberg's conventions: chapter titles in capitals."""
    return pandoc(text, "plain+gutenberg", ["--toc-depth=2"])

FORMS = [
    ("mlplcode.html", html),
    ("mlplcode.md", markdown),
    ("mlplcode.txt", plain_text),
    ("mlplcode.pdf", pdf),
]

def export_book(path, directory):
    """Write every form of the book at PATH into DIRECTORY; return the paths written."""
    check_tools()
    text = labelled_text(path)
    os.makedirs(directory, exist_ok=True)
    written = []
    for name, form in FORMS:
        output = os.path.join(directory, name)
        print(f"export: writing {output}", flush=True)
        content = form(text)
        with open(output, "wb") as f:
            f.write(content)
        written.append(output)
    return written

def command_export(args):
    """mlplcode export: the book in four forms; a missing tool is one line and status 1."""
    if not os.path.isfile(BOOK):
        raise ValueError(f"export needs the book of a source checkout; {BOOK} not found")
    try:
        written = export_book(BOOK, args.to)
    except MissingTool as missing:
        print(f"mlplcode export: {missing}", file=sys.stderr)
        return 1
    print(f"export: {len(written)} files in {args.to}")
    return 0
