"""Tests for the protocol: the six verbs, each tolerance, each refusal, the round trip."""
import pytest

from mlplcode.protocol import ACTION_VERBS, format_action, parse_action


def error_of(reply):
    """The reason parse_action gives for a reply, failing the test if it parsed."""
    result = parse_action(reply)
    assert set(result) == {"error"}, result
    return result["error"]


# The six verbs.

def test_the_verbs_are_exported_in_protocol_order():
    assert ACTION_VERBS == ("READ", "SEARCH", "WRITE", "PATCH", "RUN", "DONE")


def test_read():
    assert parse_action("READ calc.py") == {"tool": "read", "path": "calc.py"}


def test_search_keeps_the_whole_line_as_the_query():
    assert parse_action("SEARCH def  mul(") == {"tool": "search", "query": "def  mul("}


def test_write():
    reply = "WRITE calc.py\ndef mul(a, b):\n    return a * b\nEND"
    assert parse_action(reply) == {
        "tool": "write", "path": "calc.py", "content": "def mul(a, b):\n    return a * b\n"}


def test_write_of_an_empty_file():
    assert parse_action("WRITE empty.txt\nEND") == {
        "tool": "write", "path": "empty.txt", "content": ""}


def test_patch():
    reply = "PATCH calc.py\nOLD\n    return a + b\nNEW\n    return a * b\nEND"
    assert parse_action(reply) == {
        "tool": "patch", "path": "calc.py",
        "old": "    return a + b\n", "new": "    return a * b\n"}


def test_patch_with_empty_new_text_deletes_the_old_lines():
    reply = "PATCH calc.py\nOLD\nimport os\nNEW\nEND"
    assert parse_action(reply)["new"] == ""


def test_run():
    assert parse_action("RUN python3 -m pytest -q") == {
        "tool": "run", "command": "python3 -m pytest -q"}


def test_done():
    assert parse_action("DONE Added mul and its test.") == {
        "tool": "done", "summary": "Added mul and its test."}


def test_a_line_is_end_only_when_it_is_exactly_end():
    reply = "WRITE notes.txt\n  END\nEND;\nENDING\nEND"
    assert parse_action(reply)["content"] == "  END\nEND;\nENDING\n"


def test_old_and_new_markers_must_be_exact_lines():
    reply = "PATCH a.txt\nOLD\n OLD\nNEWS\n  NEW\nNEW\nnew\nEND"
    assert parse_action(reply) == {
        "tool": "patch", "path": "a.txt", "old": " OLD\nNEWS\n  NEW\n", "new": "new\n"}


def test_verb_lines_inside_a_body_are_content():
    reply = "WRITE Dockerfile\nFROM python:3.11\nRUN pip install pytest\nEND"
    assert parse_action(reply)["content"] == "FROM python:3.11\nRUN pip install pytest\n"


def test_a_path_with_spaces_is_kept_as_is():
    assert parse_action("READ my notes.txt") == {"tool": "read", "path": "my notes.txt"}


# Tolerance 1: surrounding whitespace, CRLF, BOM.

def test_surrounding_whitespace_is_ignored():
    assert parse_action("\n\n   READ calc.py   \n\n") == {"tool": "read", "path": "calc.py"}


def test_crlf_line_endings_become_newlines():
    reply = "WRITE a.py\r\nx = 1\r\ny = 2\r\nEND\r\n"
    assert parse_action(reply)["content"] == "x = 1\ny = 2\n"


def test_a_leading_bom_is_ignored():
    assert parse_action("\ufeffREAD calc.py") == {"tool": "read", "path": "calc.py"}


# Tolerance 2: a copied ACTION: header.

def test_action_header_on_its_own_line():
    assert parse_action("ACTION:\nREAD calc.py") == {"tool": "read", "path": "calc.py"}


def test_action_header_before_the_verb():
    assert parse_action("ACTION: READ calc.py") == {"tool": "read", "path": "calc.py"}


