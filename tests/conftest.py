import argparse
import builtins
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
# Every fixture's time limit and CI's no-skip rule: hooks, which pytest finds by their names here.
from suite_rules import pytest_fixture_setup, pytest_runtest_makereport, time_limit  # noqa: F401
# The runs that start with the session and the tests that take them last (tests marked early): early.py.
from early import early_run, early_runs, pytest_collection_modifyitems  # noqa: F401

from common.meter import summary_of  # noqa: E402
from labs.harness import free_port  # torchrun's and the launcher's rendezvous ports, as the labs' checks pick them

ROOT = Path(__file__).resolve().parents[1]
SINGLE = "01-vanilla-pytorch-ddp/train_single_machine.py"
RAY_DDP = "02-ray-train-ddp/train_ray_ddp.py"
RAY_FSDP2 = "04-ray-train-fsdp2/train_ray_fsdp2.py"
TUNE = "05-ray-tune/tune_ray_ddp.py"
TRAINING_STEPS = ("train_single_machine.py", "train_ddp.py", "train_ray_ddp.py", "train_ray_ddp_with_ray_data.py",
                  "train_ray_fsdp.py", "train_ray_fsdp2.py", "tune_ray_ddp.py")
# Tiny, fast settings on the synthetic data: 2 epochs of 6 steps. In so few steps the recipe's lr 2e-3 often
# leaves the conv stem at chance; at 1e-3 three data orders reached 36-41% test accuracy (on 256 images). Evaluated
# on the first EVAL_IMAGES of the 1,024 synthetic test images, each scored twice (itself and its mirror): a run
# need only show that it learns, and the tests compare accuracies for equality. A single-machine run took 7.1
# core-seconds evaluating on 256, 5.4 to 5.9 on 64 (one thread each, as in the suite; 2026-11-27).
EVAL_IMAGES = 64
SMOKE = ["--data", "synthetic", "--model", "tiny", "--epochs", "2", "--steps-per-epoch", "6", "--batch-size", "32",
         "--lr", "1e-3", "--eval-images", str(EVAL_IMAGES)]
# The multi-process smoke runs (torchrun DDP, Ray DDP, FSDP1, FSDP2) accumulate 2 micro-batches per optimizer step:
# 2 ranks x 2 micro-batches of 8 images, which must compute what one process does with batches of 32 (test_step01).
ACCUMULATE = ["--grad-accum-steps", "2"]
# and profile 2 optimizer steps after the 2 warm-up steps: a trace per rank, and the collectives per step.
PROFILE = ["--profile-steps", "2"]
# Runs that sum the same gradients in another order (N ranks vs 1: step 01's single process, step 04's run on 1
# worker then 2) end equal up to float rounding, which Adam's normalisation amplifies where a gradient is tiny: 1e-4
# is a tenth of one step at lr 1e-3. Measured: at most 2.8e-5 (the stem's convolutions, 2 ranks x 16 vs 1 x 32
# images, 12 steps at lr 2e-3). Runs on 2 ranks each (torchrun DDP, Ray DDP, FSDP1) end equal bit for bit.
ROUNDING = 1e-4
# No usage report from the tests' Ray (this machine may be offline), and no actor started in every Ray Data run to
# collect one: a process fewer for the 2 cores.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Nor a preemption watcher per worker group (an actor that waits for a cloud node's notice of preemption): none comes
# here, and each cost 1.3 core-seconds. The scripts turn it off themselves on a Ray they start (--address local).
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")


def load_script(path: str):
    """A script of this repository as a module (its main() does not run), to test its functions."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Parsed(Exception):
    """Raised in place of a script's work: its parser and the flags it parsed (parse_only)."""


