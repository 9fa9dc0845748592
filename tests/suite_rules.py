"""Three rules of this suite, as a pytest plugin (conftest.py loads it; tests/test_suite_rules.py proves them):

- Every fixture has a time limit, for its setup and again for its teardown: pytest-timeout (`timeout_func_only`)
  times the test's own call, so a Ray cluster that never starts, or a shared run that hangs, would otherwise stall
  the suite. The limit is pytest-timeout's default (`timeout` in pyproject.toml), or what `@time_limit(seconds)`
  under `@pytest.fixture` says. A fixture past its limit fails with its name; pytest keeps that error for the
  fixture's scope, so every test that needs it fails at once, and the suite goes on.
- Under CI (`CI=true`: GitHub's runners, `.ci/run`) a skipped test is a failure: what CI was meant to check, it
  did not (the MLflow UI test without a browser).
- A test that forks this process while it is a Ray driver (the test cluster's, ray_driver) fails, with where it
  forked. gRPC, under Ray's GCS client and pubsub, is not fork-safe in a driver (ray-project/ray#22909, forking for
  multiprocessing.Manager(); #59661, open): seen here, after test_step07's Manager() (which forks), every later
  Ray Train fit() of this driver never started its run and ray.shutdown() hung (two full suites and a CI run;
  an actor call after every test found the driver cut off right after that Manager, 2026-12-05). Start processes
  with subprocess or spawn (benchmarks.ranks.spawned_ranks): subprocess's children are not forks of this interpreter."""
import os
import signal
import sys
import time
import traceback

import pytest


def time_limit(seconds: float):
    """A fixture's limit, for its setup and for its teardown, each: put it under @pytest.fixture."""
    def limited(fixture_function):
        fixture_function.time_limit = seconds
        return fixture_function
    return limited


class Alarm:
    """SIGALRM after `seconds` (pytest-timeout's signal method), which fails whatever the main thread is doing: a
    subprocess.run kills its child on the way out. An alarm already set that would ring sooner (pytest-timeout's, in
    a test's call) is left to ring; a later one is set again, less the time spent, when this one stops."""

    def __init__(self, seconds: float, what: str):
        self.seconds, self.what, self.saved = seconds, what, None

    def start(self):
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        if left and left <= self.seconds:
            return
        self.saved = (signal.signal(signal.SIGALRM, self.ring), left, time.monotonic())
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def ring(self, signum, frame):
        pytest.fail(f"{self.what} took more than {self.seconds:g} s (its time limit: tests/suite_rules.py)")

    def stop(self):
        if self.saved is None:
            return
        handler, left, started = self.saved
        self.saved = None
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        if left:
            signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - started), 1e-3))


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    seconds = getattr(fixturedef.func, "time_limit", None) or float(request.config.getini("timeout") or 300)
    setup, teardown = (Alarm(seconds, f"fixture {fixturedef.argname!r}'s {part}") for part in ("setup", "teardown"))
    # A fixture's finalizers run last-added first: this one after its teardown, the one added below before it.
    fixturedef.addfinalizer(teardown.stop)
    setup.start()
    try:
        value = yield
    finally:
        setup.stop()
    fixturedef.addfinalizer(teardown.start)
    return value


FORKS_OF_A_DRIVER: list[str] = []  # where each fork of this process was called from while it was a Ray driver


def note_a_fork_of_a_driver() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        FORKS_OF_A_DRIVER.append("".join(traceback.format_stack()[-8:-1]))


os.register_at_fork(before=note_a_fork_of_a_driver)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if FORKS_OF_A_DRIVER:
        where = FORKS_OF_A_DRIVER.pop()
        FORKS_OF_A_DRIVER.clear()
        report.outcome = "failed"
        report.longrepr = (f"this process forked while it was a Ray driver, which cuts it off from Ray's actors: "
                           f"start processes with subprocess or spawn (benchmarks.ranks.spawned_ranks). Forked "
                           f"at:\n{where}")
    if report.skipped and not hasattr(report, "wasxfail") and os.environ.get("CI", "").lower() == "true":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome, report.longrepr = "failed", f"skipped under CI (CI=true), which must run it: {reason}"
    return report
