"""Differential fuzzing of tangle/tangle.py against Emacs's org-babel-tangle.

A seeded generator writes small org books that mix the constructs where our
tangler and Emacs have disagreed before: blanks of every kind in header
lines, letter case, affiliated keywords, blocks inside other elements,
headings with cookies, tags, Unicode and %-signs in link comments, odd
:tangle paths, modes. Each book is tangled by our tangler and by batch Emacs
(all books in one Emacs) in fresh directories. For every book our tangler
must either refuse it cleanly (exit 1, FILE:LINE, no traceback, nothing
written) or succeed where Emacs succeeds, with byte-identical files and
identical modes, and then pass its own --check.

Two more tests need no Emacs: corpus books with random splinters inserted or
cut must be tangled or refused without a traceback (a refusal writing
nothing), and tangled files edited at random must be written back or
refused by --detangle, again without a traceback, a write-back passing
--check.

The run is bounded: FUZZ_COUNT books from FUZZ_SEED, a few seconds of Emacs.
MLPLCODE_FUZZ_COUNT and MLPLCODE_FUZZ_SEED run a longer search locally; a
failure prints the book, to be turned into a corpus file.
"""
import concurrent.futures
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from test_tangle_parity import (Result, describe_difference, require_emacs, run_emacs_batch,
                                run_ours, snapshot)

FUZZ_COUNT = int(os.environ.get("MLPLCODE_FUZZ_COUNT", "120"))
FUZZ_SEED = int(os.environ.get("MLPLCODE_FUZZ_SEED", "20241201"))
ORG_NAME = "fuzz.org"


# ---------------------------------------------------------------- the generator

@dataclass
class Book:
    lines: list = field(default_factory=list)
    features: set = field(default_factory=set)
    names: list = field(default_factory=list)

    def add(self, *lines, feature=None):
        self.lines += lines
        if feature:
            self.features.add(feature)


ODD_BLANKS = ["\u00a0", "\u2003", "\u200b", "\u000b", "\u3000"]
WORDS = ["alpha", "beta", "Gamma", "délta", "naïve", "日本", "x", "TODO", "COMMENT", "100%",
         "%s", "a/b", "tab\there"]
TITLE_EXTRAS = ["[1/2]", "[50%]", "[/]", "[%]", "[3/]", "%start-line", "%file", "%d",
                "\u2003", "\u00a0", "\t", "  ", "é", "e\u0301", "🙂"]
TAGS = [":tag:", ":ta\u0301g:", ":x\u00b2:", ":@home:#1:", ":ARCHIVE:", ":noexport:", ":été:",
        ":a:b:", ":tag:\u2003"]
FILES = ["a.py", "a.py", "b.py", "b.py", "./dot.py", "sub/c.py", "./sub/./d.py", "p(q).py", "p(q.py",
         '"with space.py"', "x[1].py"]
LANGUAGES = ["python"] * 30 + ["Python", "PYTHON", "sh", "sh", "emacs-lisp", "text", "C"]
AFFILIATED = ["#+CAPTION: a caption", "#+CAPTION[short]: a caption", "#+CAPTION[two words]: c",
              "#+RESULTS:", "#+RESULTS[abc123]: x", "#+ATTR_HTML: :class c", "#+ATTR_LATEX-x: :float t",
              "#+HEADER: :padline no", "#+HEADERS: :mkdirp yes", "#+TITLE: not affiliated",
              "#+PLOT: title:x", "#+caption: lower case"]


def blank(rng, odd=0.005):
    """A blank between two words of a header line: usually a space, sometimes a tab or an odd one."""
    r = rng.random()
    if r < odd:
        return rng.choice(ODD_BLANKS)
    return rng.choice([" ", " ", " ", "\t", "  ", " \t"])


def title(rng, book):
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.5:
        words.insert(rng.randint(0, len(words)), rng.choice(TITLE_EXTRAS))
        book.features.add("heading-unicode-cookie-percent")
    text = " ".join(words)
    if rng.random() < 0.2:
        text = text.replace(" ", rng.choice(["", "\t", "  "]), 1)
    return text


