"""A pytest plugin that writes when each test's phases and each shared fixture ran, one JSON line each, to the file
named by SUITE_TIMELINE: with sampler.py's per-process CPU it gives the busy core-seconds of each test, each shared
run and each early run (account.py).

    PYTHONPATH=$PWD/tests/history/account SUITE_TIMELINE=/work/t.jsonl PYTEST_ADDOPTS="-p timeline" bash .ci/run"""
import json
import os
import time

import pytest

# Only the sessions that .ci/run starts: a pytest that a test starts gets neither this plugin nor the variable (the
# suite's own rules run pytest in folders and environments of their own, where the plugin would not import).
os.environ.pop("PYTEST_ADDOPTS", None)
_file = open(os.environ["SUITE_TIMELINE"], "a", buffering=1)


def _write(**record):
    _file.write(json.dumps(record) + "\n")


def _phase(name):
    @pytest.hookimpl(hookwrapper=True)
    def hook(item, *args):
        start = time.time()
        yield
        _write(kind="phase", id=item.nodeid, phase=name, start=start, end=time.time())
    return hook


pytest_runtest_setup = _phase("setup")
pytest_runtest_call = _phase("call")
pytest_runtest_teardown = _phase("teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    start = time.time()
    yield
    if fixturedef.scope in ("session", "module", "package"):
        _write(kind="fixture", name=fixturedef.argname, scope=fixturedef.scope, start=start, end=time.time())


def pytest_sessionstart(session):
    _write(kind="session", event="start", time=time.time(), pid=os.getpid(),
           args=list(session.config.invocation_params.args))


def pytest_sessionfinish(session):
    _write(kind="session", event="finish", time=time.time())
