"""Unit tests of tangle/tangle.py's translations of Org's patterns, checked against what Org does.

The corpus and the fuzzer compare whole files with Emacs; these pin down the
small functions whose corners decide those files, with examples taken from
Org's behaviour (each noted where it surprised us).
"""
import importlib.util
import random
import sys
from pathlib import Path

import pytest

TANGLER = Path(__file__).resolve().parent.parent / "tangle" / "tangle.py"


@pytest.fixture(scope="module")
def tangle():
    spec = importlib.util.spec_from_file_location("tangle_under_test", TANGLER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def test_the_quick_header_split_agrees_with_the_walk(tangle):
    """Without quotes or brackets balanced_split takes a shortcut; it must cut where the walk cuts.

    A "(" that is never closed is an ordinary character for Org, so appending
    one forces the walk without changing where it cuts.
    """
    rng = random.Random(7)
    for _ in range(5000):
        text = "".join(rng.choice(" \t:ab") for _ in range(rng.randint(0, 14)))
        walked = tangle.balanced_split(text + "(")
        offset, last = walked[-1]
        walked = walked[:-1] + ([(offset, last[:-1])] if last[:-1] else [])
        assert tangle.balanced_split(text) == walked, repr(text)


@pytest.mark.parametrize("text, pieces", [
    (":tangle a.py :mkdirp yes", [":tangle a.py", "mkdirp yes"]),
    (":tangle a(b.py :mkdirp yes", [":tangle a(b.py", "mkdirp yes"]),  # never closed: a character
    (":tangle a(b :c) :mkdirp yes", [":tangle a(b :c)", "mkdirp yes"]),  # closed: keeps its colon
    (':noweb-sep " :x" :tangle a', [':noweb-sep " :x"', "tangle a"]),
    (":a [x (y] :b", [":a [x (y]", "b"]),  # "]" closes nothing while "(" is open: both unbalanced
    (":a [x (y] z) :b", [":a [x (y] z)", "b"]),
])
def test_header_arguments_split_as_org_splits_them(tangle, text, pieces):
    """Each expected value is what org-babel-balanced-split returns in Org 9.5."""
    assert [piece for _, piece in tangle.balanced_split(text)] == pieces


@pytest.mark.parametrize("text, is_tag", [
    (":tag:", True),
    (":ta\u0301g:", True),      # a combining accent is a letter to Emacs's [[:alnum:]]
    (":x\u00b2:", False),       # a superscript two is a number to Python, not to Emacs
    (":@home:#1:%x:_u:", True),
    (":\u30bf\u30b0:", True),
    (":a-b:", False),
])
def test_tag_characters_are_emacs_alnum(tangle, text, is_tag):
    assert tangle.is_tag_text(text) == is_tag


@pytest.mark.parametrize("title, search", [
    ("A[1/2]b", "A b"),                 # a cookie becomes a blank, not nothing
    ("Two [%][/] cookies [10/]", "Two cookies"),
    ("Tab\tand  spaces \t", "Tab and spaces"),
    ("Trailing em space\u2003", "Trailing em space\u2003"),  # not a blank for Org's [ \t]
    ("COMMENT\t[%] alpha", "alpha"),    # Org drops COMMENT before a tab here, though the heading is no comment
])
def test_link_search_of_a_heading(tangle, title, search):
    assert tangle.link_heading(title) == search


@pytest.mark.parametrize("lines, target", [
    (["Prose ends with <<here>>", "#+begin_src python"], "here"),
    (["A <<target>> in the middle.", "#+begin_src python"], None),
    (["<<at the start>>", "#+begin_src python"], None),   # Org's pattern wants a character before it
    (["#+NAME: a<<b>>", "#+begin_src python", "<<body>>"], "b"),
    (["prose", "#+begin_src python", "x<<body>>"], None),  # the first body line is not looked at
])
def test_a_target_above_a_block(tangle, lines, target):
    assert tangle.target_above(lines, lines.index(next(l for l in lines if l.startswith("#+begin")))) == target