def parse_only(script: str, *flags, check=True) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """A script's main() run until its parser has parsed these flags, and (check) checked them as common/flags.py's
    Parser does, then stopped: no work. Returns the parser and the parsed flags; a refused flag is the SystemExit of
    argparse or of the checks, with the error on stderr. Any script: a step, or a benchmark's plain argparse."""
    from common.flags import Parser

    argparse_parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(parser, args=None, namespace=None):
        parsed = argparse_parse(parser, args, namespace)
        if check and isinstance(parser, Parser):
            parser.check(parser, parsed)
        raise Parsed(parser, parsed)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", [script, *flags])
        patch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
        patch.setattr(Parser, "parse_args", parse_then_stop)
        with pytest.raises(Parsed) as parsed:
            load_script(script).main()
    return parsed.value.args


def forbid_ray(monkeypatch, why: str):
    """ray.init fails the test: for what must end before Ray starts, or never start it (local mode)."""
    import ray

    def no_ray(**options):
        raise AssertionError(f"Ray started {why}")

    monkeypatch.setattr(ray, "init", no_ray)


# A line that Ray's log monitor prints on this process's stderr for another process of the test cluster (a raylet
# saying its disk is over 95% full, a worker's warning): `(raylet) ...`, `(RayTrainWorker pid=123, ip=...) ...`,
# its prefix coloured or not. It reaches whichever test runs at the time, and is no line of that test's script.
OTHER_PROCESS_LINE = re.compile(r"^(\x1b\[[\d;]*m)?\((raylet|autoscaler|[^()]*\bpid=\d+)\b[^()]*\)")


@pytest.fixture
def run_main(capsys, monkeypatch):
    """Runs a script's main() in this process, as its command line would, for errors raised before any work:
    no interpreter to start and no torch or Ray to import again, seconds saved per call. Returns (exit code,
    stderr lines); a one-line error is a string exit code, which Python prints as the only line on stderr. The
    lines the test cluster's other processes print here meanwhile are left out."""
    def run_main(script, *flags):
        monkeypatch.setattr(sys, "argv", [script, *flags])
        with pytest.raises(SystemExit) as exit_info:
            load_script(script).main()
        stderr = capsys.readouterr().err.strip().splitlines()
        return exit_info.value.code, [line for line in stderr if not OTHER_PROCESS_LINE.match(line)]
    return run_main


@pytest.fixture
def main_summary(capsys, monkeypatch):
    """Runs a script's main() in this process, as its command line would, to the end: its JSON summary (the last
    line of stdout) and its stdout. For checks that need no new interpreter, or that look inside this process."""
    def main_summary(script, *flags, module=None):
        """module: the script already loaded (load_script), for a run with some of its functions replaced."""
        monkeypatch.setattr(sys, "argv", [script, *flags])
        # What a run may change in its process, restored after: the environment (local mode sets torchrun's),
        # print (Ray's tqdm_ray patches it), and the thread count, 1 as in the subprocesses (the same rounding).
        monkeypatch.setattr(builtins, "print", builtins.print)
        environment, threads = dict(os.environ), torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            (module or load_script(script)).main()
        finally:
            os.environ.clear()
            os.environ.update(environment)
            torch.set_num_threads(threads)
        stdout = capsys.readouterr().out
        return summary_of(json.loads(stdout.strip().splitlines()[-1])), stdout
    return main_summary


@pytest.fixture
def main_error(run_main):
    """The one-line error that a script's main() ends with (see run_main), checked to be one line and alone."""
    def main_error(script, *flags) -> str:
        error, stderr = run_main(script, *flags)
        assert isinstance(error, str) and error.startswith("error: ") and "\n" not in error and stderr == [], (
            error, stderr)
        return error
    return main_error


@pytest.fixture
def cluster_driver(ray_driver, monkeypatch) -> str:
    """The test cluster's address, for a Ray script's main() run in this process (main_summary, main_error), a
    driver on that cluster already: the script's ray.init is skipped, and what it asks Ray, that cluster answers. A
    new interpreter would spend 8-11 s importing torch and Ray."""
    import ray

    monkeypatch.setattr(ray, "init", lambda **options: None)
    return ray_driver


