"""Runs that start with the session, for the tests marked early (a plugin: conftest.py's pytest_plugins; proved by
test_suite_rules.py). A long run that mostly waits (on Ray's polls, on a node's return) then waits while the other
tests work, not while the whole suite waits for it:

    @takes(95)                                          # s, measured in the full suite: its deadline is twice that
    def elastic_run(folder, lane): ...                  # starts its processes with lane.start or lane.run

    @pytest.mark.early(run=elastic_run)
    def test_losing_a_node_...(early_run): ...          # early_run: what elastic_run returned

No run is orchestrated in the pytest process. As the session starts, this file runs as a script (the queue), in a
process group of its own: it runs the session's early runs one after another, in the order of their tests, each as
`python tests/early.py --one FILE:FUNCTION FOLDER`, a process group of its own that calls the function and pickles
what it returned (or raised) into FOLDER. A run past its deadline is killed with everything it started, and its
tests fail with its last output lines. The tests marked early run last and read each outcome once. At the session's
end (pytest -x included) the queue and the run it is on are killed, and the runs not started never start."""
import json
import pickle
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
from processes import ROOT, kill_tree, start
from suite_rules import time_limit

OUTCOME, LOG, TAIL_LINES = "outcome.pickle", "run.log", 30
BASE = pytest.StashKey[Path]()  # the session's folder of early runs


def takes(seconds: float):
    """What an early run takes in the full suite, measured (rounded up, for a slower processor than the one measured
    on: say both beside it): past twice that, it is killed and its tests fail."""
    def measured(run):
        run.seconds = seconds
        return run
    return measured


class Lane:
    """How an early run starts its processes: in the environment as the session started, one OpenMP thread each,
    each in the run's process group (killed with it)."""

    def __init__(self, folder: Path):
        self.folder, self.count = folder, 0
        # Ray starts its workers at nice 15, as the test cluster does not (conftest.ray_cluster): at the other tests'
        # priority, a run's Ray would otherwise wait for the cores through its own timeouts (a worker group's start:
        # 60 s) whenever the other tests keep both busy.
        self.env = {"RAY_worker_niceness": "0"}

    def start(self, cmd, env=None, **options) -> subprocess.Popen:
        """The started process (Popen's options), with these variables added to the environment."""
        return start(cmd, env={**self.env, **(env or {})}, **options)

    def run(self, cmd, timeout: float, env=None) -> subprocess.CompletedProcess:
        """start(), to its end: its exit code and output, written as it goes to files in the run's folder (the
        lines a run killed at its deadline shows)."""
        self.count += 1
        out, err = (self.folder / f"{self.count:02d}.{stream}" for stream in ("out", "err"))
        with out.open("w") as stdout, err.open("w") as stderr:
            process = self.start(cmd, env, stdout=stdout, stderr=stderr)
            process.wait(timeout=timeout)
        return subprocess.CompletedProcess(cmd, process.returncode, out.read_text(), err.read_text())


def pytest_collection_modifyitems(items):
    """The tests marked early go last: their runs have had the whole session to end."""
    items.sort(key=lambda item: item.get_closest_marker("early") is not None)  # stable: the rest keep their order


class EarlyRun:
    """One run of the queue, as the pytest process sees it: result() waits for its outcome (at most until the
    queue's deadline for it), reads it once, and returns what the run returned or raises what it raised."""

    def __init__(self, run, folder: Path, deadline: float, queue: subprocess.Popen):
        self.name, self.folder, self.deadline, self.queue = run.__name__, folder, deadline, queue
        self.outcome = None

    def result(self):
        if self.outcome is None:
            path = self.folder / OUTCOME
            while not path.exists():
                if self.queue.poll() is not None and not path.exists():
                    raise AssertionError(f"the early runs' queue ended ({self.queue.returncode}) before {self.name}: "
                                         f"{tail(self.folder.parent / 'queue.log')}")
                if time.time() > self.deadline:
                    raise AssertionError(f"no outcome of {self.name} by the queue's deadline for it: "
                                         f"{tail(self.folder / LOG)}")
                time.sleep(0.2)
            self.outcome = pickle.loads(path.read_bytes())
        kind, value = self.outcome
        if kind == "error":
            raise value
        return value