def heading(rng, book, level):
    parts = ["*" * level]
    if rng.random() < 0.15:
        parts.append(rng.choice(["TODO", "DONE"]))
    if rng.random() < 0.1:
        parts.append("[#A]")
    if rng.random() < 0.06:
        parts.append("COMMENT")
    parts.append(title(rng, book))
    line = " ".join(parts)
    if rng.random() < 0.3:
        line += rng.choice([" ", "\t", "   "]) + rng.choice(TAGS)
        book.features.add("heading-tags")
    if rng.random() < 0.1:
        line += rng.choice([" ", "\t", "\u2003", "\u00a0"])
        book.features.add("heading-unicode-cookie-percent")
    book.add(line)
    if rng.random() < 0.05:
        book.add(rng.choice(["SCHEDULED: <2024-01-01 Mon>", "CLOSED: [2024-01-02 Tue]"]))
    if rng.random() < 0.35:
        drawer(rng, book, heading_level=True)


def target(rng):
    """A :tangle value; now and then one that Emacs and we must both handle with care."""
    return rng.choice(FILES) if rng.random() < 0.97 else rng.choice(["sub//e.py", "../up.py", "./a.py"])


def header_args(rng, book):
    """A header-args value for properties: a few safe keys."""
    pieces = []
    if rng.random() < 0.1:
        pieces.append(":noweb-ref " + rng.choice(["part", "other"]))
    if rng.random() < 0.7:
        pieces.append(f":tangle{blank(rng)}{target(rng)}")
    if rng.random() < 0.5:
        pieces.append(":mkdirp yes")
    if rng.random() < 0.2:
        pieces.append(":comments " + rng.choice(["link", "yes", "no"]))
    if rng.random() < 0.2:
        pieces.append(":padline no")
    if not pieces or rng.random() < 0.03:
        return "nil"
    return blank(rng, 0.002).join(pieces)


def property_key(rng, book):
    key = "header-args" + rng.choice(["", "", ":python", ":python", ":Python", ":sh"])
    if rng.random() < 0.2:
        key += "+"
    if rng.random() < 0.1:
        key = rng.choice([key.upper(), key.title()])
        book.features.add("case")
    return key


def drawer(rng, book, heading_level):
    lines = [":PROPERTIES:"]
    keys = {}
    for _ in range(rng.randint(1, 2)):
        key = property_key(rng, book)
        keys.setdefault(key.lower(), key)
    for key in sorted(keys.values(), key=lambda k: k.endswith("+")):
        separator = rng.choice([" "] * 12 + ["  ", "\t"]) if rng.random() < 0.98 else rng.choice(ODD_BLANKS)
        lines.append(f":{key}:{separator}{header_args(rng, book)}")
        book.features.add("whitespace-drawer")
    if heading_level and rng.random() < 0.1:
        lines.append(":CUSTOM_ID: cid")
    lines.append(":END:")
    book.add(*lines)


def keyword_property(rng, book):
    value = header_args(rng, book)
    book.add(f"#+PROPERTY:{rng.choice([' ', ' ', chr(9), ''])}{property_key(rng, book)}{blank(rng)}{value}",
             feature="whitespace-keyword")


def body(rng, book, indent):
    """A block's lines: code, noweb references, escapes, blank and indented lines."""
    lines = []
    extra = rng.choice(["", "", "", "", "  ", "    "] * 5 + ["\t"])
    for n in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.15 and book.names:
            reference = rng.choice(book.names + ["part", "other", "missing"][: 2 + (rng.random() < 0.1)])
            lines.append(f"{rng.choice(['', '    ', 'x = '] if n else ['', 'x = '])}<<{reference}>>"
                         + rng.choice(["", "", "  # after"]))
            book.features.add("noweb")
        elif r < 0.2:
            lines.append(",* escaped star")
        elif r < 0.21:
            lines.append(rng.choice(["#+end_src but not the end", "#+begin_src inner", ":END:"]))
        elif r < 0.26 and n:
            lines.append(rng.choice(["", "", "  "]))
        elif r < 0.3 and n:
            lines.append(f"    nested_{n} = True")
        else:
            lines.append(f"v{n} = {rng.randint(0, 99)}  # {rng.choice(WORDS)}")
    if not lines[-1].strip():
        lines.append("end = True")
    return [indent + extra + line if line else line for line in lines]


