"""The suite's own rules (suite_rules.py) hold: a fixture past its time limit fails, at setup and at teardown, and the
suite goes on; under CI a skip is a failure; a test that forks a Ray driver fails. And its early runs (early.py)
start with the session. Each check runs pytest on a few lines of tests in a new process with that plugin alone (no
torch to import: about a second). Last, a run forked from processes.Preloaded is its command line's."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import processes
import pytest
from conftest import ROOT

FIXTURES = '''
import time
import pytest
from suite_rules import time_limit

@pytest.fixture(scope="session")
@time_limit(1)
def hangs_at_setup():
    time.sleep(60)

@pytest.fixture
@time_limit(1)
def hangs_at_teardown():
    yield
    time.sleep(60)

@pytest.fixture
@time_limit(5)
def within_its_limit():
    time.sleep(0.2)
    yield "ready"
    time.sleep(0.2)

def test_a(hangs_at_setup):
    pass

def test_b(hangs_at_setup):
    pass

def test_c(hangs_at_teardown):
    pass

def test_d(within_its_limit):
    assert within_its_limit == "ready"
'''


def pytest_on(tmp_path, source: str, *options, plugin="suite_rules", **env) -> subprocess.CompletedProcess:
    (tmp_path / "test_it.py").write_text(source)
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "tests"), **env}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", plugin, "-p", "no:cacheprovider", "-rA", *options,
                           "test_it.py"], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=60)


def test_a_fixture_past_its_time_limit_fails_at_setup_and_at_teardown_and_the_suite_goes_on(tmp_path):
    result = pytest_on(tmp_path, FIXTURES)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    # The session fixture hung once: both tests that need it fail on its error, in about its limit, not 2 x 60 s.
    assert out.count("fixture 'hangs_at_setup''s setup took more than 1 s") >= 2, out
    assert "ERROR test_it.py::test_a" in out and "ERROR test_it.py::test_b" in out
    assert "PASSED test_it.py::test_c" in out and "ERROR test_it.py::test_c" in out  # its teardown
    assert "fixture 'hangs_at_teardown''s teardown took more than 1 s" in out
    assert "PASSED test_it.py::test_d" in out and "ERROR test_it.py::test_d" not in out
    seconds = float(re.search(r" in ([\d.]+)s", out.splitlines()[-1])[1])
    assert seconds < 30, out.splitlines()[-1]  # 2 hangs of 1 s each, not of 60


def test_under_ci_a_skip_is_a_failure(tmp_path):
    source = "import pytest\n\ndef test_skips():\n    pytest.skip('no browser')\n"
    assert "SKIPPED" in pytest_on(tmp_path, source, CI="").stdout
    result = pytest_on(tmp_path, source, CI="true")
    assert result.returncode == 1 and "FAILED test_it.py::test_skips" in result.stdout, result.stdout
    assert "skipped under CI (CI=true), which must run it: Skipped: no browser" in result.stdout


FORKS = """
import multiprocessing, subprocess, sys, types

def driver(connected):  # ray as suite_rules sees it: only is_initialized() is asked
    sys.modules["ray"] = types.SimpleNamespace(is_initialized=lambda: connected)

def test_forks_a_driver():
    driver(True)
    with multiprocessing.get_context("fork").Manager():
        pass

def test_runs_a_command_from_a_driver():
    driver(True)
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_forks_no_driver():
    driver(False)
    with multiprocessing.get_context("fork").Manager():
        pass
"""


def test_a_test_that_forks_a_ray_driver_fails_where_it_forked(tmp_path):
    out = pytest_on(tmp_path, FORKS).stdout
    assert "FAILED test_it.py::test_forks_a_driver" in out, out
    assert "this process forked while it was a Ray driver" in out and "in test_forks_a_driver" in out, out
    assert "PASSED test_it.py::test_runs_a_command_from_a_driver" in out  # subprocess does not fork this interpreter
    assert "PASSED test_it.py::test_forks_no_driver" in out


EARLY = """
import subprocess, sys, time
import pytest
from early import takes

@takes(30)
def first(folder, lane):
    (folder / "started").touch()
    time.sleep(1)
    return folder, time.time()

@takes(30)
def second(folder, lane):
    return time.time()

@takes(30)
def fails(folder, lane):
    raise AssertionError("the run's own words")

@pytest.mark.early(run=first)
def test_first(early_run):
    (early_run[0] / "ended").write_text(str(early_run[1]))

@pytest.mark.early(run=first)
def test_first_again(early_run, tmp_path_factory):
    assert len(list(tmp_path_factory.getbasetemp().glob("early/*/started"))) == 1  # one run for both tests

@pytest.mark.early(run=second)
def test_second(early_run, tmp_path_factory):
    [first_ended] = tmp_path_factory.getbasetemp().glob("early/*/ended")
    assert early_run >= float(first_ended.read_text())  # one run after another

@pytest.mark.early(run=fails)
def test_fails(early_run):
    pass

def test_plain(tmp_path_factory):
    deadline = time.time() + 10
    while not list(tmp_path_factory.getbasetemp().glob("early/*/started")):  # first's run, meanwhile
        assert time.time() < deadline
        time.sleep(0.05)
    assert not any(thread.name != "MainThread" for thread in __import__("threading").enumerate())
"""

# A run that hangs, having started a process that would outlive it, and a run queued after it.
HUNG = """
import sys, time
import pytest
from early import takes

