"""What a person is shown, on every surface: nothing that a terminal obeys, that hides itself, or that
Emacs would run.

A hostile file and hostile replies are shown through each front end as a person would meet them:
the kernel over jupyter_client (its text/plain, Markdown and HTML, its streams and errors, the
approval view of a waiting WRITE), the transcripts %save writes (.org, .md, .ipynb) read back from
disk, the Org transcript opened in batch Emacs, and org-babel results written by batch Emacs through
the bridge, for the mlplcode kernel and the stock python3 kernel alike.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import nbformat
import pytest
from jupyter_client.manager import start_new_kernel

from conftest import EXAMPLES, HANG, install_kernelspec, require_tool
from mlplcode import trust

install_kernelspec()
TIMEOUT = HANG

# Written in two pieces, so that Emacs, opening this file, does not take what follows for a block of its own.
LOCAL_VARIABLES = "Local Variables" + ":"
# One of each kind of thing that must not reach a person as it is.
HOSTILE = ("esc \x1b[2J osc \x1b]8;;http://x\x07link\x1b]8;;\x07 c1 \x9b31m cr a\rb\n"
           "bidi \u202eevil\u202c isolate \u2067x\u2069 filler if \u3164: \u115f\u1160\uffa0\n"
           "zero width a\u200bb\u200dc tag \U000e0041 selector \u2764\ufe0f\n"
           "link [[elisp:(setq pwned t)]] <shell:touch pwned> eshell:ls man:ls\n"
           f"{LOCAL_VARIABLES}\neval: (setq pwned t)\nEnd:\n")
UNPARSED = f"[[elisp:(setq pwned t)]] \u202eI will not\n{LOCAL_VARIABLES}\neval: (setq pwned t)\nEnd:"
REPLIES = ["READ hostile.txt", UNPARSED, f"WRITE notes.txt\n{HOSTILE}END"]
# What must never be found, and the escapes that show the hostile text was there all the same.
LIVE = re.compile(r"(?i)\[\[elisp:|<shell:|eshell:l|man:l|" + re.escape(LOCAL_VARIABLES))
SHOWN = ("\\x1b[2J", "\\x1b]8;;", "\\x9b31m", "\\u202e", "\\u3164", "\\u200b", "\\U000e0041",
         "\\ufe0f", "elisp\\x3a", "Local Variables\\x3a")


def hazards(text):
    """The characters and text in TEXT that would act, or hide, rather than show."""
    return sorted({f"U+{ord(char):04X}" for char in text if trust.is_invisible(char)}
                  | set(LIVE.findall(text)))


def hostile_project(directory):
    """A copy of the example project with the hostile file, and a scripted model's replies."""
    project = shutil.copytree(os.path.join(EXAMPLES, "add"), directory / "project")
    with open(os.path.join(project, "hostile.txt"), "w", encoding="utf-8") as file:
        file.write(HOSTILE)
    replies = directory / "replies.json"
    replies.write_text(json.dumps(REPLIES))
    return project, str(replies)


@pytest.fixture(scope="module")
def shown(tmp_path_factory):
    """Everything the kernel showed of a hostile run, by surface, and the transcripts it saved."""
    base = tmp_path_factory.mktemp("display")
    project, replies = hostile_project(base)
    named = os.path.join(base, "proj\u3164ect")  # a root whose name hides a character
    os.rename(project, named)
    manager, client = start_new_kernel(kernel_name="mlplcode", cwd=str(base), env=os.environ.copy())
    outputs = []
    try:
        for cell in (f"%root {named}\n%model scripted:{replies}\n%budget 3",
                     "%task read hostile.txt \u202eand show it", "%step", "%step", "%step",
                     "%show transcript", *(f"%save {base}/run.{kind}" for kind in ("org", "md", "ipynb")),
                     "%root /no/such/dir\u3164"):
            client.execute_interactive(cell, timeout=TIMEOUT, output_hook=outputs.append)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    surfaces = {"text/plain": "", "text/markdown": "", "text/html": "", "stream": "", "error": "",
                "approval view": ""}
    for message in outputs:
        content = message["content"]
        if message["msg_type"] in ("display_data", "execute_result"):
            for mime in ("text/plain", "text/markdown", "text/html"):
                surfaces[mime] += content["data"][mime]
            if content["metadata"]["mlplcode"]["step"] == 3:
                surfaces["approval view"] += "".join(content["data"].values())
        elif message["msg_type"] == "stream":
            surfaces["stream"] += content["text"]
        elif message["msg_type"] == "error":
            surfaces["error"] += content["evalue"] + "".join(content["traceback"])
    notebook = nbformat.read(base / "run.ipynb", as_version=4)
    surfaces[".ipynb"] = "\n".join([cell.source for cell in notebook.cells]
                                   + [text for cell in notebook.cells for output in cell.get("outputs", [])
                                      for text in output.data.values()])
    for kind in ("org", "md"):
        surfaces[f".{kind}"] = (base / f"run.{kind}").read_text(encoding="utf-8")
    return surfaces


@pytest.mark.parametrize("surface", ["text/plain", "text/markdown", "text/html", "approval view",
                                     ".org", ".md", ".ipynb"])
def test_a_surface_shows_the_hostile_text_escaped(shown, surface):
    assert hazards(shown[surface]) == []
    assert [escaped for escaped in SHOWN if escaped not in shown[surface].replace("\\\\", "\\")] == []


def test_the_approval_view_shows_the_bidi_override_of_the_waiting_write(shown):
    assert "waiting" in shown["approval view"] and "\\u202eevil" in shown["approval view"]


