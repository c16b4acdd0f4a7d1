"""The grammar and the parser agree: what the grammar allows parses, and what the parser writes, the grammar allows."""
import json
import random
import re
import subprocess
import sys

import pytest
from lark import Lark
from lark.exceptions import LarkError

import test_protocol
from mlplcode.grammar import grammar_text, protocol_grammar, sample
from mlplcode.protocol import format_action, parse_action

BOOK = "mlplcode.org"


@pytest.fixture(scope="module")
def lark():
    return Lark(grammar_text("lark"), start="start", parser="earley")


def accepts(lark, text):
    try:
        lark.parse(text)
    except LarkError:
        return False
    return True


def cases(function):
    """The argument tuples pytest would call FUNCTION with."""
    marks = [mark for mark in getattr(function, "pytestmark", []) if mark.name == "parametrize"]
    if not marks:
        return [()]
    names, values = marks[0].args[0], marks[0].args[1]
    return [value if "," in names else (value,) for value in values]


def parsed_by_the_parser_tests():
    """Every action the parser's own tests read out of a reply, recorded as they run."""
    actions, real = [], test_protocol.parse_action
    test_protocol.parse_action = lambda reply: actions.append(real(reply)) or actions[-1]
    try:
        for name, function in vars(test_protocol).items():
            if name.startswith("test_") and callable(function):
                for arguments in cases(function):
                    function(*arguments)
    finally:
        test_protocol.parse_action = real
    return [action for action in actions if "error" not in action]


def test_what_the_parser_writes_the_grammar_accepts(lark):
    actions = parsed_by_the_parser_tests()
    assert len(actions) > 40
    refused = [format_action(action) for action in actions if not accepts(lark, format_action(action))]
    assert refused == []


def test_the_actions_the_book_shows_are_accepted(lark):
    book = open(BOOK, encoding="utf-8").read()
    shown = [json.loads(line) for line in re.findall(r'^(\{"tool": .*\})$', book, re.MULTILINE)]
    assert {action["tool"] for action in shown} == {"read", "search", "write", "patch", "run", "done"}
    for action in shown:
        assert accepts(lark, format_action(action)), action


def test_what_the_grammar_allows_the_parser_reads_as_an_action(lark):
    rng = random.Random(20261201)
    for _ in range(3000):
        text = sample(rng)
        action = parse_action(text)
        assert "error" not in action, (text, action)
        assert accepts(lark, text), text


@pytest.mark.parametrize("text", [
    "READ", "READ  calc.py", "READ ''", "read calc.py", "I will READ calc.py", "READ a\nREAD b",
    "WRITE a.py\nx\n", "WRITE a.py\nEND\nEND", "PATCH a.py\nOLD\nEND\nNEW\nEND", "PATCH a.py\nNEW\nEND",
    "DONE ", "```\nREAD a\n```", "<think>x</think>\nREAD a",
])
def test_the_grammar_refuses_what_is_not_the_canonical_form(lark, text):
    assert not accepts(lark, text)


def test_every_verb_of_the_table_is_a_rule():
    from mlplcode.verbs import VERBS
    rules = protocol_grammar()
    assert {verb.name.lower() for verb in VERBS} <= set(rules)


def test_mlplcode_grammar_prints_either_notation():
    for notation, first in (("gbnf", "root ::= "), ("lark", "start: ")):
        printed = subprocess.run([sys.executable, "-m", "mlplcode.cli", "grammar", "--format", notation],
                                 capture_output=True, text=True, check=True).stdout
        assert printed == grammar_text(notation) and printed.startswith(first)
