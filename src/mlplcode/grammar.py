"""The grammar: the protocol as GBNF and as Lark, derived from the verb table, for
constrained decoding."""

import json
from dataclasses import dataclass

from .verbs import VERBS

@dataclass(frozen=True)
class Literal:
    text: str


@dataclass(frozen=True)
class Chars:
    """One character that is not in EXCLUDED."""

    excluded: str


@dataclass(frozen=True)
class Rule:
    name: str


@dataclass(frozen=True)
class Seq:
    items: tuple


@dataclass(frozen=True)
class Choice:
    options: tuple


@dataclass(frozen=True)
class Many:
    """ITEM, zero or more times."""

    item: object

def seq(*items):
    flat = [
        part
        for item in items
        for part in (item.items if isinstance(item, Seq) else (item,))
    ]
    return Seq(tuple(item for item in flat if item != Literal("")))


def choice(*options):
    return Choice(tuple(options))

REST_OF_LINE = Many(Chars("\n"))
ARGUMENT_RULES = {
    "path-argument": seq(Chars(" \t\n\"'`"), REST_OF_LINE),
    "text-argument": seq(Chars(" \t\n"), REST_OF_LINE),
}

def line_except(words):
    """A non-empty line, without its newline, that is none of WORDS."""

    def after(prefix):
        nexts = sorted(
            {
                word[len(prefix)]
                for word in words
                if len(word) > len(prefix) and word.startswith(prefix)
            }
        )
        options = [Literal(prefix)] if prefix and prefix not in words else []
        options.append(seq(Literal(prefix), Chars("\n" + "".join(nexts)), REST_OF_LINE))
        options += [after(prefix + letter) for letter in nexts]
        return choice(*options)

    return after("")


def lines(rule):
    """Zero or more lines of RULE, each ended by a newline; an empty line is a line
    too."""
    return Many(choice(Literal("\n"), seq(Rule(rule), Literal("\n"))))

def protocol_grammar():
    """The rules of the protocol's canonical form, from the verb table; the start rule
    is "root"."""
    rules = {
        "root": choice(*(Rule(verb.name.lower()) for verb in VERBS)),
        **ARGUMENT_RULES,
        "line": line_except({"END"}),
        "old-line": line_except({"NEW", "END"}),
    }
    for verb in VERBS:
        head = seq(
            Literal(verb.name + " "),
            Rule(f"{'path' if verb.argument == 'path' else 'text'}-argument"),
        )
        rules[verb.name.lower()] = {
            "": head,
            "content": seq(head, Literal("\n"), lines("line"), Literal("END")),
            "patch": seq(
                head,
                Literal("\nOLD\n"),
                lines("old-line"),
                Literal("NEW\n"),
                lines("line"),
                Literal("END"),
            ),
        }[verb.body]
    return rules

NOTATIONS = {"gbnf": ("{name} ::= {body}", "root"), "lark": ("{name}: {body}", "start")}


def rule_name(name, notation):
    if name == "root":
        return NOTATIONS[notation][1]
    return name.replace("-", "_") if notation == "lark" else name


ESCAPES = {"\n": "\\n", "\t": "\\t", "\\": "\\\\", "]": "\\]", "^": "\\^", "-": "\\-"}


def char_class(excluded, notation):
    """The class of characters not in EXCLUDED: GBNF's brackets, or a regular expression
    for Lark."""
    escaped = "".join(ESCAPES.get(char, char) for char in excluded)
    return (
        f"[^{escaped}]"
        if notation == "gbnf"
        else f"/[^{escaped.replace('/', chr(92) + '/')}]/"
    )

def written(expression, notation):
    """EXPRESSION in NOTATION ("gbnf" or "lark")."""
    match expression:
        case Literal(text):
            return json.dumps(text, ensure_ascii=False)
        case Chars(excluded):
            return char_class(excluded, notation)
        case Rule(name):
            return rule_name(name, notation)
        case Seq(items):
            return " ".join(grouped(item, notation, (Choice,)) for item in items)
        case Choice(options):
            return " | ".join(written(option, notation) for option in options)
        case Many(item):
            return f"{grouped(item, notation, (Choice, Seq))}*"


def grouped(expression, notation, kinds):
    """EXPRESSION in NOTATION, in parentheses if it is one of KINDS, with parts a
    neighbour could claim."""
    parts = getattr(expression, "items", None) or getattr(expression, "options", ())
    text = written(expression, notation)
    return f"({text})" if isinstance(expression, kinds) and len(parts) > 1 else text

FORMATS = tuple(NOTATIONS)
REQUEST_FIELD = {"gbnf": "grammar", "lark": "guided_grammar"}


def grammar_text(notation):
    """The protocol's grammar in NOTATION, one rule a line."""
    form = NOTATIONS[notation][0]
    return "".join(
        form.format(name=rule_name(name, notation), body=written(body, notation)) + "\n"
        for name, body in protocol_grammar().items()
    )

ALPHABET = "abcEND NEWOLD\t'\"`.#/-_:=()[]{}<>~é✓\u202e"


def sample(rng, rules=None, expression=None):
    """A random string that the grammar's EXPRESSION (its start, by default) accepts."""
    rules = rules or protocol_grammar()
    expression = expression or Rule("root")
    match expression:
        case Literal(text):
            return text
        case Chars(excluded):
            return rng.choice([char for char in ALPHABET if char not in excluded])
        case Rule(name):
            return sample(rng, rules, rules[name])
        case Seq(items):
            return "".join(sample(rng, rules, item) for item in items)
        case Choice(options):
            return sample(rng, rules, rng.choice(options))
        case Many(item):
            return "".join(
                sample(rng, rules, item) for _ in range(rng.choice((0, 0, 1, 2, 5)))
            )