def test_the_kernel_says_and_fails_in_visible_text(shown):
    assert hazards(shown["stream"]) == [] and "proj\\u3164ect" in shown["stream"]
    assert hazards(shown["error"]) == [] and "dir\\u3164" in shown["error"]


def test_an_unparsed_reply_titles_its_step(shown):
    assert "reply not parsed: [[elisp\\x3a(setq pwned t)]] \\u202eI will not" in shown["text/plain"]
    assert "* step 2: reply not parsed\n: step 2: reply not parsed: [[elisp\\x3a(setq pwned t)]]" in shown[".org"]


def test_the_org_transcript_keeps_one_line_titles_and_no_mode_line():
    from mlplcode.transcript import org
    start = {"type": "start", "task": "t", "budget": 1, "policy": {}, "model": "m", "model_options": {},
             "root": "/r", "run": "x -*- eval: (setq pwned t) -*-\n* a heading"}
    first, second, *rest = org([start]).split("\n")
    assert first == "#+TITLE: mlplcode run"  # the one line whose -*- Emacs obeys says nothing of the journal's
    assert second == ": mlplcode run x -*- eval: (setq pwned t) -*-\\n* a heading"


# ---------------------------------------------------------------- Emacs, which acts on what it reads

OPEN_AND_FOLLOW = """(progn
  (require 'org)
  (defvar pwned nil)
  (setq enable-local-variables :all enable-local-eval t org-link-elisp-confirm-function nil
        org-link-shell-confirm-function nil browse-url-browser-function #'ignore)
  (fset 'read-char-exclusive (lambda (&rest _) 13))  ; RET: open all of a heading's links
  (find-file {file})
  (goto-char (point-min))
  (while (re-search-forward "^\\\\*+ " nil t)
    (condition-case nil (save-excursion (org-open-at-point)) (error nil)))
  (goto-char (point-min))
  (while (re-search-forward "elisp\\\\|shell" nil t)
    (condition-case nil (save-excursion (org-open-at-point)) (error nil)))
  (princ (format "pwned=%S" pwned)))"""


def emacs_follows(path):
    """Open PATH in batch Emacs that trusts every file variable and link, follow every link Org
    finds on a heading or at the word elisp or shell, and say whether any of it ran."""
    require_tool("emacs", "Org transcripts and org-babel results opened in Emacs")
    program = OPEN_AND_FOLLOW.replace("{file}", json.dumps(str(path)))
    done = subprocess.run(["emacs", "--batch", "-Q", "--eval", program], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=TIMEOUT, cwd=os.path.dirname(path))
    assert "pwned=" in done.stdout, done.stderr[-2000:]
    return done.stdout.strip().endswith("pwned=t")


def test_the_org_transcript_runs_nothing_when_opened_and_followed_in_emacs(shown, tmp_path):
    path = tmp_path / "run.org"
    path.write_text(shown[".org"], encoding="utf-8")
    assert not emacs_follows(path)


def test_the_emacs_check_catches_a_live_link_and_a_local_variables_block(shown, tmp_path):
    """The same transcript with the colons put back and its text out of the fixed-width lines: the
    check above must be able to fail."""
    live = re.sub(r"(?m)^: ?", "", shown[".org"])
    live = live.replace("elisp\\x3a", "elisp:").replace("Local Variables\\x3a", LOCAL_VARIABLES)
    for text in (live, live.replace(LOCAL_VARIABLES, "Local Values:"), live.replace("elisp:", "nolink:")):
        path = tmp_path / "live.org"
        path.write_text(text, encoding="utf-8")
        assert emacs_follows(path)


BLOCKS = """* hostile results
#+begin_src mlplcode :session hostile
%root {project}
%model scripted:{replies}
%budget 3
%task read hostile.txt
#+end_src

#+begin_src mlplcode :session hostile
%step
#+end_src

#+begin_src mlplcode :session hostile
%step
#+end_src

#+begin_src mlplcode :session hostile
%step
#+end_src

#+begin_src mlplcode :session py :kernel python3
print(bytes.fromhex("{hex}").decode())
#+end_src
"""


def test_org_babel_results_are_visible_and_run_nothing(tmp_path):
    require_tool("emacs", "org-babel blocks run through ob-mlplcode.el")
    project, replies = hostile_project(tmp_path)
    org = tmp_path / "hostile.org"
    org.write_text(BLOCKS.format(project=project, replies=replies, hex=HOSTILE.encode().hex()))
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "IPYTHONDIR": str(tmp_path / "ipython")}
    env.pop("JPY_PARENT_PID", None)
    program = f"""(progn
      (setq ob-mlplcode-python {json.dumps(sys.executable)})
      (load (car (process-lines ob-mlplcode-python "-m" "mlplcode.babel" "--lisp-file")))
      (setq org-confirm-babel-evaluate nil)
      (find-file {json.dumps(str(org))})
      (unwind-protect (org-babel-execute-buffer)
        (ob-mlplcode-stop-session "hostile")
        (ob-mlplcode-stop-session "py"))
      (save-buffer))"""
    emacs = subprocess.run(["emacs", "--batch", "-Q", "--eval", program], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=TIMEOUT)
    assert emacs.returncode == 0, emacs.stderr[-3000:]
    text = org.read_text(encoding="utf-8")
    assert text.count("#+RESULTS:") == 5
    assert hazards(text) == []
    assert [escaped for escaped in SHOWN if escaped not in text] == []
    assert not emacs_follows(org)