def test_a_numbered_action_header_as_the_prompt_writes_it():
    assert parse_action("ACTION 4: READ calc.py") == {"tool": "read", "path": "calc.py"}
    assert parse_action("ACTION 4:\nREAD calc.py") == {"tool": "read", "path": "calc.py"}
    assert parse_action("ACTION 4: DELETE x")["error"].startswith("unknown verb DELETE")


def test_a_header_copied_with_the_run_s_marker():
    assert parse_action("[3fa2c91e] ACTION 4: READ calc.py") == {"tool": "read", "path": "calc.py"}
    assert parse_action("[3fa2c91e] ACTION 4:\nREAD calc.py") == {"tool": "read", "path": "calc.py"}
    assert parse_action("[3fa2c91e] READ calc.py") == {"tool": "read", "path": "calc.py"}
    assert "error" in parse_action("[3fa2c91] READ calc.py") and "error" in parse_action("[x] READ calc.py")


@pytest.mark.parametrize("header", ["OBSERVATION 4:", "[3fa2c91e] OBSERVATION 4:",
                                    "[3fa2c91e] OBSERVATION 4: NOTE: this reply is identical to your previous one."])
def test_an_observation_invented_under_the_prompt_s_own_header_is_dropped(header):
    reply = f"READ calc.py\n{header}\ndef add(a, b): ...\nDONE added mul"
    assert parse_action(reply) == {"tool": "read", "path": "calc.py"}


# Tolerance 3: a <think> block.

def test_a_one_line_think_block_is_removed():
    assert parse_action("<think>I should look first.</think>READ calc.py") == {
        "tool": "read", "path": "calc.py"}


def test_a_multi_line_think_block_is_removed_with_the_verbs_in_it():
    reply = "<think>\nMaybe RUN the tests?\nREAD test_calc.py\nNo.\n</think>\n\nREAD calc.py"
    assert parse_action(reply) == {"tool": "read", "path": "calc.py"}


def test_an_unclosed_think_block_is_refused():
    assert "</think>" in error_of("<think>\nI will READ calc.py\nREAD calc.py")


def test_think_text_inside_a_body_is_content():
    reply = "WRITE t.txt\n<think>x</think>\nEND"
    assert parse_action(reply)["content"] == "<think>x</think>\n"


# Tolerance 4: prose before the action.

def test_prose_before_the_action_is_dropped():
    reply = "I will read the file first.\nThen decide.\nREAD calc.py"
    assert parse_action(reply) == {"tool": "read", "path": "calc.py"}


def test_prose_after_a_one_line_action_is_dropped():
    assert parse_action("READ calc.py\nThis shows me the code.") == {
        "tool": "read", "path": "calc.py"}


# Tolerance 5: Markdown fences.

def test_a_fence_around_the_whole_action():
    assert parse_action("```\nREAD calc.py\n```") == {"tool": "read", "path": "calc.py"}


def test_a_tagged_fence_around_the_whole_action():
    assert parse_action("```text\nRUN python3 -m pytest -q\n```") == {
        "tool": "run", "command": "python3 -m pytest -q"}


def test_a_fence_around_a_whole_write_with_end():
    reply = "```\nWRITE a.py\nx = 1\nEND\n```"
    assert parse_action(reply) == {"tool": "write", "path": "a.py", "content": "x = 1\n"}


def test_a_fence_around_a_whole_write_without_end():
    reply = "```\nWRITE a.py\nx = 1\n```"
    assert parse_action(reply) == {"tool": "write", "path": "a.py", "content": "x = 1\n"}


def test_a_bare_fence_around_a_write_body():
    assert parse_action("WRITE a.py\n```\nx = 1\n```\nEND")["content"] == "x = 1\n"


def test_a_tagged_fence_around_a_write_body():
    assert parse_action("WRITE a.py\n```python\nx = 1\n```\nEND")["content"] == "x = 1\n"


def test_a_blank_line_before_the_opening_fence():
    assert parse_action("WRITE a.py\n\n```python\nx = 1\n```\nEND")["content"] == "x = 1\n"


def test_blank_lines_after_the_closing_fence():
    assert parse_action("WRITE a.py\n```python\nx = 1\n```\n\nEND")["content"] == "x = 1\n"