@pytest.fixture(scope="session", autouse=True)
def early_runs(request, tmp_path_factory):
    """Each run that a test of this session is marked early(run=run) with, once for all its tests, in the order of
    those tests: {run: EarlyRun}. The queue starts here and is killed, with the run it is on, at the session's end."""
    runs = []
    for item in request.session.items:
        if (marker := item.get_closest_marker("early")) and marker.kwargs["run"] not in runs:
            runs.append(marker.kwargs["run"])
    if not runs:
        yield {}
        return
    base = request.config.stash[BASE] = tmp_path_factory.mktemp("early", numbered=False)
    queue = [dict(run=f"{Path(sys.modules[run.__module__].__file__)}:{run.__name__}", seconds=2 * run.seconds,
                  measured=run.seconds, folder=str(base / f"{i}-{run.__name__}")) for i, run in enumerate(runs)]
    (base / "queue.json").write_text(json.dumps(queue))
    with (base / "queue.log").open("w") as log:
        process = start([sys.executable, __file__, str(base / "queue.json")], stdout=log, stderr=subprocess.STDOUT,
                        start_new_session=True)
    deadline, found = time.time() + 60, {}  # 60 s: the queue's and each run's interpreter starting
    for run, entry in zip(runs, queue, strict=True):
        deadline += entry["seconds"]
        found[run] = EarlyRun(run, Path(entry["folder"]), deadline, process)
    yield found
    ended = all((Path(entry["folder"]) / OUTCOME).exists() for entry in queue)
    try:  # a queue whose runs have all ended ends by itself, once it has noted the last one's time
        process.wait(timeout=10 if ended else 0)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)  # the queue kills the run it is on, with all it started
    try:
        process.wait(timeout=30)
    finally:
        kill_tree(process.pid)


@pytest.fixture
@time_limit(3600)  # past the queue's own deadlines (EarlyRun), which bound the wait
def early_run(request, early_runs):
    """What this test's early run returned, once it has ended; what it raised, or why it was killed."""
    return early_runs[request.node.get_closest_marker("early").kwargs["run"]].result()


def pytest_terminal_summary(terminalreporter, config):
    """Each early run's time beside its deadline: what `@takes` should say."""
    base = config.stash.get(BASE, None)
    for path in sorted(base.glob("*/seconds") if base else []):
        run = json.loads(path.read_text())
        terminalreporter.write_line(f"early run {path.parent.name}: {run['seconds']:.0f} s, its deadline "
                                    f"{run['deadline']:.0f} s (@takes({run['measured']:g}))")


PROGRESS_BAR = re.compile(r"^\s*$|\d+/\d+ \[[\d:<]+|it/s\]|s/it\]")  # tqdm's redrawn lines, and blank ones


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    text = path.read_text(errors="replace").splitlines() if path.exists() else ["(no output)"]
    text = [line for line in text if not PROGRESS_BAR.search(line)][-lines:]
    return f"\n--- last lines of {path.name} ---\n" + "\n".join(text)


def last_lines(folder: Path) -> str:
    """The run's own output, then that of the newest processes it started (their files in its folder)."""
    started = sorted((p for p in folder.iterdir() if p.suffix in (".out", ".err", ".log") and p.name != LOG),
                     key=lambda p: p.stat().st_mtime)
    return "".join(tail(path) for path in [folder / LOG, *started[-3:]])


def write_outcome(folder: Path, kind: str, value) -> None:
    try:
        data = pickle.dumps((kind, value))
    except Exception:  # an exception that does not pickle: its words
        data = pickle.dumps(("error", AssertionError("".join(traceback.format_exception(value)))))
    (folder / f"{OUTCOME}.part").write_bytes(data)
    (folder / f"{OUTCOME}.part").rename(folder / OUTCOME)


def run_one(spec: str, folder: Path) -> None:
    """In the run's own process: the function of FILE:FUNCTION, called as function(folder, Lane(folder))."""
    file, name = spec.rsplit(":", 1)
    sys.path[:0] = [str(Path(file).parent), str(ROOT / "tests"), str(ROOT)]
    module = __import__(Path(file).stem)
    try:
        write_outcome(folder, "value", getattr(module, name)(folder, Lane(folder)))
    except BaseException as error:  # noqa: B036 (a KeyboardInterrupt is the run's outcome too)
        error.add_note(f"(in the early run {name}, its own process)")
        write_outcome(folder, "error", error)


def run_queue(queue_file: Path) -> None:
    """The queue: each run in turn, in a process group of its own, killed with all it started past its deadline."""
    current = []

    def stop(signum, frame):
        for process in current:
            kill_tree(process.pid)
        sys.exit(1)

    signal.signal(signal.SIGTERM, stop)
    for entry in json.loads(queue_file.read_text()):
        folder, started = Path(entry["folder"]), time.time()
        folder.mkdir()
        with (folder / LOG).open("w") as log:
            process = start([sys.executable, __file__, "--one", entry["run"], str(folder)], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
        current[:] = [process]
        try:
            process.wait(timeout=entry["seconds"])
        except subprocess.TimeoutExpired:
            kill_tree(process.pid)
            name = entry["run"].rsplit(":", 1)[1]
            write_outcome(folder, "error", AssertionError(
                f"the early run {name} took more than {entry['seconds']:g} s, twice what it takes in the full suite "
                f"(@takes({entry['measured']:g})): killed, with every process it started{last_lines(folder)}"))
        finally:
            kill_tree(process.pid)  # what it left, had it ended
        if not (folder / OUTCOME).exists():
            write_outcome(folder, "error", AssertionError(
                f"the early run's process ended (exit {process.returncode}) with no outcome{last_lines(folder)}"))
        (folder / "seconds").write_text(json.dumps(dict(seconds=time.time() - started, deadline=entry["seconds"],
                                                        measured=entry["measured"])))


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        run_one(sys.argv[2], Path(sys.argv[3]))
    else:
        run_queue(Path(sys.argv[1]))