@pytest.fixture
def cluster_main_error(cluster_driver, main_error):
    """main_error for errors found once a Ray script has connected (--actors or --num-workers larger than the
    cluster), on the test cluster (cluster_driver)."""
    def cluster_main_error(script, *flags) -> str:
        return main_error(script, *flags, "--address", cluster_driver)
    return cluster_main_error


def run(cmd, timeout=180, env=None, **kwargs):
    """Run a command from the repository root, with these variables added; return the CompletedProcess (text). A
    training step must name its --model: no test depends on the default preset, which is chosen for 10-epoch runs,
    not for tests."""
    return subprocess.run(cmd, **command_options(cmd, env), capture_output=True, text=True, timeout=timeout, **kwargs)


def start(cmd, stdout, stderr, env=None) -> subprocess.Popen:
    """run(), in the background: the started process, writing to these files, with these variables added."""
    return subprocess.Popen(cmd, **command_options(cmd, env), stdout=stdout, stderr=stderr, text=True)


def command_options(cmd, env=None) -> dict:
    if any(str(part).endswith(TRAINING_STEPS) for part in cmd):
        assert "--model" in cmd, f"name the preset this test trains: {cmd}"
    return dict(cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})})


def python(script, *args, **kwargs):
    return run([sys.executable, str(ROOT / script), *args], **kwargs)


def torchrun(script, nproc, *args, **kwargs):
    return run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                "--master-port", str(free_port()), str(ROOT / script), *args], **kwargs)


@pytest.fixture(scope="session")
def ray_cluster():
    """One Ray cluster for every Ray test (starting Ray costs tens of seconds on 2 cores): two nodes of
    one CPU each, so every 2-worker run really spans two nodes. Yields the address scripts attach to."""
    from ray.cluster_utils import Cluster

    # Ray starts its workers at nice 15; at 0 they come before the smoke tier's background runs (nice 19), whose
    # time the cluster's runs, one after another, would otherwise share.
    os.environ["RAY_worker_niceness"] = "0"
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, include_dashboard=False))
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster.address
    cluster.shutdown()


@pytest.fixture(scope="session")
def ray_driver(ray_cluster):
    """This test process connected to the test cluster as a Ray driver, for tests that call Ray Train directly."""
    import ray

    from common.ray_setup import POLL_INTERVAL_S

    # As the Ray scripts do (init_options): every report waits for the Train controller's poll, 2 s by default.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", str(POLL_INTERVAL_S))
    ray.init(address=ray_cluster, logging_level="ERROR")
    # A script's main() run in this process ends with ray.shutdown (print_run_summary): not of the suite's driver.
    shutdown, ray.shutdown = ray.shutdown, lambda: None
    yield ray_cluster
    ray.shutdown = shutdown
    ray.shutdown()


@pytest.fixture(scope="session")
def single_run(tmp_path_factory):
    """One uninterrupted single-machine run that several tests compare against."""
    checkpoint_dir = tmp_path_factory.mktemp("single")
    result = python(SINGLE, *SMOKE, "--checkpoint-dir", str(checkpoint_dir))
    return final_json(result), checkpoint_dir, result


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory):
    """One torchrun DDP run (2 processes) that steps 01 and 02 compare against."""
    checkpoint_dir = tmp_path_factory.mktemp("ddp")
    result = torchrun("01-vanilla-pytorch-ddp/train_ddp.py", 2, *SMOKE, *ACCUMULATE, *PROFILE, "--checkpoint-dir",
                      str(checkpoint_dir))
    return final_json(result), checkpoint_dir, result


@pytest.fixture(scope="session")
def ray_run(ray_cluster, tmp_path_factory):
    """One step-02 run (2 Ray workers on 2 nodes) that steps 02 to 06 compare against. Its last worker crashes after
    epoch 1 and Ray restarts the worker group from that checkpoint: the run still ends with torchrun DDP's weights,
    bit for bit (test_step02), so every comparison with it checks the restart too."""
    storage = tmp_path_factory.mktemp("ray_ddp")
    result = ray_script(RAY_DDP, ray_cluster, storage, *ACCUMULATE, *PROFILE, "--fail-at-epoch", "1",
                        "--max-failures", "1")
    return final_json(result), storage, result


