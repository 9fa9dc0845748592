"""What every lab's check shares: the lab's settings, loading the attendee's file, starting ranks as torchrun
would, and the outcome of one check. Each check module (labs/checks/) holds only what its lab checks."""
import importlib.util
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from common import make_parser

ROOT = Path(__file__).resolve().parents[1]
# The smoke tests' settings, shorter: the tiny preset learns the synthetic images within a few steps.
LAB_FLAGS = ["--data", "synthetic", "--model", "tiny", "--epochs", "2", "--steps-per-epoch", "4",
             "--batch-size", "32", "--lr", "1e-3", "--eval-images", "256"]
RENDEZVOUS_PORTS = range(20000, 32768)
RANK_TIMEOUT_S = 150  # a hang's limit, far above a run's time (about 10 s) on a busy 2-core machine


@dataclass
class Outcome:
    check: str
    failure: str | None  # what the run showed; None when the check passed
    hint: str  # the concept to look at, shown with a failure

    @property
    def passed(self) -> bool:
        return self.failure is None


def crashed(checks: list[str], error: str) -> list[Outcome]:
    """Every check failed, because the lab's run did not get to the end."""
    return [Outcome(check, f"the run did not finish: {error}", "fix the error shown above first")
            for check in checks]


class RunFailed(Exception):
    """A rank raised or hung; the message is its last line, the traceback was printed."""


def lab_args(*flags: str):
    """The step scripts' flags and defaults, at the lab's sizes."""
    return make_parser("lab", "lab").parse_args([*LAB_FLAGS, *flags])


def load_lab(path):
    """The attendee's file as a module; its main() does not run."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def start_ranks(entry: str, lab_file, world_size: int, folder: Path) -> list[subprocess.Popen]:
    """world_size processes of `python -m labs.rank`, each calling entry (module:function) on the lab file, with
    the environment torchrun gives its processes, one thread each."""
    port = free_port()
    processes = []
    for rank in range(world_size):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                   LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
                   CUDA_VISIBLE_DEVICES="", KINETO_LOG_LEVEL="6")  # the labs run on CPUs; a quiet profiler
        processes.append(subprocess.Popen([sys.executable, "-m", "labs.rank", entry, str(lab_file), str(folder)],
                                          cwd=ROOT, env=env))
    return processes


def results(processes: list[subprocess.Popen], folder: Path, timeout: float = RANK_TIMEOUT_S) -> list:
    """Each rank's return value, in rank order; RunFailed if one raised or they did not end in time. A rank that
    failed ends the others: they would wait for it in their next collective."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in processes):
        if any(p.poll() for p in processes) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for process in processes:
        process.kill()
        process.wait()
    errors = sorted(folder.glob("rank*.error"))
    if errors:
        raise RunFailed(errors[0].read_text().strip().splitlines()[-1])
    if any(p.returncode for p in processes):
        raise RunFailed(f"the ranks did not end within {timeout:.0f} s: one waits for something another rank "
                        "never does")
    return [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in range(len(processes))]


def run_ranks(entry: str, lab_file, world_size: int, timeout: float = RANK_TIMEOUT_S) -> list:
    return run_groups(lab_file, [(entry, world_size)], timeout)[0]


def run_groups(lab_file, groups: list[tuple[str, int]], timeout: float = RANK_TIMEOUT_S) -> list[list]:
    """Process groups, each of (entry, world size), started at once (their start-up overlaps), each rank calling
    entry on the lab file: every group's ranks' return values."""
    with tempfile.TemporaryDirectory() as folder:
        folders = [Path(folder, str(i)) for i in range(len(groups))]
        started = []
        for (entry, size), group_folder in zip(groups, folders, strict=True):
            group_folder.mkdir()
            started.append(start_ranks(entry, lab_file, size, group_folder))
        return [results(processes, group_folder, timeout)
                for processes, group_folder in zip(started, folders, strict=True)]


def free_port() -> int:
    """A port for a rendezvous (MASTER_PORT), free now, below the range from which Linux (32768-60999) and macOS
    (49152-65535) give connections their own port: one from that range is free now but not reserved, and until rank
    0 listens on it any connection on the machine (another group's gloo pairs, Ray's workers) may be given it
    (EADDRINUSE). torchrun's default, 29500, is below it too."""
    for port in random.sample(RENDEZVOUS_PORTS, 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {RENDEZVOUS_PORTS}: free one, or wait for the runs that hold them")


def start_ray(address: str, **environment: str) -> None:
    """Ray for a lab's check: started on this machine with 2 CPUs (2 workers), or the cluster at address. Its
    controller polls the workers every 0.2 s (each report waits for a poll), and its workers import labs/ from
    this repository. The environment is set first: Ray hands it on to the controller and the workers."""
    import ray

    from common.ray_setup import WORKER_SETUP, init_options

    os.environ.update(RAY_USAGE_STATS_ENABLED="0", **environment)
    cpus = dict(num_cpus=2, include_dashboard=False) if address == "local" else {}
    ray.init(address=address, **cpus, **init_options(address),
             runtime_env={**WORKER_SETUP, "env_vars": {**WORKER_SETUP["env_vars"], "PYTHONPATH": str(ROOT)}})