@takes(1)
def hangs(folder, lane):
    print("the run's last words before it hangs", flush=True)
    child = lane.start([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    (folder / "pid").write_text(str(child.pid))
    time.sleep(60)

@takes(10)
def after(folder, lane):
    return "ran after"

@pytest.mark.early(run=hangs)
def test_hangs(early_run):
    pass

@pytest.mark.early(run=after)
def test_after(early_run):
    assert early_run == "ran after"

def test_plain():
    pass
"""

UNFINISHED = """
import subprocess, sys, time
import pytest
from early import takes

@takes(60)
def waits(folder, lane):
    process = lane.start([sys.executable, "-c", "import time; time.sleep(60)"])
    elsewhere = lane.start([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    (folder / "pid").write_text(f"{process.pid} {elsewhere.pid}")
    process.wait()

@takes(60)
def never(folder, lane):
    (folder / "started").touch()

@pytest.mark.early(run=waits)
def test_waits(early_run):
    pass

@pytest.mark.early(run=never)
def test_never(early_run):
    pass

def test_fails_first(tmp_path_factory):
    while not list(tmp_path_factory.getbasetemp().glob("early/*/pid")):
        time.sleep(0.05)
    assert False
"""


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, killed but not yet reaped by its new parent, does not), for up to 5 s."""
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        except OSError:
            return False
        time.sleep(0.1)
    return True


def test_early_runs_start_with_the_session_one_after_another_shared_and_their_tests_come_last(tmp_path):
    result = pytest_on(tmp_path, EARLY, "-v", plugin="early")
    out = result.stdout
    order = re.findall(r"^test_it.py::(test_\w+) (PASSED|ERROR)", out, re.MULTILINE)
    assert order == [("test_plain", "PASSED"), ("test_first", "PASSED"), ("test_first_again", "PASSED"),
                     ("test_second", "PASSED"), ("test_fails", "ERROR")], out
    assert "ERROR test_it.py::test_fails - AssertionError: the run's own words" in out  # its run's error


def test_a_hung_early_run_fails_its_tests_at_its_deadline_with_its_last_lines_and_the_rest_go_on(tmp_path):
    started = time.time()
    result = pytest_on(tmp_path, HUNG, "-v", "--basetemp", str(tmp_path / "base"), plugin="early")
    out = result.stdout
    assert re.findall(r"^test_it.py::(test_\w+) (PASSED|ERROR)", out, re.MULTILINE) == [
        ("test_plain", "PASSED"), ("test_hangs", "ERROR"), ("test_after", "PASSED")], out
    assert "the early run hangs took more than 2 s, twice what it takes in the full suite (@takes(1))" in out
    assert "the run's last words before it hangs" in out  # its own output, in its tests' failure
    assert time.time() - started < 30, out  # its deadline, not its 60 s of sleep
    [pid] = (int(path.read_text()) for path in (tmp_path / "base").glob("early/*/pid"))
    assert not alive(pid)  # killed with the run, though it had a session of its own


def test_at_an_early_end_of_the_session_its_runs_processes_are_killed_and_the_rest_never_start(tmp_path):
    result = pytest_on(tmp_path, UNFINISHED, "-x", "--basetemp", str(tmp_path / "base"), plugin="early")
    assert "FAILED test_it.py::test_fails_first" in result.stdout and "1 failed" in result.stdout, result.stdout
    [pids] = (path.read_text().split() for path in (tmp_path / "base").glob("early/*/pid"))
    assert not any(alive(int(pid)) for pid in pids)  # killed, not left to sleep their 60 s
    assert not list((tmp_path / "base").glob("early/*/started"))


def test_a_preloaded_run_is_its_command_lines_run_its_environment_included(monkeypatch, tmp_path):
    """processes.Preloaded forks a run from a server that imported its modules: the exit code and the output are the
    command line's; a variable set since the server started reaches the run (a new server); past its timeout the run
    is killed, and the next run is served."""
    preloaded, hangs = processes.Preloaded("labs.check", "labs.harness"), tmp_path / "lab.py"
    hangs.write_text("import time\ntime.sleep(3600)\n")
    try:
        wrong = [sys.executable, "-m", "labs.check", "no-such-lab"]
        forked, real = preloaded.run(wrong, timeout=60), processes.run(wrong, timeout=60)
        assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)
        assert forked.returncode == 2 and "invalid choice: 'no-such-lab'" in forked.stderr, forked.stderr
        monkeypatch.setenv("LABS_DEADLINE_S", "1")  # read as labs.check starts
        hung = preloaded.run([sys.executable, "-m", "labs.check", "01", "--file", str(hangs)], timeout=30)
        assert "did not end within the check's 1 s" in hung.stdout, hung.stdout + hung.stderr
        monkeypatch.setenv("LABS_DEADLINE_S", "60")
        with pytest.raises(subprocess.TimeoutExpired):
            preloaded.run([sys.executable, "-m", "labs.check", "01", "--file", str(hangs)], timeout=2)
        assert preloaded.run(wrong, timeout=60).returncode == 2
    finally:
        preloaded.close()


def test_every_process_the_suite_starts_ray_workers_included_collects_garbage_as_startup_says(ray_driver):
    """tests/startup/sitecustomize.py runs first in a process the suite starts and in a Ray worker of the test
    cluster (its threshold, not Python's 700)."""
    import ray

    def threshold():
        import gc
        return list(gc.get_threshold())

    child = processes.run([sys.executable, "-c", "import gc; print(list(gc.get_threshold()))"], timeout=60)
    worker = ray.get(ray.remote(num_cpus=0)(threshold).remote(), timeout=60)
    assert (child.stdout.strip(), worker) == ("[10000, 10, 10]", [10000, 10, 10])
