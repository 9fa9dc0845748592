"""The suite's shared settings, runs and checks. Its three plugins: suite_rules.py (every fixture's time limit, CI's
no-skip rule), early.py (the runs that start with the session) and tiers.py (which tier a test is in); processes starts
every process."""
import argparse
import builtins
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.register_assert_rewrite("early", "suite_rules", "tiers")  # plugins (pytest_plugins, below) this file imports
from early import takes  # noqa: E402
from checks import final_json, load_script  # noqa: E402
from processes import ROOT, python, torchrun  # noqa: E402
from suite_rules import time_limit  # noqa: E402

from benchmarks.steps import step  # noqa: E402
from common.meter import summary_of  # noqa: E402

pytest_plugins = ["suite_rules", "early", "tiers"]
SINGLE, DDP, RAY_DDP, RAY_FSDP2, TUNE = (step(name).script for name in (  # the registry's: benchmarks/steps.py
    "single_machine", "ddp", "ray_ddp", "ray_fsdp2", "ray_tune"))
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
# worker then 2) end equal up to float rounding; runs on 2 ranks each (torchrun DDP, Ray DDP, FSDP1) end equal bit
# for bit. The bound is a tenth of one step at lr 1e-3: Adam moves a weight by about lr a step whatever its
# gradient's scale, so a wrong gradient (another batch, a rank's share lost) moves it by steps of that order, while
# rounding moves it only where Adam normalises a gradient within rounding of zero. Measured, SMOKE's 12 steps (2 ranks
# x 2 micro-batches of 8 vs 1 x 32): 4.3e-7 with this Intel Xeon's own kernels (AVX-512), 3.5e-7 and 1.3e-6 with
# them held to DEFAULT and AVX2 (test_step01 runs the pair so); the widest rounding one machine shows, one process's
# run on two kernel sets, 2.9e-5 (2026-12-03; 2.8e-5 on an AMD EPYC Zen 5, 12 steps at lr 2e-3).
ROUNDING = 1e-4
# No usage report from the tests' Ray (this machine may be offline), and no actor started in every Ray Data run to
# collect one: a process fewer for the 2 cores.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Nor a preemption watcher per worker group (an actor that waits for a cloud node's notice of preemption): none comes
# here, and each cost 1.3 core-seconds. The scripts turn it off themselves on a Ray they start (--address local).
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
# Every process the suite starts runs startup/sitecustomize.py first (fewer garbage collections while it imports).
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "startup"),
                                            *filter(None, [os.environ.get("PYTHONPATH")])])


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


@pytest.fixture
def gloo_group_of_one():
    """A one-process gloo group (its store in memory: no port), in which DDP and fully_shard run as on many; yields
    its 1-D device mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def two_node_cluster():
    """A Ray cluster on this machine, two nodes of one CPU each, so that every 2-worker run really spans two nodes:
    ray.cluster_utils.Cluster, started in this process (Cluster.add_node works in a main thread only)."""
    from ray.cluster_utils import Cluster

    # Ray starts its workers at nice 15; at 0 they come before the smoke tier's background runs (nice 19), whose
    # time the cluster's runs, one after another, would otherwise share.
    os.environ["RAY_worker_niceness"] = "0"
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, include_dashboard=False))
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    return cluster


@pytest.fixture(scope="session")
def ray_cluster():
    """One Ray cluster for every Ray test of this process (starting Ray costs tens of seconds on 2 cores): two
    nodes (two_node_cluster). Yields the address scripts attach to."""
    cluster = two_node_cluster()
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
    result = torchrun(DDP, 2, *SMOKE, *ACCUMULATE, *PROFILE, "--checkpoint-dir",
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


@takes(210)  # the full suite: 90 to 142 s (AMD EPYC Zen 5, 2026-11-28); 209 and 178 s (AMD EPYC Zen 4, 2026-12-04)
def finished_sweep(folder: Path, lane) -> tuple[dict, Path, subprocess.CompletedProcess]:
    """Step 05's sweep that test_step05 checks, and in the full suite the smoke tier's sweep too (test_smoke): 3
    trials of 2 workers, one at a time, 3 tiny epochs each, on a cluster of its own (two_node_cluster, in the run's
    process): each trial's workers span both nodes. A worker of every trial crashes after epoch 1, and Ray Train
    restarts the trial's group from that checkpoint (--max-failures 1). ASHA compares trials at epoch 2 and stops
    trial 1, behind trial 0 then: trial 2 can start only once the stopped trial's workers have given their CPUs back
    (FreeStoppedTrialsWorkers), else the sweep waits for them forever (and is killed at its deadline). Its report,
    its folder and the run."""
    cluster = two_node_cluster()
    try:
        result = lane.run([sys.executable, str(ROOT / TUNE), *SMOKE, "--num-workers", "2", "--epochs", "3",
                           "--num-samples", "3", "--grace-period", "2", "--seed", SWEEP_SEED, "--profile-steps", "1",
                           "--fail-at-epoch", "1", "--max-failures", "1", "--address", cluster.address,
                           "--checkpoint-dir", str(folder / "runs"), "--out", str(folder / "out")], timeout=900)
    finally:
        cluster.shutdown()
    return final_json(result), folder, result


def ray_script(script, address, storage, *args, **kwargs):
    """A Ray step on the shared test cluster, 2 workers, smoke settings."""
    return python(script, *SMOKE, "--num-workers", "2", "--address", address, "--checkpoint-dir", str(storage),
                  *args, **kwargs)


