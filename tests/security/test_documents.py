"""The documents a run is written into run nothing and render no markup of the run's text.

A hostile run puts Org's and Markdown's live constructs into every text a transcript shows (the
task, a file READ, an unparsed reply, a path an error quotes, a DONE summary, a note, the summary
of a compaction), and an evaluation's report gets them in its task directories' names and a model
spec (issue 25, section 4). The Org transcript is checked line by line (only headings, labels and
fixed-width lines of mlplcode's own shapes) and exported by batch Emacs to HTML with evaluation
allowed; the Markdown transcript, the notebook's Markdown and the report are rendered by a
CommonMark renderer. Each check is shown to fail on the same text written raw.
"""
import json
import os
import re
import subprocess
from types import SimpleNamespace

import nbformat
import pytest
from markdown_it import MarkdownIt

from conftest import HANG, require_tool
from mlplcode import Agent
from mlplcode.eval import CHART_TEXT, as_markdown as report_markdown, sections as report_sections, summarize
from mlplcode.transcript import save

ORG_LIVE = """src_sh{touch pwned-inline; echo ran} src_emacs-lisp[:exports results]{(setq pwned t)} call_boom()
{{{input-file}}} {{{keyword(TITLE)}}} @@html:<script>alert(1)</script>@@ [fn:1] a_b x^2 \\alpha
[[https://evil.example/][a harmless link]] *bold* /it/ =verbatim= +struck+ <<target>> <2030-01-01 Tue>
* a forged heading
#+INCLUDE: "/etc/passwd"
#+MACRO: boom (eval (progn (setq pwned t) (concat "macro" "-" "ran")))
{{{boom}}}
#+begin_src emacs-lisp :exports results
(setq pwned t)
#+end_src
#+begin_export html
<script>alert(2)</script>
#+end_export
#+CALL: boom()
#+name: boom
#+begin_src sh :exports results
touch pwned-call; echo ran
#+end_src
"""
MARKDOWN_LIVE = """<img src=x onerror=alert(1)> <script>alert(3)</script> ![i](http://evil.example/x.png)
[click](http://evil.example/) *em* _em_ **strong** `code` $\\alpha$ &lt;b&gt; ~~struck~~ | a | b |
# a forged heading
---
> a quote
"""
PAYLOAD = ORG_LIVE + MARKDOWN_LIVE
FIRST = PAYLOAD.split("\n", 1)[0]


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """A run whose every text is the payload, saved as .org, .md and .ipynb."""
    base = tmp_path_factory.mktemp("documents")
    project = base / "project"
    project.mkdir()
    (project / "README.txt").write_text(PAYLOAD)
    replies = [
        "READ README.txt",
        PAYLOAD,                                 # a reply with no action: shown, and its first line titles it
        f"READ {FIRST}",                         # a path that the error quotes
        "DONE " + FIRST,                         # a summary the loop refuses, in the step's title
    ]
    script = base / "replies.json"
    script.write_text(json.dumps(replies))
    agent = Agent.start(PAYLOAD, str(project), f"scripted:{script}", journal=str(base / "run.jsonl"))
    agent.note(PAYLOAD)
    agent.step(3)
    agent.compact()  # a scripted model's summary: each action and its observation's first line
    agent.step()
    for kind in ("org", "md", "ipynb"):
        save(agent.journal, str(base / f"run.{kind}"))
    return base


ORG_LINE = re.compile(
    r"#\+TITLE: mlplcode run|\* (step \d+: (READ|SEARCH|WRITE|PATCH|RUN|DONE|reply not parsed)"
    r"|note from the human|compaction|waiting|stop)|[a-z ,]+:|:( .*)?|")


def foreign_org_lines(text):
    """The lines of TEXT that are not of a shape the Org transcript writes."""
    return [line for line in text.split("\n") if not ORG_LINE.fullmatch(line)]


def test_every_line_of_the_org_transcript_is_of_mlplcode_s_own_shape(hostile_run):
    text = (hostile_run / "run.org").read_text()
    assert foreign_org_lines(text) == []
    assert "src_sh{touch pwned-inline; echo ran}" in text and ": * a forged heading" in text  # shown, as it was
    assert [line for line in text.split("\n") if line.startswith("* ")] == [
        "* note from the human", "* step 1: READ", "* step 2: reply not parsed", "* step 3: READ", "* compaction",
        "* step 4: DONE"]
    assert foreign_org_lines("* h\n" + ORG_LIVE)  # the check can fail


EXPORT = """(progn
  (require 'org) (require 'ox-html) (require 'ob-shell) (require 'ob-emacs-lisp)
  (defvar pwned nil)
  (setq org-confirm-babel-evaluate nil org-export-use-babel t enable-local-eval t
        enable-local-variables :all org-export-with-broken-links t)
  (find-file {file})
  (condition-case err (org-html-export-to-html) (error (princ (format "export-error=%S\\n" err))))
  (princ (format "pwned=%S" pwned)))"""


def export_org(path):
    """Export the Org file PATH to HTML in batch Emacs that evaluates whatever it is asked to: whether
    anything ran, and the page."""
    require_tool("emacs", "the Org transcript exported with evaluation allowed")
    for name in ("pwned-inline", "pwned-call"):
        if os.path.exists(path.parent / name):
            os.remove(path.parent / name)
    done = subprocess.run(["emacs", "--batch", "-Q", "--eval", EXPORT.replace("{file}", json.dumps(str(path)))],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=HANG, cwd=path.parent)
    assert "pwned=" in done.stdout, done.stderr[-2000:]
    ran = done.stdout.strip().endswith("pwned=t") or any(
        os.path.exists(path.parent / name) for name in ("pwned-inline", "pwned-call"))
    page = path.with_suffix(".html")
    return ran, page.read_text() if page.exists() else ""


