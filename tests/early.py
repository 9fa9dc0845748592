"""Runs that start with the session, for the tests marked early (conftest.py loads this plugin; test_suite_rules.py
proves it). A long run that mostly waits (on Ray's polls, on a node's return) then waits while the other tests work,
not while the whole suite waits for it:

    def elastic_run(folder, env, processes): ...       # starts its processes with env, puts them in processes

    @pytest.mark.early(run=elastic_run)
    def test_losing_a_node_...(early_run): ...          # early_run: what elastic_run returned

The runs go one after another, in a thread, in the order of their tests, which run last."""
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from suite_rules import time_limit


def pytest_collection_modifyitems(items):
    """The tests marked early go last: their runs have had the whole session to end."""
    items.sort(key=lambda item: item.get_closest_marker("early") is not None)  # stable: the rest keep their order


@pytest.fixture(scope="session", autouse=True)
def early_runs(request, tmp_path_factory):
    """Each test marked early(run=run) that this session runs: run(folder, env, processes), called as the session
    starts. env is the environment as the session started, with one thread per process (a test may change this
    process's environment meanwhile); the processes a run puts in processes are killed at the session's end, should
    its test never have come (pytest -x), and the runs not started by then never start."""
    env, processes, runs = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}, [], {}
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="early") as lane:
        for item in request.session.items:
            if marker := item.get_closest_marker("early"):
                runs[item.nodeid] = lane.submit(marker.kwargs["run"], tmp_path_factory.mktemp("early"), env, processes)
        yield runs
        lane.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.kill()


@pytest.fixture
@time_limit(600)
def early_run(request, early_runs):
    """What this test's early run returned, once it has ended; its error, if it failed."""
    return early_runs[request.node.nodeid].result()