@pytest.fixture(scope="session")
@time_limit(420)  # two Ray runs, each limited to run()'s 180 s
def fsdp2_run(ray_cluster, tmp_path_factory):
    """One step-04 run, resumed on another number of workers: it starts on 1, crashes after epoch 1 with no
    restart left, and --resume finishes it on 2, so epoch 1's sharded checkpoint is resharded from 1 rank to 2.
    Sharded checkpoints, the last one with the full model.pt (steps 04 and 06)."""
    storage = tmp_path_factory.mktemp("fsdp2")
    crashed = ray_script(RAY_FSDP2, ray_cluster, storage, *ACCUMULATE, "--num-workers", "1", "--fail-at-epoch", "1",
                         "--max-failures", "0")
    assert crashed.returncode != 0, crashed.stderr[-3000:]
    result = ray_script(RAY_FSDP2, ray_cluster, storage, *ACCUMULATE, *PROFILE, "--resume")
    return final_json(result), storage, result


# The sweep's seed: its searched flags (and every trial's data order and weights). With it, trial 1 (lr 2.4e-3) ends
# epoch 2 at 20.3% validation accuracy, behind trial 0's 25.0% (lr 1e-3; 3 images of 64), so ASHA stops it, and
# trial 2 (lr 5e-4) at 50.0% goes on. Checked by test_asha_stopped_a_trial_behind... (test_step05), which says so if
# a change of the recipe or of the search space moves it.
SWEEP_SEED = "0"


def finished_sweep(folder: Path, lane) -> tuple[dict, Path, subprocess.CompletedProcess]:
    """Step 05's sweep that test_step05 checks, and in the full suite the smoke tier's sweep too (test_smoke): 3
    trials of 2 workers (both CPUs), one at a time, 3 tiny epochs each. ASHA compares trials at epoch 2 and stops
    trial 1, behind trial 0 then: trial 2 can start only once the stopped trial's workers have given their CPUs back
    (FreeStoppedTrialsWorkers), else the sweep waits for them forever (and times out here). No worker crashes here:
    a restart within a trial is proved once, by test_step05's interrupted sweep. On a Ray that it starts on this
    machine (--address local), with the session (an early run: early.py). Its report, its folder and the run."""
    result = lane.run([sys.executable, str(ROOT / TUNE), *SMOKE, "--num-workers", "2", "--epochs", "3",
                       "--num-samples", "3", "--grace-period", "2", "--seed", SWEEP_SEED, "--profile-steps", "1",
                       "--address", "local", "--checkpoint-dir", str(folder / "runs"), "--out", str(folder / "out")],
                      timeout=900)  # 515 s for this sweep (cluster included) with the 2 cores 9x oversubscribed
    return final_json(result), folder, result


def registered_epoch(storage: Path) -> int:
    """The epoch of the newest checkpoint that Ray Train's controller has registered, from its snapshot in the run
    folder: a restarted group resumes from there. A checkpoint reported but not registered yet (the controller polls
    the workers) would be lost with a worker that dies, and its epoch trained again."""
    for snapshot in storage.glob("*/checkpoint_manager_snapshot.json"):
        try:
            latest = json.loads(snapshot.read_text())["latest_checkpoint_result"]
        except (OSError, ValueError, KeyError):  # being written
            return 0
        return latest["metrics"]["epoch"] if latest else 0
    return 0