RENDERED_ORG = ("<script", "<sub>", "<sup>", 'href="https://evil', "root:x:0", "macro-ran", "<b>bold",
                "<i>it", "<del>", 'class="footref"', "a forged heading</h")


def test_the_org_transcript_exported_with_evaluation_allowed_runs_and_renders_nothing(hostile_run, tmp_path):
    path = tmp_path / "run.org"
    path.write_text((hostile_run / "run.org").read_text())
    ran, page = export_org(path)
    assert not ran
    assert page and [shown for shown in RENDERED_ORG if shown in page] == []
    assert "src_sh{touch pwned-inline; echo ran}" in page and "&lt;script&gt;alert(2)" in page


def test_the_org_export_check_catches_the_same_text_written_raw(tmp_path):
    path = tmp_path / "raw.org"
    path.write_text("#+TITLE: raw\n* h\n" + ORG_LIVE + "\n[fn:1] a footnote\n")
    ran, page = export_org(path)
    assert ran and "<script" in page and "<sub>" in page and 'href="https://evil' in page


def render(markdown):
    return MarkdownIt("commonmark").enable("table").render(markdown)


RENDERED_MARKDOWN = ("<img", "<script", "<a ", "<em>", "<blockquote", "<hr", "a forged heading</h")


def rendered_markup(markdown):
    page = render(markdown)
    return [shown for shown in RENDERED_MARKDOWN if shown in page]


def unescaped_dollars(markdown):
    """The dollar signs outside fences that Jupyter would take for LaTeX."""
    outside = re.sub(r"(?ms)^(`{3,})[^\n]*\n.*?^\1$", "", markdown)
    return re.findall(r"(?<!\\)\$", outside)


def test_the_markdown_transcript_renders_no_markup_of_the_run_s_text(hostile_run):
    text = (hostile_run / "run.md").read_text()
    assert rendered_markup(text) == [] and unescaped_dollars(text) == []
    assert render(text).count("<h1>") == 1 and "&lt;img src=x onerror=alert(1)&gt;" in render(text)
    assert set(rendered_markup(MARKDOWN_LIVE)) == set(RENDERED_MARKDOWN) and unescaped_dollars(MARKDOWN_LIVE)


def test_the_notebook_renders_no_markup_of_the_run_s_text(hostile_run):
    notebook = nbformat.read(hostile_run / "run.ipynb", as_version=4)
    markdown = [cell.source for cell in notebook.cells if cell.cell_type == "markdown"]
    markdown += [output.data["text/markdown"] for cell in notebook.cells for output in cell.get("outputs", [])]
    pages = [output.data["text/html"] for cell in notebook.cells for output in cell.get("outputs", [])]
    assert len(markdown) > 5 and len(pages) > 4
    for text in markdown:
        assert rendered_markup(text) == [] and unescaped_dollars(text) == [], text[:200]
    for page in pages:
        assert "<script" not in page and "<img" not in page and "mathjax_ignore" in page


HOSTILE_NAMES = ["<img src=x onerror=alert(1)>", "[click](http://evil.example/)", "a|b", "# heading\n---",
                 "$\\alpha$", "__init__", "*em*", "`tick`", "<script>alert(4)</script>"]


def trial(model, task):
    return {"model": model, "task": task, "stop": "done", "done": True, "check_passed": True,
            "false_success": False, "done_refused": 0, "steps": 3, "calls": 3, "prompt_tokens": 100,
            "seconds": 1.0, "unsafe": {"attempted": [], "refused": 0, "executed": []},
            "check": {"sandboxed": True}}


def test_the_eval_report_shows_task_names_and_specs_as_text(tmp_path):
    tasks = [SimpleNamespace(name=name) for name in HOSTILE_NAMES]
    specs = ["scripted:<img src=y onerror=alert(5)>.json", "openai:[m](http://evil.example/)@http://h"]
    records = [trial(model, task.name) for model in (1, 2) for task in tasks]
    report = summarize("hostile", tasks, specs, 1, records)
    markdown = report_markdown(report_sections(report), "chart.png")
    page = render(markdown.replace(f"![{CHART_TEXT}](chart.png)", ""))  # the chart, the one image of ours
    shown = [found for found in RENDERED_MARKDOWN if found in page]
    assert shown == [] and unescaped_dollars(markdown) == []
    assert page.count("<img") == 0 and page.count("<h1>") == 1 and page.count("<h2>") == 2
    for table in re.findall(r"<table>.*?</table>", page, re.S)[1:]:
        assert table.count("<tr>") == 1 + len(HOSTILE_NAMES)  # one row a task: no name splits a row
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "[click](http://evil.example/)" in page


@pytest.mark.parametrize("spec", ["scripted:/x/$\\nosuchcommand{$.json", "openai:$x^2$@http://h", "echo$", "$$"])
def test_a_model_s_name_is_drawn_in_the_chart_as_text(spec):
    """matplotlib reads $...$ in a label as LaTeX: a spec made of it would stop the report, or be drawn as
    a formula. The chart is drawn, and a spec without a dollar sign draws it the same way as before."""
    from mlplcode.eval import chart
    tasks = [SimpleNamespace(name="t")]
    report = summarize("hostile", tasks, [spec, "echo"], 1, [trial(1, "t"), trial(2, "t")])
    assert chart(report).startswith(b"\x89PNG")