def test_a_closing_fence_after_end():
    reply = "WRITE a.py\n```python\nx = 1\nEND\n```"
    assert parse_action(reply) == {"tool": "write", "path": "a.py", "content": "x = 1\n"}


def test_fences_inside_a_markdown_body_are_kept():
    reply = "WRITE README.md\n# Calc\n\n```sh\nmake\n```\n\nDone.\nEND"
    assert parse_action(reply)["content"] == "# Calc\n\n```sh\nmake\n```\n\nDone.\n"


def test_a_markdown_body_ending_in_a_code_block_keeps_its_fence():
    reply = "WRITE README.md\n# Calc\n```sh\nmake\n```\nEND"
    assert parse_action(reply)["content"] == "# Calc\n```sh\nmake\n```\n"


def test_a_wrapped_markdown_body_keeps_its_own_fences():
    reply = "WRITE README.md\n```markdown\n# Calc\n```sh\nmake\n```\n```\nEND"
    assert parse_action(reply)["content"] == "# Calc\n```sh\nmake\n```\n"


def test_a_wrapped_markdown_body_closed_after_end_keeps_its_own_fences():
    reply = "WRITE README.md\n```markdown\n# Calc\n```sh\nmake\n```\nEND\n```"
    assert parse_action(reply)["content"] == "# Calc\n```sh\nmake\n```\n"


def test_fences_around_old_and_new_text():
    reply = "PATCH calc.py\nOLD\n```python\nx = 1\n```\nNEW\n```python\nx = 2\n```\nEND"
    assert parse_action(reply) == {
        "tool": "patch", "path": "calc.py", "old": "x = 1\n", "new": "x = 2\n"}


def test_a_fence_around_a_whole_patch_body():
    reply = "PATCH calc.py\n```\nOLD\nx = 1\nNEW\nx = 2\n```\nEND"
    assert parse_action(reply) == {
        "tool": "patch", "path": "calc.py", "old": "x = 1\n", "new": "x = 2\n"}


# Tolerance 6: an invented OBSERVATION: after the action.

def test_an_observation_after_the_action_is_dropped_with_all_after_it():
    reply = "READ calc.py\nOBSERVATION: def add(a, b): ...\nPATCH calc.py\nOLD\nx\nNEW\ny\nEND"
    assert parse_action(reply) == {"tool": "read", "path": "calc.py"}


def test_an_observation_line_inside_a_body_is_content():
    reply = "WRITE log.txt\nOBSERVATION: x\nEND\nOBSERVATION: written"
    assert parse_action(reply) == {
        "tool": "write", "path": "log.txt", "content": "OBSERVATION: x\n"}


# Tolerance 7: a missing END at the end of the reply.

def test_a_write_without_end_runs_to_the_end_of_the_reply():
    assert parse_action("WRITE a.py\nx = 1\ny = 2\n")["content"] == "x = 1\ny = 2\n"


def test_a_patch_without_end_runs_to_the_end_of_the_reply():
    reply = "PATCH a.py\nOLD\nx = 1\nNEW\nx = 2"
    assert parse_action(reply) == {
        "tool": "patch", "path": "a.py", "old": "x = 1\n", "new": "x = 2\n"}


# Tolerance 8: quoted paths.

@pytest.mark.parametrize("quoted", ["`calc.py`", '"calc.py"', "'calc.py'"])
def test_a_quoted_path_is_unquoted(quoted):
    assert parse_action(f"READ {quoted}") == {"tool": "read", "path": "calc.py"}


def test_a_quoted_write_path_is_unquoted():
    assert parse_action("WRITE `calc.py`\nx = 1\nEND")["path"] == "calc.py"


@pytest.mark.parametrize("wrapped", ["`python -m pytest -q`", "```python -m pytest -q```", "`` python -m pytest -q ``"])
def test_a_command_wrapped_in_backticks_is_the_command_inside(wrapped):
    assert parse_action(f"RUN {wrapped}") == {"tool": "run", "command": "python -m pytest -q"}


