"""mlplcode's pytest plugin: the outcome of each test and of the canaries, signed with a
key that only this plugin was given, written where no printing or exiting reaches."""

import hashlib
import hmac
import json
import os
import unittest
from pathlib import Path

import pytest
from _pytest.runner import runtestprotocol

CHANNEL = "MLPLCODE_RESULTS"


def open_channel():
    """The key and the record's descriptor the agent gave this process, or (None, None):
    the variable that names them removed, the key's pipe read to its end and closed."""
    words = os.environ.pop(CHANNEL, "")
    if not words:
        return None, None
    key_descriptor, record_descriptor = (int(word) for word in words.split(":"))
    with os.fdopen(key_descriptor, "rb") as pipe:
        key = pipe.read()
    os.set_inheritable(record_descriptor, False)
    return key, record_descriptor


KEY, RECORD = open_channel()

def pytest_cmdline_main(config):
    """Keep the tests in this process: no workers of pytest-xdist, whose tests the
    record could not count."""
    option = config.option
    if getattr(option, "numprocesses", None) or getattr(option, "tx", None):
        option.numprocesses, option.dist, option.tx = 0, "no", []

REPORTS = {}
COLLECTED = {}
SESSION = {"items": [], "finished": False}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Note each report of a test as pytest's own plugins made it; a plugin or conftest
    loaded later wraps this hook, and what it changes on the way out is not noted."""
    report = yield
    REPORTS.setdefault(item, []).append(
        (report.when, report.outcome, hasattr(report, "wasxfail"))
    )
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """Note whether each collector, a test module above all, collected or failed."""
    report = yield
    COLLECTED[collector] = report.outcome
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session):
    """Note the tests the loop is given; after it has run them, run the canaries, and
    note that the loop got to its end."""
    SESSION["items"] = list(session.items)
    result = yield
    run_canaries(session)
    SESSION["finished"] = True
    return result

def outcome_of(reports):
    """A test's outcome from its REPORTS, (when, outcome, xfail) each: failed, error,
    skipped, xfailed, xpassed or passed; unreported when it never ran."""
    by_stage = {when: (outcome, xfail) for when, outcome, xfail in reports}
    if any(outcome == "failed" for outcome, _ in by_stage.values()):
        return "failed" if by_stage.get("call", ("",))[0] == "failed" else "error"
    if "call" not in by_stage:
        skipped = by_stage.get("setup", ("",))[0] == "skipped"
        return "skipped" if skipped else "unreported"
    outcome, xfail = by_stage["call"]
    if outcome == "skipped":
        return "xfailed" if xfail else "skipped"
    return "xpassed" if xfail else "passed"

CANARIES = []
CANARY_SOURCE = """import unittest


def {function}():
    assert False, "a test that must fail"


class {case}(unittest.TestCase):
    def {method}(self):
        self.fail("a test that must fail")
"""


class CollectorCanary(pytest.Collector):
    def collect(self):
        raise AssertionError("a collector that must fail")


def canary_code(module):
    """A canary function and TestCase for MODULE, under test names drawn at random,
    compiled as code of the module's file and name."""
    prefixes = {"function": "test_", "case": "Test", "method": "test_"}
    names = {key: prefix + os.urandom(6).hex() for key, prefix in prefixes.items()}
    code = compile(CANARY_SOURCE.format(**names), str(module.path), "exec")
    namespace = {"__name__": module.obj.__name__}
    exec(code, namespace)
    return namespace[names["function"]], namespace[names["case"]]

EXCUSING_MARKS = ("skip", "skipif", "xfail")


def places(session, items):
    """The modules the canaries are made in: the first of each directory among ITEMS,
    the tests collected, that is not marked as a whole to skip or to fail; or, when
    there is none, this file as a module."""
    modules = {}
    for item in items:
        module = item.getparent(pytest.Module)
        if module is not None and not any(
            mark.name in EXCUSING_MARKS for mark in module.iter_markers()
        ):
            modules.setdefault(module.path.parent, module)
    return list(modules.values()) or [
        pytest.Module.from_parent(session, path=Path(__file__))
    ]


