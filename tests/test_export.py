"""mlplcode export: the book as a web page, a PDF, Markdown and plain text.

The book is exported once per test session (the `exported` fixture), by the
command in a process of its own (Typst holds about 1.4 GB while it sets the
book, which goes with the process rather than staying in the test worker), and
the checks read those files. The PDF's text is read once, by the `pdf_words`
fixture.

Reproducibility is shown in two halves, so that the book is not exported a
second time (about 28 CPU-seconds): what Python makes of the whole book, the
labelled text given to pandoc, is the same in two processes with different
hash seeds; and the whole export, pandoc, the filter, the templates and Typst,
gives the same bytes in two processes with different hash seeds for a sample
book that has every kind of thing the book has (Parts, references, parts of a
fragment, an index, links to headings, each language of the book).
Chromium and pdftotext are Debian packages: without them the tests that
need them skip visibly, and fail under MLPLCODE_REQUIRE_TOOLS=1 (CI).
Screenshots of the web page at a phone's and a laptop's width are kept in
tests/artifacts/.
"""
import contextlib
import hashlib
import html
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import HANG, require_tool
from mlplcode.cli import main
from mlplcode import export
from mlplcode.export import BOOK, block_label, export_book, load_tangler

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
FORMS = ["mlplcode.html", "mlplcode.md", "mlplcode.txt", "mlplcode.pdf"]


MLPLCODE = os.path.join(os.path.dirname(sys.executable), "mlplcode")


