"""Papermill's parameters for notebooks of the mlplcode kernel, each one a settings
command."""

from papermill.engines import NBClientEngine
from papermill.exceptions import PapermillException
from papermill.models import Parameter
from papermill.translators import Translator, papermill_translators

PARAMETERS = {
    "root": "%root",
    "model": "%model",
    "budget": "%budget",
    "policy": "%policy",
    "task": "%task --next",
}


class MlplcodeTranslator(Translator):
    """Papermill's parameters as a cell of settings commands."""

    @classmethod
    def codify(cls, parameters, comment="Parameters"):
        return "".join(
            setting_command(name, value) + "\n" for name, value in parameters.items()
        )

    @classmethod
    def inspect(cls, parameters_cell):
        """Every setting, with the value the cell tagged parameters gives it, if any."""
        given = {}
        for line in parameters_cell["source"].splitlines():
            word, _, value = line.partition(" ")
            given[word] = value.strip().removeprefix("--next").strip()
        return [
            Parameter(
                name,
                "int" if name == "budget" else "str",
                given.get(command.split()[0], "None"),
                f"{command.split()[0]}, the kernel's setting",
            )
            for name, command in PARAMETERS.items()
        ]


def setting_command(name, value):
    """The command that gives the parameter NAME its VALUE; refuses what no command can
    say."""
    if name not in PARAMETERS:
        raise PapermillException(
            f"an mlplcode notebook takes the parameters {', '.join(PARAMETERS)};"
            f" not {name!r}"
        )
    if (
        isinstance(value, bool)
        or not isinstance(value, (str, int))
        or len(str(value).splitlines()) != 1
    ):
        raise PapermillException(
            f"parameter {name}: a value is one line of text or a whole number,"
            f" not {value!r}"
        )
    return f"{PARAMETERS[name]} {value}"

papermill_translators.register("mlplcode", MlplcodeTranslator)
Engine = NBClientEngine  # the entry point papermill loads, so that the line above runs