def kill_a_worker_in_epoch_2(cmd, storage: Path, logs: Path, timeout: float,
                             lane) -> tuple[subprocess.CompletedProcess, int]:
    """A Ray step on 2 workers (cmd, whose run folder goes in storage) on a Ray it starts (--address local), one of
    whose workers is killed with kill -9 in epoch 2, the way a real crash comes: as soon as Ray has registered epoch
    1's checkpoint, which a restart resumes from (give the run enough --steps-per-epoch for that to be mid-epoch).
    Started by an early run's lane (early.py). Returns the run once it has ended, and the killed process id."""
    with (logs / "stdout").open("w") as out, (logs / "stderr").open("w") as err:
        run = lane.start(cmd, stdout=out, stderr=err)
        try:
            deadline = time.time() + timeout
            while registered_epoch(storage) < 1:
                assert run.poll() is None and time.time() < deadline, (logs / "stderr").read_text()[-3000:]
                time.sleep(0.2)
            workers = subprocess.run(["pgrep", "-f", "ray::RayTrainWorker"], capture_output=True, text=True)
            ours = descendants(run.pid)  # its Ray's workers, not those of a test running meanwhile
            victim = [pid for pid in map(int, workers.stdout.split()) if pid in ours][-1]
            os.kill(victim, signal.SIGKILL)
            run.wait(timeout=max(deadline - time.time(), 1))
        finally:
            run.kill()
    stdout, stderr = ((logs / stream).read_text() for stream in ("stdout", "stderr"))
    return subprocess.CompletedProcess(cmd, run.returncode, stdout, stderr), victim


def descendants(pid: int) -> set[int]:
    """The processes started by this one, and by those, and so on: those of the Ray that a run started, not those of
    another Ray on this machine (the test cluster's, a Ray job that someone runs beside the suite)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError):  # ended while being read
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        found.update(new := children.get(todo.pop(), []))
        todo += new
    return found


def ray_script(script, address, storage, *args, **kwargs):
    """A Ray step on the shared test cluster, 2 workers, smoke settings."""
    return python(script, *SMOKE, "--num-workers", "2", "--address", address, "--checkpoint-dir", str(storage),
                  *args, **kwargs)


def resumed_after(stdout: str) -> list[int]:
    """The epoch after which each resume or restart of a run went on, from rank 0's one line for it: "resumed from
    <checkpoint> after epoch N" (a restarted Ray worker's line has Ray's prefix in front)."""
    return [int(epoch) for epoch in re.findall(r"resumed from \S+ after epoch (\d+)\n", stdout)]


def final_json(result) -> dict:
    """The whole summary that a step script's last stdout line names (steps 05 and 06: the line itself)."""
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return summary_of(json.loads(result.stdout.strip().splitlines()[-1]))


# What a step's history holds for each epoch, and what ray.train.report carries: the epoch's own fields, nothing else.
EPOCH_FIELDS = {"epoch", "train_loss", "test_accuracy", "epoch_time_s", "world_size", "images_per_s"}
LAST_LINE_MAX = 250


def assert_short_last_line(stdout: str, summary: dict, run_folder: Path):
    """A step's last line: one short JSON object, the headline of the summary it names, in the run's folder."""
    line = stdout.strip().splitlines()[-1]
    headline = json.loads(line)
    assert len(line) <= LAST_LINE_MAX, f"{len(line)} characters: {line}"
    assert Path(headline.pop("summary")) == (Path(run_folder) / "summary.json").resolve()
    assert list(headline) == ["step", "world_size", "model", "train_loss", "test_accuracy", "images_per_s",
                              "wall_time_s"]
    for key, value in headline.items():
        assert value == pytest.approx(summary[key], abs=0.06) if isinstance(value, float) else value == summary[key]


def reported_metrics(run_folder: Path) -> list[dict]:
    """What ray.train.report carried with each checkpoint Ray kept, from its controller's snapshot."""
    snapshot = json.loads((Path(run_folder) / "checkpoint_manager_snapshot.json").read_text())
    return [result["metrics"] for result in snapshot["checkpoint_results"]]


def profile_summary(folder) -> dict:
    """What benchmarks/trace_analysis.py reads from the --profile-steps traces of a run: step 01's --checkpoint-dir,
    or a Ray run's folder in its storage (the traces are the run's; the reading is the benchmarks')."""
    found = sorted({trace.parents[1] for trace in Path(folder).glob("**/profile/rank*.json.gz")})
    assert len(found) == 1, found
    return load_script("benchmarks/trace_analysis.py").summarize(found[0])


