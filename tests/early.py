"""Runs that start with the session, for the tests marked early (conftest.py loads this plugin; test_suite_rules.py
proves it). A long run that mostly waits (on Ray's polls, on a node's return) then waits while the other tests work,
not while the whole suite waits for it:

    def elastic_run(folder, lane): ...                  # starts its processes with lane.start or lane.run

    @pytest.mark.early(run=elastic_run)
    def test_losing_a_node_...(early_run): ...          # early_run: what elastic_run returned

The runs go one after another, in a thread, in the order of their tests, which run last."""
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from suite_rules import time_limit

ROOT = Path(__file__).resolve().parents[1]


class Lane:
    """How an early run starts its processes: from the repository root, in the environment as the session started
    (a test may change this process's environment meanwhile), one OpenMP thread each; each is killed at the session's
    end, should its test never have come (pytest -x)."""

    def __init__(self):
        # Ray starts its workers at nice 15, as the test cluster does not (conftest.ray_cluster): see start().
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "RAY_worker_niceness": "0"}
        self.processes = []

    def start(self, cmd, env=None, **options) -> subprocess.Popen:
        """The started process (Popen's options), with these variables added to the environment. At the other
        tests' priority: niced, a run's Ray would wait for the cores through its own timeouts (a worker group's
        start: 60 s) whenever the other tests keep both busy."""
        self.processes.append(subprocess.Popen(cmd, cwd=ROOT, env={**self.env, **(env or {})}, text=True, **options))
        return self.processes[-1]

    def run(self, cmd, timeout: float, env=None) -> subprocess.CompletedProcess:
        """start(), to its end: its exit code and output."""
        process = self.start(cmd, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stdout, stderr = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, process.returncode, stdout, stderr)


def pytest_collection_modifyitems(items):
    """The tests marked early go last: their runs have had the whole session to end."""
    items.sort(key=lambda item: item.get_closest_marker("early") is not None)  # stable: the rest keep their order


@pytest.fixture(scope="session", autouse=True)
def early_runs(request, tmp_path_factory):
    """Each run that a test of this session is marked early(run=run) with: run(folder, lane), called in the order of
    those tests as the session starts, once for all the tests marked with it. Yields {run: its future}. At the
    session's end the processes of a run still going are killed, and the runs not started by then never start."""
    lane, runs = Lane(), {}
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="early") as thread:
        for item in request.session.items:
            if (marker := item.get_closest_marker("early")) and marker.kwargs["run"] not in runs:
                runs[marker.kwargs["run"]] = thread.submit(marker.kwargs["run"], tmp_path_factory.mktemp("early"), lane)
        yield runs
        thread.shutdown(wait=False, cancel_futures=True)
        for process in lane.processes:
            process.kill()


@pytest.fixture
@time_limit(600)
def early_run(request, early_runs):
    """What this test's early run returned, once it has ended; its error, if it failed."""
    return early_runs[request.node.get_closest_marker("early").kwargs["run"]].result()
