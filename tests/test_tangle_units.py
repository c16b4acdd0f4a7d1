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


def refusal(tangle, text, name="book.org"):
    """The Refusal raised by tangling the org TEXT in memory, or None."""
    try:
        book = tangle.open_book(name, text.encode("utf-8"))
        tangle.tangle_book(book)
    except tangle.Refusal as error:
        return error
    return None


def outputs(tangle, text):
    book = tangle.open_book("book.org", text.encode("utf-8"))
    return {out.path: out.text for out in tangle.tangle_book(book)}


def block(body, args=":tangle out.py", above=""):
    return f"#+TITLE: t\n* H\n{above}#+begin_src python {args}\n{body}\n#+end_src\n"


@pytest.mark.parametrize("blank", ["\f", "\xa0", "\u3000", "\u2003", "\u205f", "\u200b"])
def test_an_odd_blank_after_indentation_is_refused_where_it_changes_the_cut(tangle, blank):
    error = refusal(tangle, block(f"  {blank} b = 2\n    a = 1"))
    assert error and error.line == 4 and f"U+{ord(blank):04X}" in error.reason
    error = refusal(tangle, block(f"    a = 1\n  {blank}b = 2\n    c = 3"))
    assert error and error.line == 5
    assert refusal(tangle, block(f"  {blank}a = 1\n{blank}b = 2")).line == 4


@pytest.mark.parametrize("blank", ["\f", "\xa0", "\u3000"])
def test_an_odd_blank_that_changes_nothing_is_tangled(tangle, blank):
    assert outputs(tangle, block(f"  a = 1\n  {blank}b = 2")) == {"out.py": f"a = 1\n{blank}b = 2\n"}
    assert outputs(tangle, block(f"a = 1\n{blank}b = 2")) == {"out.py": f"a = 1\n{blank}b = 2\n"}


@pytest.mark.parametrize("language", ["dockerfile", "nix", "org", "Java", "c", "my-language"])
def test_languages_that_no_org_expands_are_tangled(tangle, language):
    text = block("x", f":tangle out").replace("python", language)
    assert outputs(tangle, text) == {"out": "x\n"}


@pytest.mark.parametrize("language, file", [("C", "ob-C"), ("C++", "ob-C"), ("java", "ob-java"),
                                            ("R", "ob-R"), ("sql", "ob-sql"), ("lisp", "ob-lisp")])
def test_languages_that_org_expands_are_refused_naming_the_file(tangle, language, file):
    error = refusal(tangle, block("x", ":tangle out").replace("python", language))
    assert error and error.line == 3 and file in error.reason and "configuration" in error.reason


def test_the_upper_header_line_wins(tangle):
    above = "#+HEADER: :tangle upper.py\n#+HEADER: :tangle lower.py :padline no\n"
    assert outputs(tangle, block("x = 1", "", above)) == {"upper.py": "x = 1\n"}
    assert outputs(tangle, block("x = 1", ":tangle line.py", above)) == {"upper.py": "x = 1\n"}


def test_a_reference_that_matches_a_name_only_ignoring_case_says_why(tangle):
    text = ("#+TITLE: t\n* H\n#+NAME: helper\n#+begin_src python\nx = 1\n#+end_src\n"
            "#+begin_src python :tangle out.py :noweb yes\n<<Helper>>\n#+end_src\n")
    error = refusal(tangle, text)
    assert error and error.line == 8 and "case-fold-search" in error.reason


@pytest.mark.parametrize("args, name", [
    (":tangle a.py\xa0:padline no", "a.py\xa0:padline no"),
    (":tangle b\u3000b.py", "b\u3000b.py"),
    (":tangle c.py\u2003", "c.py\u2003"),
])
def test_wide_blanks_in_header_arguments_are_ordinary_characters(tangle, args, name):
    assert outputs(tangle, block("x = 1", args)) == {name: "x = 1\n"}
    above = f"#+HEADER: {args}\n"
    assert outputs(tangle, block("x = 1", "", above)) == {name: "x = 1\n"}


@pytest.mark.parametrize("line, where", [
    ("#+begin_src python\xa0:tangle a.py", 3), ("#+begin_src python :tangle \xa0\"a.py\"", 3),
    ("#+begin_src python :tangle a.py\f", 3), ("#+begin_src python :tangle a.py\v", 3),
])
def test_blanks_org_reads_differently_in_a_block_line_are_refused(tangle, line, where):
    error = refusal(tangle, f"#+TITLE: t\n* H\n{line}\nx = 1\n#+end_src\n")
    assert error and error.line == where


def test_a_name_or_drawer_with_a_wide_blank_is_still_refused(tangle):
    assert refusal(tangle, block("x = 1", above="#+NAME: a\xa0b\n")).line == 3
    drawer = "#+TITLE: t\n* H\n:PROPERTIES:\n:header-args: :tangle\u3000a.py\n:END:\n"
    assert refusal(tangle, drawer + "#+begin_src python\nx\n#+end_src\n").line == 4


@pytest.mark.parametrize("mode", ["4755", "2755", "1777", "777", "646"])
def test_special_modes_are_refused_without_the_flag(tangle, mode, tmp_path):
    org = tmp_path / "book.org"
    org.write_text(block("x = 1", f":tangle out.py :tangle-mode (identity #o{mode})"))
    book = tangle.open_book(str(org))
    with pytest.raises(tangle.Refusal, match="allow-special-modes") as error:
        tangle.write_outputs(book, tangle.tangle_book(book))
    assert error.value.line == 3 and not (tmp_path / "out.py").exists()
    tangle.write_outputs(book, tangle.tangle_book(book), allow_special_modes=True)
    assert (tmp_path / "out.py").stat().st_mode & 0o7777 == int(mode, 8)


def test_noweb_expansion_has_a_budget(tangle, monkeypatch):
    monkeypatch.setattr(tangle, "MAX_EXPANSION", 100)
    text = ("#+TITLE: t\n* H\n#+NAME: a\n#+begin_src python\nx = 1\n#+end_src\n"
            "#+NAME: b\n#+begin_src python :noweb yes\n<<a>>\n<<a>>\n#+end_src\n"
            "#+begin_src python :tangle out.py :noweb yes\n" + "<<b>>\n" * 20 + "#+end_src\n")
    error = refusal(tangle, text)
    assert error and "noweb expansion passes 100 characters" in error.reason
    monkeypatch.setattr(tangle, "MAX_EXPANSION", 10_000)
    assert outputs(tangle, text)["out.py"] == "x = 1\n" * 40


@pytest.mark.parametrize("mode", ["044", "0044", "007", "000"])
def test_a_mode_that_org_9_6_stops_on_is_refused(tangle, mode):
    error = refusal(tangle, block("x = 1", f":tangle out.py :tangle-mode (identity #o{mode})"))
    assert error and error.line == 3 and "Org 9.6" in error.reason