def begin_line(rng, book, language):
    args = []
    if rng.random() < 0.6:
        args.append(f":tangle{blank(rng)}{target(rng)}")
        if rng.random() < 0.6:
            args.append(":mkdirp yes")
    if rng.random() < 0.25 and (language in ("python", "sh", "emacs-lisp") or rng.random() < 0.1):
        args.append(":comments " + rng.choice(["link", "link", "yes", "yes", "no"] * 10 + ["both"]))
    if rng.random() < 0.3:
        args.append(":noweb " + rng.choice(["yes", "yes", "no-export", "strip-export", "tangle"] * 4 + ["eval"]))
    if rng.random() < 0.15:
        args.append(":padline no")
    if rng.random() < 0.1:
        args.append(":tangle-mode (identity #o" + rng.choice(["700", "750", "644", "755", "0640"]) + ")")
        book.features.add("modes")
    if rng.random() < 0.08:
        args.append(rng.choice([':shebang "#!/bin/sh"', ':shebang "#!/usr/bin/env python3"', ':shebang ""']))
        book.features.add("modes")
    if rng.random() < 0.1:
        args.append(":noweb-ref " + rng.choice(["part", "other"]))
        if rng.random() < 0.3:
            args.append(':noweb-sep "' + rng.choice(["\\n# sep\\n", "", "\\n\\n"]) + '"')
    if rng.random() < 0.005:
        args.insert(0, rng.choice(["-n", "-i", "-r"]))
    if rng.random() < 0.08:
        args += [":tangle no", ":var n=1"]
    after_begin = rng.choice([" ", " ", " ", "  "]) if rng.random() < 0.99 else rng.choice(["\t", "\u00a0"])
    after_language = blank(rng)
    if rng.random() < 0.05:
        book.features.add("case")
    begin = rng.choice(["#+begin_src", "#+begin_src", "#+BEGIN_SRC", "#+Begin_Src"])
    line = f"{begin}{after_begin}{language}"
    if args:
        line += after_language + blank(rng, 0.002).join(args)
    book.features.add("whitespace-begin")
    return line


def block(rng, book, indent=""):
    language = rng.choice(LANGUAGES)
    if language != language.lower():
        book.features.add("case")
    if rng.random() < 0.5:
        for _ in range(rng.randint(1, 3)):
            book.add(indent + rng.choice(AFFILIATED), feature="affiliated")
    if rng.random() < 0.35:
        name = rng.choice(["helper", "util", "part"]) + str(len(book.names) + 1)
        if rng.random() < 0.05 and book.names:
            name = rng.choice(book.names).capitalize()
        if rng.random() < 0.02:
            name = ""
        book.add(f"{indent}#+NAME:{rng.choice([' ', chr(9)])}{name}", feature="affiliated")
        if rng.random() < 0.3:
            book.add(indent + rng.choice(AFFILIATED[:7]))
    else:
        name = None
    book.add(indent + begin_line(rng, book, language))
    book.add(*body(rng, book, indent))
    if name:
        book.names.append(name)
    book.add(indent + rng.choice(["#+end_src", "#+end_src", "#+END_SRC", "#+end_src  "]))


def element(rng, book):
    """A block, alone or inside another element, or some prose."""
    r = rng.random()
    if r < 0.12:
        book.add(rng.choice(["Prose ends with a target <<here>>", "A <<target>> in the middle.",
                             "Plain prose."]), feature="where")
        block(rng, book)
    elif r < 0.2:
        kind = rng.choice([("\\begin{equation}", "\\end{equation}"), ("#+begin_quote", "#+end_quote"),
                           (":LOGBOOK:", ":END:"), ("#+begin_example", "#+end_example"),
                           ("#+BEGIN: clocktable", "#+END:"), ("#+begin_note", "#+end_note")])
        book.add(kind[0], feature="where")
        block(rng, book)
        book.add(kind[1])
    elif r < 0.26:
        book.add("- an item", "", feature="where")
        block(rng, book, indent="  ")
    elif r < 0.3:
        book.add("", rng.choice(["Some prose.", "#+TITLE: again", "# a comment"]))
    else:
        block(rng, book)
    if rng.random() < 0.5:
        book.add("")


def generate(rng):
    """One org book, as (text, bytes prefix, features)."""
    book = Book()
    if rng.random() < 0.15:
        book.add("# a comment", ":PROPERTIES:", f":header-args:python: {header_args(rng, book)}", ":END:",
                 feature="file-drawer")
    if book.lines or rng.random() < 0.95:
        book.add("#+TITLE: fuzz")
    for _ in range(rng.randint(0, 2)):
        keyword_property(rng, book)
    if rng.random() < 0.15:
        element(rng, book)
    for n in range(rng.randint(1, 5)):
        heading(rng, book, 1 if n == 0 or rng.random() < 0.5 else rng.randint(2, 3))
        for _ in range(rng.randint(1, 3)):
            element(rng, book)
    text = "\n".join(book.lines) + "\n"
    prefix = b""
    if rng.random() < 0.05:
        prefix = b"\xef\xbb\xbf"
        book.features.add("bytes")
    data = prefix + text.encode("utf-8")
    if rng.random() < 0.04:
        data = data.replace(b"\n", b"\r\n")
        book.features.add("bytes")
    return data, book.features