def make_canaries(module):
    """The canaries of MODULE, [(kind, node)]; the TestCase's node is None when a loaded
    unittest plugin did not collect it."""
    function, case_class = canary_code(module)
    name = function.__name__
    item = pytest.Function.from_parent(module, name=name, callobj=function)
    made = [("function", item)]
    if module.config.pluginmanager.has_plugin("unittest"):
        case = module.ihook.pytest_pycollect_makeitem(
            collector=module, name=case_class.__name__, obj=case_class
        )
        if isinstance(case, pytest.Class):
            case.obj = case_class  # the module has no attribute of that name
        nodes = case.collect() if isinstance(case, pytest.Class) else []
        made.append(("unittest", next(iter(nodes), None)))
    return made + [("collector", CollectorCanary.from_parent(module, name=name + "_"))]

REMOVED = set()


def canary_tests():
    """The canaries that are tests, not collectors, in the order they were made."""
    return [node for kind, _, node in CANARIES if kind != "collector" and node]


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(session, items):
    """Make the canaries, and put those that are tests among the tests collected, before
    any other plugin or conftest chooses or marks them."""
    for module in places(session, items):
        CANARIES.extend((kind, module, node) for kind, node in make_canaries(module))
    items.extend(canary_tests())
    return (yield)


@pytest.hookimpl(specname="pytest_collection_modifyitems")
def pytest_take_the_canaries_back(items):
    """Take the canaries out of the tests again, after the plugins and conftests loaded
    later than this one, before pytest's own; note any that is missing."""
    canaries = {id(node) for node in canary_tests()}
    REMOVED.update(canaries - {id(item) for item in items})
    items[:] = [item for item in items if id(item) not in canaries]

def run_canaries(session):
    """Run each canary that was not removed as pytest runs a test or collects a module,
    its reports noted but not logged."""
    tests = [node for node in canary_tests() if id(node) not in REMOVED]
    for index, item in enumerate(tests):
        following = tests[index + 1] if index + 1 < len(tests) else None
        runtestprotocol(item, log=False, nextitem=following)
    for kind, _, node in CANARIES:
        if kind == "collector":
            node.ihook.pytest_make_collect_report(collector=node)

NAMES_KEPT = 10
NAME_CHARACTERS = 300


def place(module):
    """Where the canaries of MODULE ran, as the record names it: the module's node id,
    or "" for this file, which lies outside the project."""
    return "" if module.path == Path(__file__) else module.nodeid[:NAME_CHARACTERS]


def canary_outcome(kind, node):
    """What became of a canary of KIND: its outcome, or that it was never collected or
    was removed from the tests."""
    if node is None:
        return "not collected"
    if id(node) in REMOVED:
        return "removed from the tests"
    if kind == "collector":
        return COLLECTED.get(node, "not collected")
    return outcome_of(REPORTS.get(node, []))


def record():
    """What the session did: whether its loop ended, how many tests had each outcome,
    the first failures' names, and each canary's outcome, where it ran."""
    counts, failures = {}, []
    canaries = {id(node) for _, _, node in CANARIES}
    outcomes = [
        (collector.nodeid, "error" if outcome == "failed" else "skipped")
        for collector, outcome in COLLECTED.items()
        if outcome != "passed" and id(collector) not in canaries
    ]
    outcomes += [
        (item.nodeid, outcome_of(REPORTS.get(item, []))) for item in SESSION["items"]
    ]
    for name, outcome in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome in ("failed", "error") and len(failures) < NAMES_KEPT:
            failures.append(name[:NAME_CHARACTERS])
    return {
        "finished": SESSION["finished"],
        "counts": counts,
        "failures": failures,
        "canaries": [
            [kind, place(module), canary_outcome(kind, node)]
            for kind, module, node in CANARIES
        ],
    }


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """Write the record, signed with the key, to the agent's descriptor: one line, the
    tag first."""
    if KEY is None:
        return
    payload = json.dumps(record(), sort_keys=True).encode()
    tag = hmac.new(KEY, payload, hashlib.sha256).hexdigest().encode()
    os.write(RECORD, tag + b" " + payload + b"\n")
