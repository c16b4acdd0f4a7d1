"""Pygments' lexer for the cells of the mlplcode kernel: commands, their arguments, and
notes."""

from pygments.lexer import RegexLexer, bygroups
from pygments.token import Keyword, Name, Number, Operator, String, Text, Whitespace


class MlplcodeLexer(RegexLexer):
    """A cell of the mlplcode kernel: %commands one a line, or a note of plain text."""

    name = "mlplcode"
    aliases = ["mlplcode"]
    filenames = []
    tokens = {
        "root": [
            (
                r"\A\s*(?=[^%\s])[\s\S]*",
                Text,
            ),  # the first line is not a command: the cell is a note
            (r"^%%(task|note)[ \t]*$", Keyword, "task"),
            (r"^%[A-Za-z]+", Keyword, "arguments"),
            (r"\s+", Whitespace),
            (r".+", Text),  # a line that is not a command, which the kernel refuses
        ],
        "arguments": [
            (r"\n", Whitespace, "#pop"),
            (r"[ \t]+", Whitespace),
            (r"--[a-z-]+", Name.Attribute),
            (r"([a-z-]+)(=)([a-z]+)", bygroups(Name.Variable, Operator, Name.Constant)),
            (r"\d+(\.\d+)?(?=\s|$)", Number),
            (r"\S+", String),
        ],
        "task": [
            (r"[\s\S]+", String),
        ],
    }