# ---------------------------------------------------------------- running

@dataclass
class Case:
    index: int
    data: bytes
    features: set
    name: str
    ours_dir: Path
    emacs_dir: Path
    ours: Result = None
    emacs: Result = None
    check: Result = None


def tangle_all(root, names, *args):
    """Run our tangler once on every org file in NAMES (paths under ROOT, one book per
    directory); {name: Result}.

    One process for all books keeps the run short; a book's result is the
    messages that name a file in its directory. If the process crashes, each
    book is run alone, so that the crash is pinned on its book.
    """
    whole = run_ours(root, names[0], *args, *names[1:]) if names else Result(0, "", "")
    if "Traceback" in whole.stderr:
        return {name: run_ours(root, name, *args) for name in names}
    results = {}
    for name in names:
        # A message names the book or one of its tangled files, all under the book's directory.
        folder = name.rsplit("/", 1)[0] + "/"
        mine = lambda text: "".join(line + "\n" for line in text.splitlines() if line.startswith(folder))
        stderr, stdout = mine(whole.stderr), mine(whole.stdout)
        failed = bool(stderr) or ("--check" in args and "all match the book" not in stdout)
        results[name] = Result(1 if failed else 0, stdout, stderr)
    return results


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    require_emacs()
    rng = random.Random(FUZZ_SEED)
    root = tmp_path_factory.mktemp("tangle-fuzz")
    made = []
    for index in range(FUZZ_COUNT):
        data, features = generate(rng)
        case = Case(index, data, features, f"{index:04d}/ours/{ORG_NAME}",
                    root / f"{index:04d}" / "ours", root / f"{index:04d}" / "emacs")
        for directory in (case.ours_dir, case.emacs_dir):
            directory.mkdir(parents=True)
            (directory / ORG_NAME).write_bytes(data)
        made.append(case)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        ours = pool.submit(tangle_all, root, [case.name for case in made])
        emacs = run_emacs_batch([case.emacs_dir / ORG_NAME for case in made], root)
        ours = ours.result()
    for case in made:
        case.ours, case.emacs = ours[case.name], emacs[case.emacs_dir / ORG_NAME]
    checks = tangle_all(root, [case.name for case in made if case.ours.returncode == 0], "--check")
    for case in made:
        case.check = checks.get(case.name)
    return made


def verdict(case):
    """None when the case is fine, else what went wrong."""
    if "Traceback" in case.ours.stderr:
        return "our tangler crashed:\n" + case.ours.stderr
    if case.ours.returncode != 0:
        written = sorted(set(os.listdir(case.ours_dir)) - {ORG_NAME})
        if not re.match(rf"{re.escape(case.name)}:\d+: \S", case.ours.stderr) or written:
            return f"not a clean refusal (wrote {written}):\n{case.ours.stderr}"
        return None
    if case.emacs.returncode != 0:
        return f"Emacs fails ({case.emacs.stderr}) but our tangler wrote:\n{case.ours.stdout}"
    ours, theirs = snapshot(case.ours_dir, ORG_NAME), snapshot(case.emacs_dir, ORG_NAME)
    if ours != theirs:
        return "trees differ:\n" + describe_difference(ours, theirs)
    if case.check.returncode != 0:
        return "--check fails right after tangling:\n" + case.check.stdout + case.check.stderr
    return None


def test_fuzzed_books_are_tangled_as_emacs_does_or_refused(cases):
    failures = [(case, problem) for case in cases if (problem := verdict(case))]
    report = [f"{len(failures)} of {len(cases)} fuzzed books (seed {FUZZ_SEED}) went wrong:"]
    for case, problem in failures[:5]:
        report += [f"--- book {case.index}: {problem}", case.data.decode("utf-8", "replace")]
    assert not failures, "\n".join(report)


FEATURES = ["whitespace-begin", "whitespace-keyword", "whitespace-drawer", "case", "affiliated",
            "where", "heading-unicode-cookie-percent", "heading-tags", "modes", "noweb",
            "file-drawer", "bytes"]