def collectives_per_step(summary: dict) -> list[dict]:
    """Each rank's collectives per optimizer step, as {kind: calls}."""
    return [{kind: c["calls"] for kind, c in rank["mean"]["collectives"].items()} for rank in summary["ranks"]]


def ray_checkpoints(storage) -> list[Path]:
    """The checkpoint folders of the newest Ray run under --checkpoint-dir, oldest first."""
    run = sorted(p for p in Path(storage).iterdir() if p.is_dir())[-1]
    return sorted(p for p in run.glob("checkpoint_*") if p.is_dir())


def latest_ray_checkpoint(storage) -> Path:
    return ray_checkpoints(storage)[-1]


def best_epoch(history: list) -> dict:
    """The epoch whose checkpoint Ray calls best (CheckpointConfig scores test accuracy): the most accurate, and of a
    tie the latest, as Ray orders equal scores by when they were reported (test_runs checks it)."""
    return max(reversed(history), key=lambda epoch: epoch["test_accuracy"])


def checkpoint_weights(checkpoint_dir) -> dict:
    """Model weights from the checkpoint.pt of a step's checkpoint folder (step 01's --checkpoint-dir or a Ray
    checkpoint of steps 02 and 03), read here as plainly as it can be: the tests' own reader, against which step
    06's load_weights (every format) is checked, and which shares no code with it."""
    return torch.load(Path(checkpoint_dir) / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]


def assert_same_weights(a: dict, b: dict, atol=0.0):
    """Bitwise equal by default. With atol (runs that sum gradients in another order), equal up to float
    rounding, except the attention key biases: their true gradient is exactly zero (a bias added to every
    key shifts all attention logits of a query equally, and softmax ignores that), so what they receive
    is rounding noise, which Adam's normalisation turns into full-size steps of any sign."""
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        if atol and name.endswith("in_proj_bias"):
            x, y = drop_key_slice(x), drop_key_slice(y)
        torch.testing.assert_close(x, y, atol=atol, rtol=0 if atol == 0 else 1e-4, msg=name)


def drop_key_slice(in_proj_bias: torch.Tensor) -> torch.Tensor:
    query, _, value = in_proj_bias.chunk(3)
    return torch.cat([query, value])


def assert_sane_summary(summary: dict, step: str, world_size: int):
    assert summary["step"] == step and summary["world_size"] == world_size
    assert summary["model"] == "tiny" and summary["data"] == "synthetic" and summary["epochs"] == 2
    assert summary["params"] > 100_000
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    # The synthetic classes are easy: 6 steps of training must beat chance (10%) clearly.
    assert summary["test_accuracy"] > 0.2
    assert len(summary["history"]) == 2 and summary["history"][1]["train_loss"] < summary["history"][0]["train_loss"]
    assert all(epoch.keys() == EPOCH_FIELDS for epoch in summary["history"])
    assert summary["images_per_s"] > 0 and 0 < summary["time_to_first_step_s"] < summary["wall_time_s"]
    assert len(summary["peak_memory_mb"]) == world_size and all(m > 0 for m in summary["peak_memory_mb"])


def assert_half_the_state_per_rank(summary: dict):
    """A sharded run on 2 ranks (FSDP1, FSDP2): each rank's parameters, gradients and AdamW state (2 tensors per
    parameter) add up to the whole model's, and no rank holds much more than half."""
    full_mb = summary["params"] * 4 / 2**20
    memory = summary["memory_per_rank"]
    for kind, factor in (("params_mb", 1), ("grads_mb", 1), ("optimizer_mb", 2)):
        assert sum(m[kind] for m in memory) == pytest.approx(factor * full_mb, rel=1e-3), kind
        assert max(m[kind] for m in memory) < 0.52 * factor * full_mb, kind