@pytest.mark.parametrize("command", ['pytest -k "a b"', "echo `x`", "`pytest` -q", "'pytest'"])
def test_a_command_is_otherwise_kept_as_written(command):
    assert parse_action(f"RUN {command}") == {"tool": "run", "command": command}


def test_a_blank_line_before_old_is_skipped():
    reply = "PATCH a.py\n\nOLD\nx = 1\nNEW\nx = 2\nEND"
    assert parse_action(reply)["old"] == "x = 1\n"


# Refusals.

def test_two_one_line_actions_are_refused():
    assert "two actions" in error_of("READ calc.py\nREAD test_calc.py")


def test_an_action_after_a_write_is_refused():
    assert "two actions" in error_of("WRITE a.py\nx = 1\nEND\nRUN python3 -m pytest -q")


def test_an_action_after_prose_after_an_action_is_refused():
    assert "two actions" in error_of("READ a.py\nand then\nACTION: READ b.py")


def test_an_unknown_verb_is_refused_by_name():
    assert error_of("DELETE calc.py").startswith("unknown verb DELETE;")


def test_an_unknown_verb_after_an_action_header_is_refused_by_name():
    assert error_of("ACTION: DELETE calc.py").startswith("unknown verb DELETE;")


def test_a_lower_case_verb_is_refused_with_the_upper_case_spelling():
    assert error_of("read calc.py") == "verbs are upper case; write READ, not read"


def test_a_reply_without_a_verb_line_is_refused():
    assert error_of("I think the code is fine.").startswith("no action found;")


@pytest.mark.parametrize("reply", ["", "   \n\t\n  "])
def test_an_empty_reply_is_refused(reply):
    assert error_of(reply).startswith("empty reply;")


@pytest.mark.parametrize("reply, verb", [
    ("READ", "READ"), ("READ ``", "READ"), ("WRITE\nx = 1\nEND", "WRITE"),
    ("PATCH\nOLD\nx\nNEW\ny\nEND", "PATCH"), ("SEARCH   ", "SEARCH"), ("RUN", "RUN"),
])
def test_a_missing_argument_is_refused_by_verb(reply, verb):
    assert error_of(reply).startswith(f"{verb} needs ")


def test_done_needs_a_one_line_summary():
    assert error_of("DONE") == "DONE needs a one-line summary: DONE <summary>"


def test_a_patch_without_old_is_refused():
    assert error_of("PATCH a.py\nx = 1\nNEW\nx = 2\nEND").startswith("PATCH needs OLD")


def test_a_patch_without_new_is_refused():
    assert error_of("PATCH a.py\nOLD\nx = 1\nx = 2\nEND").startswith("PATCH needs a line NEW")


@pytest.mark.parametrize("reply", [
    "", "<think>x", "read x", "DELETE x", "hello", "READ a\nREAD b", "READ", "WRITE",
    "PATCH a\nx\nEND", "PATCH a\nOLD\nx\nEND", "SEARCH", "RUN", "DONE",
])
def test_every_reason_is_one_short_line(reply):
    reason = error_of(reply)
    assert "\n" not in reason and len(reason) <= 100


# Writing actions back.

def test_format_action_writes_a_write_as_the_protocol_says():
    action = {"tool": "write", "path": "a.py", "content": "x = 1\n"}
    assert format_action(action) == "WRITE a.py\nx = 1\nEND"


@pytest.mark.parametrize("action", [
    {"tool": "read", "path": "calc.py"},
    {"tool": "search", "query": "def mul("},
    {"tool": "write", "path": "calc.py", "content": "def mul(a, b):\n\n    return a * b\n"},
    {"tool": "write", "path": "empty.txt", "content": ""},
    {"tool": "patch", "path": "calc.py", "old": "    return a + b\n", "new": "    return a * b\n"},
    {"tool": "patch", "path": "calc.py", "old": "import os\n", "new": ""},
    {"tool": "run", "command": "python3 -m pytest -q"},
    {"tool": "done", "summary": "Added mul and its test."},
])
def test_format_then_parse_gives_back_the_action(action):
    assert parse_action(format_action(action)) == action