def test_the_fuzzer_exercises_every_class_and_tangles_most_books(cases):
    """Each class of construct appears in books that our tangler accepts, not only in refused ones."""
    accepted = [case for case in cases if case.ours.returncode == 0]
    assert len(accepted) >= len(cases) / 3, f"only {len(accepted)} of {len(cases)} books tangled"
    assert sum(1 for case in accepted if any(p.is_file() and p.name != ORG_NAME and not p.name.startswith(".")
                                            for p in case.ours_dir.rglob("*"))) >= len(cases) / 4
    for feature in FEATURES:
        assert any(feature in case.features for case in accepted), f"no accepted book has {feature}"


# ---------------------------------------------------------------- mutations, without Emacs

CORPUS = Path(__file__).resolve().parent / "tangle" / "corpus"
SPLINTERS = ["\t", " ", "\u00a0", "\r", "\n", ":", "*", "#+", "<<", ">>", "(", ")", "[", "]", '"',
             "\\", "%", ",", "#+end_src", "#+begin_src python :tangle m.py\n", ":PROPERTIES:\n",
             ":END:\n", "\x00", "é", "\u200b", "..", "/", "~"]


def mutate(rng, data, splinters):
    """DATA with a few splinters inserted, stretches deleted or copied, at random places."""
    for _ in range(rng.randint(1, 6)):
        k, r = rng.randrange(len(data) + 1), rng.random()
        if r < 0.5:
            data = data[:k] + rng.choice(splinters).encode("utf-8") + data[k:]
        elif r < 0.8:
            data = data[:k] + data[k + rng.randint(1, 20):]
        else:
            j = rng.randrange(len(data) + 1)
            data = data[:k] + data[j : j + 30] + data[k:]
    if rng.random() < 0.03:
        data += b"\xff"  # a byte that is not UTF-8
    return data


def test_mutated_books_are_tangled_or_refused_without_a_traceback(tmp_path):
    """Corpus books with random splinters: never a traceback, and a refused book writes nothing."""
    rng = random.Random(FUZZ_SEED)
    sources = sorted(CORPUS.glob("*/*.org"))
    names = []
    for index in range(FUZZ_COUNT * 2):
        name = f"{index:04d}/{ORG_NAME}"
        (tmp_path / name).parent.mkdir()
        (tmp_path / name).write_bytes(mutate(rng, rng.choice(sources).read_bytes(), SPLINTERS))
        names.append(name)
    results = tangle_all(tmp_path, names)
    crashed = [name for name, result in results.items() if "Traceback" in result.stderr]
    assert not crashed, results[crashed[0]].stderr
    refused = [name for name, result in results.items() if result.returncode]
    assert len(names) / 10 < len(refused) < len(names), "mutations should be refused now and then, not always"
    wrote = [name for name in refused if os.listdir(tmp_path / name.split("/")[0]) != [ORG_NAME]]
    assert not wrote, f"refused, yet wrote: {wrote[:5]}"


def test_edits_of_tangled_files_are_written_back_or_refused_without_a_traceback(tmp_path):
    """Tangled files with random edits: --detangle never crashes, and what it writes back checks clean."""
    rng = random.Random(FUZZ_SEED)
    sources = sorted((CORPUS / "accept").glob("*.org"))
    names = []
    for index in range(FUZZ_COUNT // 2):
        name = f"{index:04d}/{ORG_NAME}"
        (tmp_path / name).parent.mkdir()
        (tmp_path / name).write_bytes(rng.choice(sources).read_bytes())
        names.append(name)
    assert all(result.returncode == 0 for result in tangle_all(tmp_path, names).values())
    for name in names:
        tangled = sorted(p for p in (tmp_path / name).parent.rglob("*")
                         if p.is_file() and p.name != ORG_NAME and not p.name.startswith("."))
        for path in rng.sample(tangled, min(2, len(tangled))):
            path.write_bytes(mutate(rng, path.read_bytes(), ["\n", "x", "    ", "\t", "#+end_src\n", "* h\n",
                                                             "<<a>>", "é", "\n\n"]))
    before = {name: (tmp_path / name).read_bytes() for name in names}
    results = tangle_all(tmp_path, names, "--detangle")
    crashed = [name for name, result in results.items() if "Traceback" in result.stderr]
    assert not crashed, results[crashed[0]].stderr
    changed = [name for name in names if (tmp_path / name).read_bytes() != before[name]]
    assert changed, "no edit was written back"
    assert not [name for name in changed if results[name].returncode], "a refused write-back changed the book"
    checks = tangle_all(tmp_path, changed, "--check")
    failed = [name for name, result in checks.items() if result.returncode]
    assert not failed, f"--check fails after a write-back: {failed[:5]}"