def export_command(directory, hash_seed):
    """`mlplcode export --to DIRECTORY` in a process of its own, with PYTHONHASHSEED=HASH_SEED: its stdout."""
    result = subprocess.run([MLPLCODE, "export", "--to", str(directory)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONHASHSEED": str(hash_seed)}, timeout=HANG)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The book exported once, by the command, into a temporary directory: (directory, stdout)."""
    directory = tmp_path_factory.mktemp("export")
    return directory, export_command(directory, 1)


@pytest.fixture(scope="module")
def book():
    """The book as the tangler reads it."""
    return load_tangler().open_book(BOOK)


def test_each_form_is_written(exported):
    directory, _ = exported
    assert sorted(p.name for p in directory.iterdir()) == sorted(FORMS)
    assert (directory / "mlplcode.html").read_text().startswith("<!DOCTYPE html>")
    assert (directory / "mlplcode.pdf").read_bytes().startswith(b"%PDF-")
    assert (directory / "mlplcode.md").read_text().startswith("# mlplcode\n")
    assert (directory / "mlplcode.txt").read_text().startswith("mlplcode\n")


def test_progress_names_each_file_before_it_is_written(exported):
    directory, out = exported
    lines = out.splitlines()
    assert lines == [f"export: writing {directory / name}" for name in FORMS] + [
        f"export: 4 files in {directory}"]


class SourceBlocks(HTMLParser):
    """The label and the code of each <div class="src"> of a page, in order."""

    def __init__(self):
        super().__init__()
        self.blocks, self.reading, self.expect_code = [], None, False

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        if tag == "div" and "src" in classes:
            self.blocks.append({"id": dict(attrs).get("id"), "label": None, "code": ""})
            self.expect_code = True
        elif tag == "div" and "src-label" in classes:
            self.reading, self.blocks[-1]["label"] = "label", ""
        elif tag == "code" and self.reading is None and self.expect_code:
            self.reading, self.expect_code = "code", False

    def handle_endtag(self, tag):
        if (self.reading, tag) in (("label", "div"), ("code", "code")):
            self.reading = None

    def handle_data(self, data):
        if self.reading:
            self.blocks[-1][self.reading] += data


def source_blocks(page):
    parser = SourceBlocks()
    parser.feed(page)
    return [{**block, "label": block["label"] and block["label"].strip()} for block in parser.blocks]


def as_written(text):
    """TEXT with each reference set as the book writes it: <<name>>, not ⟨name⟩."""
    return text and re.sub(r"⟨([^⟨⟩\"]+)⟩", r"<<\1>>", text)


def test_the_web_page_holds_every_src_block_with_its_label(exported, book):
    directory, _ = exported
    blocks = source_blocks((directory / "mlplcode.html").read_text())
    tangler = load_tangler()
    expected = [(block_label(book, i), "\n".join(tangler.normalize_body(book.doc, block)))
                for i, block in enumerate(book.doc.blocks)]
    assert [(as_written(b["label"]), as_written(b["code"])) for b in blocks] == expected
    assert all(label for label, _ in expected), "every block of the book is tangled or named"


def test_the_web_page_stands_alone(exported):
    directory, _ = exported
    page = (directory / "mlplcode.html").read_text()
    assert '<nav id="TOC"' in page
    assert not re.search(r"<(link|img|iframe|object|embed)\b", page)
    assert re.findall(r"<script\b[^>]*>", page) == ["<script>"], "one script, inside the page"
    assert not re.search(r"<h[1-6][^>]*header-args", page)


def github_anchors(markdown):
    """The anchors GitHub gives the headings of MARKDOWN, and its lines outside code fences."""
    anchors, prose, fenced, seen = [], [], False, Counter()
    for line in markdown.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            prose.append(line)
            if heading := re.match(r"#{1,6} (.*)", line):
                slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
                anchors.append(f"{slug}-{seen[slug]}" if seen[slug] else slug)
                seen[slug] += 1
    return anchors, prose


def test_the_markdown_links_its_contents_as_github_names_the_headings(exported):
    directory, _ = exported
    anchors, prose = github_anchors((directory / "mlplcode.md").read_text())
    links = re.findall(r"\]\(#([^)]+)\)", "\n".join(prose))
    assert len(links) > 50
    assert [link for link in links if link not in anchors] == []
    assert [line for line in prose if line.startswith("<")] == [], "no raw HTML, which GitHub would filter"


SMALL_BOOK = """\
#+TITLE: Small

* Greeting
:PROPERTIES:
:header-args:python: :tangle greet.py
:END:

The helper is shown first.

#+NAME: helper
#+begin_src python :tangle no
def helper():
    return "hello"
#+end_src

Then used, with a shift that is not a reference.

#+begin_src python :noweb yes
<<helper>>


<<farewell>>


print(helper(), 1 << 2, farewell())
#+end_src

* Farewell

The farewell, =<<farewell>>=, is written in two parts; =<<nothing>>= names no fragment.

#+begin_src python :noweb-ref farewell :tangle no
def farewell():
#+end_src

Its second part returns.

#+begin_src python :noweb-ref farewell :tangle no
    return "bye"
#+end_src
"""


@pytest.fixture(scope="module")
def small_export(tmp_path_factory):
    """A small book with a named block and a :noweb-ref in two parts, exported."""
    directory = tmp_path_factory.mktemp("small")
    (directory / "book.org").write_text(SMALL_BOOK)
    with contextlib.redirect_stdout(io.StringIO()):
        export_book(str(directory / "book.org"), str(directory / "out"))
    return directory / "out"


def test_a_noweb_reference_links_to_the_block_it_names(small_export):
    page = (small_export / "mlplcode.html").read_text()
    named, user, first, second = source_blocks(page)
    assert (named["id"], named["label"]) == ("ref:helper", "⟨helper⟩")
    assert (user["id"], user["label"]) == ("file:greet.py:1", "greet.py")
    assert user["code"] == "⟨helper⟩\n\n\n⟨farewell⟩\n\n\nprint(helper(), 1 << 2, farewell())"
    assert (first["id"], second["id"]) == ("ref:farewell", "ref:farewell:2")
    assert page.count('<a class="ref" href="#ref:helper">⟨helper⟩</a>') == 1
    assert page.count('<a class="ref" href="#ref:farewell">⟨farewell⟩</a>') == 2  # code, prose
    assert page.count('class="ref"') == 3, "a shift is not a reference"
    prose = page[page.index('id="farewell"'):]
    assert '<a class="ref" href="#ref:farewell">⟨farewell⟩</a>, is' in prose
    assert "&lt;&lt;nothing&gt;&gt;" in prose


def notes(page):
    """The text of each note under a block of PAGE, in order."""
    found = re.findall(r'<div class="src-note">(.*?)</div>', page, re.S)
    return [" ".join(html.unescape(re.sub(r"<[^>]+>", "", note)).split()) for note in found]


def test_each_part_says_where_it_is_used_and_names_the_others(small_export):
    page = (small_export / "mlplcode.html").read_text()
    assert notes(page) == [
        "Used in greet.py §1.",
        "Part 1 of 2, with §2. Used in greet.py §1.",
        "Part 2 of 2, with §2. Used in greet.py §1.",
    ]
    assert re.findall(r'<div class="src-note">\s*Part 1 of 2, with <a href="([^"]+)">', page) == [
        "#ref:farewell:2"]
    assert page.count('href="#file:greet.py:1"') == 3 + 3  # three notes, three index lines


def test_an_index_of_names_and_files_closes_the_book(small_export):
    page = (small_export / "mlplcode.html").read_text()
    index = page[page.index('id="index"'):]
    items = [" ".join(html.unescape(re.sub(r"<[^>]+>", "", item)).split())
             for item in re.findall(r"<li>(.*?)</li>", index, re.S)]
    assert items == [
        "⟨farewell⟩: §2 and §2; used in greet.py §1.",
        "⟨helper⟩: §1; used in greet.py §1.",
        "greet.py: 1 block, §1.",
    ]
    markdown = (small_export / "mlplcode.md").read_text()
    assert "`<<farewell>>`: [“Farewell”](#farewell)" in markdown
    text = (small_export / "mlplcode.txt").read_text()
    assert "Used in greet.py, in “Greeting”." in " ".join(text.split())


def test_markdown_and_text_carry_the_labels_too(small_export):
    markdown = (small_export / "mlplcode.md").read_text()
    assert "`greet.py`\n\n``` python\n<<helper>>\n" in markdown
    assert "`<<helper>>`\n\n``` python\ndef helper():" in markdown
    text = (small_export / "mlplcode.txt").read_text()
    assert "greet.py\n\n    <<helper>>\n" in text


def test_a_book_that_does_not_tangle_is_not_exported(tmp_path):
    (tmp_path / "book.org").write_text(SMALL_BOOK.replace("<<helper>>", "<<nothing>>"))
    with pytest.raises(ValueError, match="does not tangle: .*<<nothing>> names no block"):
        export_book(str(tmp_path / "book.org"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_missing_tool_is_one_line_and_status_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "typst", None)
    assert main(["export", "--to", str(tmp_path / "out")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("mlplcode export: typst is not installed; "
                            "install the export tools with pip install 'mlplcode[export]'\n")
    assert not (tmp_path / "out").exists()


# A book with every kind of thing that mlplcode.org has, for the reproducibility of the export: the
# book's header lines, an introduction, Parts with chapters under them, sections below the export's
# levels, a list, inline code, links to headings, a named block, references to a fragment written
# in two parts and to a named block, a reference in the prose, each language the book has blocks
# in, files in directories of their own, and blocks tangled nowhere.
SAMPLE_BOOK = """\
#+TITLE: Sample
#+SUBTITLE: Every kind of thing the book has
#+AUTHOR: The mlplcode authors
#+OPTIONS: toc:2 num:t
#+PROPERTY: header-args :mkdirp yes :noweb-sep "\\n\\n"

* Introduction

** What it is

A sample is a book in small. Its parts:

1. a step, in [[*One step][the first chapter]];
2. its settings, in [[*Settings]];
3. the page, in [[*The deepest][the deepest section]].

Each part has =inline code=, ~a command~ and /emphasis/, and the fragment
=<<step-parts>>= is where the step's parts meet.

* Part I: The program
:PROPERTIES:
:PART: I
:END:

The program itself.

** One step
:PROPERTIES:
:header-args:python: :tangle src/sample/step.py
:END:

A step is its parts, in order.

#+begin_src python :noweb yes
def step(state):
    <<step-parts>>
    return <<answer>>(state)
#+end_src

The answer is named.

#+NAME: answer
#+begin_src python :tangle no
len
#+end_src

** The parts
:PROPERTIES:
:header-args:python: :tangle no
:END:

The first part reads.

#+begin_src python :noweb-ref step-parts
state = dict(state)
#+end_src

The second part writes, 1 << 2 times over.

#+begin_src python :noweb-ref step-parts
state["shift"] = 1 << 2
#+end_src

*** Deeper

**** The deepest

Below the levels of headings, and back to [[*What it is][the introduction]].

* Part II: Around it
:PROPERTIES:
:PART: II
:END:

What is around the program.

** Settings

Lisp for the editor.

#+begin_src emacs-lisp :tangle lisp/sample.el
(setq sample-steps 3)
#+end_src

A filter for pandoc.

#+begin_src lua :tangle export/sample.lua
function Str(element)
  return element
end
#+end_src

A page's style and its script.

#+begin_src css :tangle export/sample.css
body { margin: 0 auto; max-width: 40em; }
#+end_src

#+begin_src js :tangle export/sample.js
document.body.dataset.sample = "yes";
#+end_src

A template for Typst.

#+begin_src typst :tangle export/sample.typ
#set page(numbering: "1")
#+end_src

A hook's settings and a template's text.

#+begin_src yaml :tangle hooks.yaml
- id: sample
  entry: python3 sample.py
#+end_src

#+begin_src markdown :tangle export/sample.md
# $title$
#+end_src
"""


def export_in_a_process(book, directory, hash_seed):
    """export_book(BOOK, DIRECTORY) in a process of its own, with PYTHONHASHSEED=HASH_SEED."""
    program = "import sys\nfrom mlplcode.export import export_book\nexport_book(sys.argv[1], sys.argv[2])\n"
    result = subprocess.run([sys.executable, "-c", program, str(book), str(directory)], capture_output=True,
                            text=True, env={**os.environ, "PYTHONHASHSEED": str(hash_seed)}, timeout=HANG)
    assert result.returncode == 0, result.stderr[-3000:]


def test_two_exports_are_the_same_bytes(tmp_path):
    """Every form of the sample book, exported by two processes with different hash seeds into
    two directories, is the same bytes; and the sample has what the book has in every form."""
    (tmp_path / "book.org").write_text(SAMPLE_BOOK)
    for seed in (1, 2):
        export_in_a_process(tmp_path / "book.org", tmp_path / str(seed), seed)
    for name in FORMS:
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes(), name
    page = (tmp_path / "1" / "mlplcode.html").read_text()
    assert [block["label"] for block in source_blocks(page)] == [
        "src/sample/step.py", "⟨answer⟩", "⟨step-parts⟩", "⟨step-parts⟩", "lisp/sample.el",
        "export/sample.lua", "export/sample.css", "export/sample.js", "export/sample.typ", "hooks.yaml",
        "export/sample.md"]
    assert page.count('class="ref"') == 3 and 'id="index"' in page and '<a href="#settings">' in page
    text = " ".join(pdf_text(tmp_path / "1" / "mlplcode.pdf").split())
    assert "Part 1 of 2, with p." in text and "Settings (p. " in text
    assert "`<<step-parts>>`" in (tmp_path / "1" / "mlplcode.md").read_text()


def test_the_whole_book_is_the_same_text_for_pandoc_in_every_process():
    """What Python makes of the whole book, the labelled text that pandoc reads for every form,
    is the same in this process and in two others with other hash seeds: with the test above, two
    exports of the book are the same bytes."""
    program = ("import hashlib, sys\nfrom mlplcode.export import BOOK, labelled_text\n"
               "print(hashlib.sha256(labelled_text(BOOK).encode()).hexdigest())\n")
    digests = [subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}, timeout=HANG).stdout.strip()
               for seed in (1, 2)]
    here = hashlib.sha256(export.labelled_text(BOOK).encode()).hexdigest()
    assert digests == [here, here]


def pdf_text(pdf, *options):
    require_tool("pdftotext", "the text of the exported PDF")
    return subprocess.run(["pdftotext", *options, str(pdf), "-"], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture(scope="module")
def pdf_words(exported):
    """The text of the book's PDF, by pdftotext: a page to each form feed."""
    directory, _ = exported
    return pdf_text(directory / "mlplcode.pdf")


def test_the_pdf_has_every_chapter_title_and_tangle_target(pdf_words, book):
    text = " ".join(pdf_words.split())
    def is_part(heading):
        return any(key == "PART" for _, key, _ in heading.properties)

    chapters = [h.title for h in book.doc.headings if not h.commented and (
        h.level == 1 or h.level == 2 and is_part(h.parent))]
    targets = {label for i in range(len(book.doc.blocks)) if not (label := block_label(book, i)).startswith("<<")}
    assert len(chapters) > 5 and len(targets) > 5
    assert [title for title in chapters if title not in text] == []
    assert sorted(target for target in targets if target not in text) == []


def test_the_pdf_has_a_title_page_contents_and_numbered_pages(pdf_words):
    pages = pdf_words.split("\f")[:-1]
    assert pages[0].split()[0] == "mlplcode"
    assert pages[1].split()[0] == "Contents"
    numbers = [page.split()[-1] for page in pages]
    first = numbers.index("1")
    assert numbers[1] == "i" and first > 1
    assert numbers[first:] == [str(n) for n in range(1, len(pages) - first + 1)]


def test_no_word_of_the_pdf_runs_off_the_page(exported):
    directory, _ = exported
    boxes = pdf_text(directory / "mlplcode.pdf", "-bbox")
    width = float(re.search(r'<page width="([\d.]+)"', boxes).group(1))
    right = max(float(x) for x in re.findall(r'xMax="([\d.]+)"', boxes))
    assert right <= width - 28  # a centimetre of the margin stays clear


MEASURE = """\
<!DOCTYPE html>
<html><body style="margin: 0">
<iframe id="book" src="{page}#the-command-line" width="{width}" height="1600" style="border: 0; display: block"></iframe>
<pre id="measurement"></pre>
<script>
function firstCharacterLeft(line) {{
  const text = line.ownerDocument.createTreeWalker(line, NodeFilter.SHOW_TEXT).nextNode();
  if (!text) return null;
  const range = line.ownerDocument.createRange();
  range.setStart(text, 0);
  range.setEnd(text, 1);
  return range.getBoundingClientRect().left;
}}
document.getElementById("book").addEventListener("load", function () {{
  const page = this.contentDocument.documentElement;
  const blocks = Array.from(page.querySelectorAll("pre"));
  const overflowing = blocks.filter(pre => pre.scrollWidth > pre.clientWidth
    || pre.getBoundingClientRect().right > page.clientWidth);
  const lines = Array.from(page.querySelectorAll("pre > code.sourceCode > span"));
  const misaligned = lines.filter(line => {{
    const left = firstCharacterLeft(line);
    return left !== null && Math.abs(left - line.getBoundingClientRect().left) > 0.5;
  }});
  document.getElementById("measurement").textContent = JSON.stringify({{
    width: page.clientWidth,
    scrollWidth: page.scrollWidth,
    blocks: blocks.length,
    overflowing: overflowing.map(pre => pre.textContent.slice(0, 80)),
    whiteSpace: Array.from(new Set(blocks.map(pre => getComputedStyle(pre.querySelector("code") || pre).whiteSpace))),
    lines: lines.length,
    misaligned: misaligned.map(line => line.textContent.slice(0, 80)),
    words: page.querySelectorAll(":not(pre) > code .nb").length,
    brokenWords: Array.from(page.querySelectorAll(":not(pre) > code .nb"))
      .filter(word => word.getClientRects().length > 1).map(word => word.textContent),
    codeToText: parseFloat(getComputedStyle(page.querySelector("div.src pre code")).fontSize)
      / parseFloat(getComputedStyle(Array.from(page.querySelectorAll("p"))
        .find(p => !p.closest("header, nav") && !p.className)).fontSize),
  }});
}});
</script>
</body></html>
"""


@pytest.mark.parametrize("width", [390, 1280])
def test_the_web_page_fits_a_phone_and_a_laptop(exported, width):
    """Render the page in an iframe WIDTH pixels wide, measure it, and keep a screenshot.

    The iframe gives the page exactly that width (a headless window has a
    minimum width); the script writes its measurement into the DOM, which
    --dump-dom prints, in the same run that takes the screenshot. Code
    blocks must wrap rather than overflow, and every line of code must start
    at the left edge of its block (wrapped lines hang deeper).
    """
    require_tool("chromium", "the web page's layout at phone and laptop widths")
    directory, _ = exported
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / f"mlplcode-{width}.png"
    frame = directory.parent / f"measure-{width}.html"
    frame.write_text(MEASURE.format(page=(directory / "mlplcode.html").as_uri(), width=width))
    with tempfile.TemporaryDirectory(prefix="mlplcode-chromium-") as profile:
        result = subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--hide-scrollbars", "--allow-file-access-from-files",
             f"--window-size={width},1600", f"--screenshot={screenshot}", "--dump-dom", frame.as_uri()],
            capture_output=True, text=True, timeout=HANG)
    print(f"screenshot at {width} px: {screenshot}")
    found = re.search(r'<pre id="measurement">(.+?)</pre>', result.stdout)
    assert found, f"no measurement from chromium: {result.stderr[-2000:]}"
    measurement = json.loads(html.unescape(found.group(1)))
    assert measurement["width"] == width
    assert measurement["scrollWidth"] <= measurement["width"]
    assert measurement["blocks"] > 200
    assert measurement["overflowing"] == []
    assert measurement["whiteSpace"] == ["pre-wrap"]
    assert measurement["lines"] > 2000
    assert measurement["misaligned"] == [], "a line of code must start at its block's left edge"
    assert measurement["words"] > 1000
    assert measurement["brokenWords"] == [], "a word of inline code never breaks"
    assert measurement["codeToText"] >= 0.85
    assert screenshot.stat().st_size > 10_000


class Chromium:
    """A headless Chromium showing URL, driven over the DevTools protocol on a pipe.

    The page runs in real time, as in a reader's browser: --dump-dom's virtual
    time runs no frames, so a page that waits for one (to mark the section in
    view after a scroll) would never be seen to act.
    """

    def __init__(self, url, width, height, profile):
        to_chrome, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome = os.pipe()

        def pipe_on_3_and_4():  # Chromium reads the protocol on fd 3, writes it on fd 4
            reading, writing = os.dup(to_chrome), os.dup(from_chrome)
            os.dup2(reading, 3)
            os.dup2(writing, 4)

        self.process = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--remote-debugging-pipe",
             f"--window-size={width},{height}", url],
            preexec_fn=pipe_on_3_and_4, close_fds=False, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome)
        os.close(from_chrome)
        self.received, self.last_id = b"", 0
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(target for target in targets if target["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"],
                                 flatten=True)["sessionId"]

    def call(self, method, session=None, **params):
        self.last_id += 1
        message = {"id": self.last_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.received:
                chunk = os.read(self.from_chrome, 1 << 16)
                assert chunk, "chromium closed the protocol's pipe"
                self.received += chunk
            raw, self.received = self.received.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self.last_id:
                assert "error" not in answer, answer["error"]
                return answer["result"]

    def evaluate(self, expression):
        """The value of the JavaScript EXPRESSION in the page, a promise awaited."""
        result = self.call("Runtime.evaluate", self.session, expression=expression,
                           awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait_for(self, url, seconds=60):
        deadline = time.monotonic() + seconds
        while self.evaluate("location.href + ' ' + document.readyState") != f"{url} complete":
            assert time.monotonic() < deadline, f"chromium did not load {url}"
            time.sleep(0.1)

    def close(self):
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        os.close(self.to_chrome)
        os.close(self.from_chrome)


FOLLOW = """(async () => {
  const wait = ms => new Promise(done => setTimeout(done, ms));
  const marked = () => {
    const mark = document.querySelector("nav#TOC a.current");
    return mark && mark.getAttribute("href");
  };
  const inView = () => {
    let found = null;
    for (const link of document.querySelectorAll('nav#TOC a[href^="#"]')) {
      const heading = document.getElementById(decodeURIComponent(link.hash.slice(1)));
      if (heading && heading.getBoundingClientRect().top <= innerHeight / 5) {
        found = link.getAttribute("href");
      }
    }
    return found;
  };
  const settled = async () => {
    for (let tries = 0; tries < 50 && marked() !== inView(); tries++) await wait(100);
    return marked();
  };
  const before = await settled();
  const link = Array.from(document.querySelectorAll("a.ref"))
    .find(a => a.getBoundingClientRect().top > innerHeight);
  const href = link.getAttribute("href");
  link.click();
  await wait(100);
  const target = document.getElementById(decodeURIComponent(href.slice(1)));
  return {
    before, href, hash: location.hash, target: target && target.className,
    top: target && target.getBoundingClientRect().top, marked: await settled(),
    inView: inView(),
  };
})()"""


def test_a_reference_in_the_web_page_leads_to_its_block_and_the_contents_follow(exported):
    """In Chromium, click the first reference below the window: the page scrolls to the
    block it names, and the contents come to mark the section now in view."""
    require_tool("chromium", "following a reference in the web page")
    directory, _ = exported
    url = (directory / "mlplcode.html").as_uri() + "#the-command-line"
    with tempfile.TemporaryDirectory(prefix="mlplcode-chromium-",
                                     ignore_cleanup_errors=True) as profile:
        browser = Chromium(url, 1280, 900, profile)
        try:
            browser.wait_for(url)
            seen = browser.evaluate(FOLLOW)
        finally:
            browser.close()
    assert seen["before"] == "#the-command-line"
    assert seen["hash"] == seen["href"] and seen["href"].startswith("#ref:")
    assert seen["target"] == "src"
    assert 0 <= seen["top"] < 60, "the block is at the top of the window, its label in sight"
    assert seen["marked"] == seen["inView"] != seen["before"]


def test_the_pdf_says_where_each_part_is_used_with_pages(pdf_words, small_export):
    small = " ".join(pdf_text(small_export / "mlplcode.pdf").split())
    assert "Part 1 of 2, with p. 2. Used in greet.py, p. 1." in small
    text = " ".join(pdf_words.split())
    assert len(re.findall(r"Used in \S+, p\. \d+\.", text)) > 50
    # the index: each name with its pages and where it is used; each file with its pages
    assert re.search(r"⟨agent-start⟩: p\. \d+; used in src/mlplcode/agent\.py, p\. \d+\.", text)
    assert re.search(r"src/mlplcode/loop\.py: \d+ blocks?, pp?\. \d+", text)


def test_the_book_says_how_to_read_it_in_each_form():
    text = Path(BOOK).read_text()
    section = text[text.index("** How to read it"):text.index("** The plan of the book")]
    for form in ["Emacs", "web page", "PDF", "Markdown", "GitHub", "plain text", "Jupyter", "mlplcode export"]:
        assert form in section, form


FILLER = "\n\n".join(["A paragraph that is only there to make the page long."] * 60)

LINKED_BOOK = f"""\
#+TITLE: Linked

* Greeting
:PROPERTIES:
:header-args:python: :tangle greet.py
:END:

The farewell is in [[*Farewell][chapter "Farewell"]], the word in [[*The =hello=
word][the section on the word]], [[*Farewell]] has no description, and the
last is [[*The deepest][the deepest]]. Not links: =[[*Nowhere]]=, ~[[*Nowhere][x]]~.

** The =hello= word

#+begin_src python
print("hello")  # [[*Nowhere]]
#+end_src

#+begin_example
[[*Nowhere][an example]]
#+end_example

*** Deeper

**** The deepest

Below the levels of headings.

{FILLER}

* Farewell

Back to [[*Greeting][chapter
"Greeting"]].

{FILLER}
"""


@pytest.fixture(scope="module")
def linked_export(tmp_path_factory):
    """A small book whose prose links to its headings, exported."""
    directory = tmp_path_factory.mktemp("linked")
    (directory / "book.org").write_text(LINKED_BOOK)
    with contextlib.redirect_stdout(io.StringIO()):
        export_book(str(directory / "book.org"), str(directory / "out"))
    return directory / "out"


def line_of(text, words):
    """The number of the line of TEXT on which WORDS first appear."""
    return text[:text.index(words)].count("\n") + 1


def test_a_link_to_a_heading_leads_to_it_in_the_web_page(linked_export):
    page = (linked_export / "mlplcode.html").read_text()
    body = " ".join(page[page.index('id="greeting"'):].split())
    deepest = f"heading:{line_of(LINKED_BOOK, '**** The deepest')}"
    assert ('The farewell is in <a href="#farewell">chapter "Farewell"</a>, the word in '
            '<a href="#the-hello-word">the section on the word</a>, '
            '<a href="#farewell">Farewell</a> has no description, and the last is '
            f'<a href="#{deepest}">the deepest</a>.') in body
    assert '<a href="#greeting">chapter "Greeting"</a>' in body
    assert f'The deepest <span id="{deepest}"></span>' in body, "an item of a list"
    assert body.count("[[*Nowhere]") == 4, "verbatim, code, a comment, an example: text"
    assert "spurious-link" not in page and "<em>" not in page


def test_a_link_to_a_heading_leads_to_its_github_anchor_in_markdown(linked_export):
    markdown = (linked_export / "mlplcode.md").read_text()
    anchors, prose = github_anchors(markdown)
    text = " ".join("\n".join(prose).split())
    assert ('The farewell is in [chapter "Farewell"](#farewell), the word in [the section '
            'on the word](#the-hello-word), [Farewell](#farewell) has no description, '
            'and the last is [the deepest](#deeper).') in text
    assert 'Back to [chapter "Greeting"](#greeting).' in text
    links = re.findall(r"\]\(#([^)]+)\)", "\n".join(prose))
    assert [link for link in links if link not in anchors] == []
    assert "<span" not in markdown


def test_a_link_to_a_heading_is_its_description_in_plain_text(linked_export):
    text = " ".join((linked_export / "mlplcode.txt").read_text().split())
    assert ('The farewell is in chapter "Farewell", the word in the section on the word, '
            'Farewell has no description, and the last is the deepest.') in text
    assert 'Back to chapter "Greeting".' in text
    assert "[[*heading" not in text and "_chapter" not in text


def test_a_link_to_a_heading_is_a_link_with_its_page_in_the_pdf(linked_export):
    labelled = export.labelled_text(str(linked_export.parent / "book.org"))
    typst = " ".join(export.pandoc(export.parsed(labelled), "typst", []).decode().split())
    assert '#link(<farewell>)[chapter \\"Farewell\\"]~(#page-ref("farewell");)' in typst
    pages = pdf_text(linked_export / "mlplcode.pdf").split("\f")
    farewell = next(page.split()[-1] for page in pages if "CHAPTER 2" in page)
    deepest = next(page.split()[-1] for page in pages if "The deepest" in page
                   and "Below the levels" in page)
    text = " ".join(" ".join(pages).split())
    assert farewell != "1"
    assert (f'The farewell is in chapter "Farewell" (p. {farewell}), the word in the '
            f'section on the word (p. 1), Farewell (p. {farewell}) has no description, and '
            f'the last is the deepest (p. {deepest}).') in text
    assert 'Back to chapter "Greeting" (p. 1).' in text


@pytest.mark.parametrize("change, on, message", [
    (("[[*Farewell][chapter", "[[*Farewells][chapter"), "The farewell",
     "[[*Farewells]] names no heading"),
    (("* Farewell\n", "* Farewell\n\n* Farewell\n"), "The farewell",
     "[[*Farewell]] names 2 headings, on lines "),
    (("* Farewell\n", "* COMMENT Farewell\n"), "The farewell",
     "[[*Farewell]] names a COMMENT or archived heading, which is not exported"),
    (("**** The deepest", "**** The deepest :ARCHIVE:"), "last is",
     "[[*The deepest]] names a COMMENT or archived heading, which is not exported"),
])
def test_a_link_to_no_heading_or_to_two_is_refused_before_anything_is_written(
        tmp_path, change, on, message):
    book = LINKED_BOOK.replace(*change)
    (tmp_path / "book.org").write_text(book)
    where = f"{tmp_path / 'book.org'}:{line_of(book, on)}"
    with pytest.raises(ValueError) as refused:
        export_book(str(tmp_path / "book.org"), str(tmp_path / "out"))
    assert str(refused.value).startswith(f"the book has a broken link: {where}: {message}")
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_the_command_refuses_a_broken_link_in_one_line(tmp_path, monkeypatch, capsys):
    book = LINKED_BOOK.replace("[[*Greeting][chapter", "[[*Greetings][chapter")
    (tmp_path / "mlplcode.org").write_text(book)
    monkeypatch.setattr(export, "BOOK", str(tmp_path / "mlplcode.org"))
    assert main(["export", "--to", str(tmp_path / "out")]) == 2
    where = f"{tmp_path / 'mlplcode.org'}:{line_of(book, 'Back to')}"
    assert capsys.readouterr().err == (
        f"mlplcode export: the book has a broken link: {where}: "
        "[[*Greetings]] names no heading\n")
    assert not (tmp_path / "out").exists()


def test_a_link_to_a_heading_that_the_check_did_not_see_stops_the_filter(tmp_path):
    (tmp_path / "book.org").write_text(LINKED_BOOK.replace("*** Deeper", "*** Deeper, as [[*Greeting]] says"))
    labelled = export.labelled_text(str(tmp_path / "book.org"))
    with pytest.raises(RuntimeError, match=r"did not check: \[\[\*Greeting\]\]"):
        export.html(export.parsed(labelled))


def test_every_link_of_the_book_to_a_heading_names_exactly_one(book):
    """The book's references to chapters and sections, as Org links, each lead somewhere."""
    tangler = load_tangler()
    links = export.heading_links(tangler, book)  # refuses the first broken one
    titles = Counter(tangler.link_heading(h.title) for h in book.doc.headings if h.title)
    named = [h for h in book.doc.headings if h.line in {link["heading"] for link in links}]
    assert [h.title for h in named if titles[tangler.link_heading(h.title)] != 1] == []


LAND = """(async () => {
  const wait = ms => new Promise(done => setTimeout(done, ms));
  const link = document.querySelector('p a[href="#farewell"]');
  const before = scrollY;
  link.click();
  await wait(100);
  const heading = document.getElementById("farewell");
  let mark = null;
  for (let tries = 0; tries < 50; tries++) {
    mark = document.querySelector("nav#TOC a.current");
    if (mark && mark.getAttribute("href") === "#farewell") break;
    await wait(100);
  }
  return {
    before, after: scrollY, hash: location.hash, tag: heading.tagName,
    title: heading.textContent, top: heading.getBoundingClientRect().top,
    style: getComputedStyle(link).fontStyle, marked: mark && mark.getAttribute("href"),
  };
})()"""


def test_a_click_on_a_chapter_reference_lands_on_the_chapter(linked_export):
    """In Chromium, click the link to chapter "Farewell" at the top of the page: its
    heading comes to the top of the window, and the contents mark it."""
    require_tool("chromium", "following a link to a chapter in the web page")
    url = (linked_export / "mlplcode.html").as_uri()
    with tempfile.TemporaryDirectory(prefix="mlplcode-chromium-",
                                     ignore_cleanup_errors=True) as profile:
        browser = Chromium(url, 1280, 900, profile)
        try:
            browser.wait_for(url)
            seen = browser.evaluate(LAND)
        finally:
            browser.close()
    assert seen["before"] == 0 and seen["after"] > 900
    assert seen["hash"] == "#farewell"
    assert (seen["tag"], seen["title"].split()) == ("H1", ["2", "Farewell"])
    assert abs(seen["top"]) < 1, "the chapter's heading is at the top of the window"
    assert seen["style"] == "normal", "the description as written, not in italics"
    assert seen["marked"] == "#farewell"


def test_in_the_book_itself_a_click_on_chapter_the_loop_lands_on_it(exported):
    """The same click in the exported book: the first reference of chapter "One step" to
    chapter "The loop" brings that chapter's heading to the top of the window."""
    require_tool("chromium", "following a link to a chapter in the book's web page")
    directory, _ = exported
    page = (directory / "mlplcode.html").read_text()
    target = re.search(r'<h1[^>]* id="([^"]+)"[^>]*>\s*(?:<span[^>]*>[^<]*</span>\s*)?The loop</h1>', page)
    assert target, "chapter The loop has a heading"
    land = LAND.replace("#farewell", "#" + target.group(1)).replace('"farewell"', json.dumps(target.group(1)))
    url = (directory / "mlplcode.html").as_uri()
    with tempfile.TemporaryDirectory(prefix="mlplcode-chromium-", ignore_cleanup_errors=True) as profile:
        browser = Chromium(url, 1280, 900, profile)
        try:
            browser.wait_for(url)
            seen = browser.evaluate(land)
        finally:
            browser.close()
    assert seen["hash"] == "#" + target.group(1) and seen["after"] > seen["before"]
    assert seen["title"].split()[-2:] == ["The", "loop"]
    assert abs(seen["top"]) < 1, "the chapter's heading is at the top of the window"
