"""What every lab's check shares: the lab's settings, loading the attendee's file, starting ranks with the
environment torchrun gives its processes, and the outcome of one check. Each check module (labs/checks/) holds
only what its lab checks."""
import hashlib
import importlib
import importlib.util
import multiprocessing
import os
import platform
import re
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed.distributed_c10d as c10d

from common.flags import make_parser
from common.rendezvous import free_port

ROOT = Path(__file__).resolve().parents[1]
COMMON_MODULES = ("common.data", "common.flags", "common.model", "common.training")  # replace_in_common
# The smoke tests' settings, shorter: the tiny preset learns the synthetic images within a few steps. A seed other
# than 0, DistributedSampler's default, and a test set that 2 ranks split unevenly (128 and 127 images): neither
# then hides a sampler that ignores --seed, or accuracies averaged over the ranks instead of counted.
LAB_FLAGS = ["--data", "synthetic", "--model", "tiny", "--epochs", "2", "--steps-per-epoch", "4",
             "--batch-size", "32", "--lr", "1e-3", "--eval-images", "255", "--seed", "1"]
# Where the reference runs are kept, once per machine for the code as it is: the checks compare every try of a lab
# with the same runs, which depend on this repository's code alone, never on the attendee's file.
CACHE = Path(os.environ.get("LABS_CACHE", Path.home() / ".cache" / "ray-train-workshop" / "labs"))
REFERENCE_CODE = ("common/*.py", "labs/checkpoints.py", "labs/harness.py", "labs/reference.py", "labs/watch.py",
                  "labs/checks/*.py", "labs/solutions/*.py")
# What holds torch's, MKL's and oneDNN's kernels below what the processor offers: a reference run rounds with them.
KERNEL_SETTINGS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
                   "OPENBLAS_CORETYPE")
# A rank is forked from the check where fork is safe with torch imported (Linux); Python's own default elsewhere
# (macOS: spawn, a new interpreter).
START_RANK = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
RANK_TIMEOUT_S = 150  # a run's limit, far above its time (about 10 s) on a busy 2-core machine
# How long a rank waits in a collective that another rank never joins before it fails (gloo's default: 30 min). A
# lab's run takes a few seconds between two collectives even on a busy machine (its ranks start together); every
# check of a run that hangs waits this long, which the suite pays once per wrong answer that hangs.
COLLECTIVE_TIMEOUT_S = 15
# What a rank that waited for a collective in vain says: gloo's timed out, or the other rank left first; Ray Train
# names the ranks that never joined a report.
HANG_SIGNS = ("timed out", "closed by peer", "reset by peer", "have not joined")
HANG_HINT = ("a rank waits in a collective (an all-reduce, DDP's or FSDP's in backward, a barrier, ray.train.report) "
             "until every rank of the group calls it: every rank must call the same collectives, in the same order, "
             "as often (TROUBLESHOOTING.md: the run hangs at a report or a collective)")


@dataclass
class Outcome:
    check: str
    failure: str | None  # what the run showed; None when the check passed
    hint: str  # the concept to look at, shown with a failure

    @property
    def passed(self) -> bool:
        return self.failure is None


def crashed(checks: list[str], error: str) -> list[Outcome]:
    """Every check failed, because the lab's run did not get to the end (said once, with a hang's hint if a rank
    waited in a collective in vain)."""
    error = re.sub(r"\[\S+\.(cc|cpp):\d+\] ", "", error).split(" This is typically")[0]  # gloo's source line
    hung = any(sign in error.lower() for sign in HANG_SIGNS)
    failure = f"the run hung: {error}" if hung else f"the run did not finish: {error}"
    return [Outcome(checks[0], failure, HANG_HINT if hung else "fix the error shown above first"),
            *(Outcome(check, "the run did not finish (above)", "") for check in checks[1:])]


class RunFailed(Exception):
    """A rank raised or hung; the message is its last line (a real error's before a hang's), the traceback was
    printed."""


def lab_args(*flags: str):
    """The step scripts' flags and defaults, at the lab's sizes."""
    return make_parser("lab", "lab").parse_args([*LAB_FLAGS, *flags])


def replace_in_common(**functions) -> None:
    """Replaces functions of common/ in the modules that define them, so that a lab's file gets the replacement
    however it imports them (`from common.training import evaluate as ev`, `import common.training`)."""
    for name, function in functions.items():
        module = next(m for m in map(importlib.import_module, COMMON_MODULES) if hasattr(m, name))
        setattr(module, name, function)


def watch_training(float64: bool = False, **functions) -> dict:
    """Replaces build_model and make_optimizer in common/ (and any other of its functions given) so that the lab's
    run records its models, its optimizers and, at every optimizer step, each parameter's gradient: this rank's
    shard of a sharded one (a DTensor's local part, its name in "sharded"). With float64, every model is built in
    double precision (in_float64)."""
    from common.model import build_model
    from common.training import make_optimizer
    from torch.distributed.tensor import DTensor

    watched = dict(models=[], optimizers=[], gradients=[], sharded=set())

    def record_gradients(*_):
        gradients = {}
        for name, p in watched["models"][-1].named_parameters():
            if isinstance(p.grad, DTensor):
                watched["sharded"].add(name)
            if p.grad is not None:
                gradients[name] = (p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
        watched["gradients"].append(gradients)

    def watched_build_model(*args, **kwargs):
        model = build_model(*args, **kwargs)
        watched["models"].append(in_float64(model) if float64 else model)
        return watched["models"][-1]

    def watched_make_optimizer(*args, **kwargs):
        watched["optimizers"].append(make_optimizer(*args, **kwargs))
        watched["optimizers"][-1].register_step_pre_hook(record_gradients)
        return watched["optimizers"][-1]

    replace_in_common(build_model=watched_build_model, make_optimizer=watched_make_optimizer, **functions)
    return watched


def in_float64(model: torch.nn.Module) -> torch.nn.Module:
    """The model in double precision, casting its floating-point inputs (common.data's images are float32) to it."""
    model.double()
    model.register_forward_pre_hook(lambda _, inputs: tuple(x.double() if x.is_floating_point() else x
                                                             for x in inputs))
    return model


def load_lab(path):
    """The attendee's file as a module; its main() does not run."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def start_ranks(entry: str, lab_file, world_size: int, folder: Path) -> list[multiprocessing.Process]:
    """world_size ranks, each calling entry (module:function) on the lab file (run_rank), with the environment
    torchrun gives its processes, one thread each. Forked from this process (START_RANK), where torch and common are
    imported: a rank starts at once, where a new interpreter would import them again (3 s of CPU each)."""
    port = free_port()
    sys.stdout.flush()  # or a forked rank would print this process's buffered lines again
    sys.stderr.flush()
    processes = []
    for rank in range(world_size):
        env = dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                   LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   CUDA_VISIBLE_DEVICES="", KINETO_LOG_LEVEL="6")  # the labs run on CPUs; a quiet profiler
        processes.append(START_RANK.Process(target=run_rank, args=(entry, lab_file, folder, env)))
        processes[-1].start()
    return processes


def run_rank(entry: str, lab_file, folder: Path, env: dict) -> None:
    """One rank, in a process of its own: saves what entry(lab_file) returns to folder/rank<r>.pt, or its traceback
    to folder/rank<r>.error (also printed). Its process group's collectives time out after COLLECTIVE_TIMEOUT_S."""
    os.environ.update(env)
    torch.set_num_threads(1)
    # A process group's default timeout, which a rank waiting in a collective that another never joins hits.
    c10d.default_pg_timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    module, function = entry.split(":")
    try:
        result = getattr(importlib.import_module(module), function)(lab_file)
    except BaseException:
        error = traceback.format_exc()
        print(error, file=sys.stderr)
        (folder / f"rank{env['RANK']}.error").write_text(error)
        sys.exit(1)
    torch.save(result, folder / f"rank{env['RANK']}.pt")


def results(processes: list[multiprocessing.Process], folder: Path, timeout: float = RANK_TIMEOUT_S) -> list:
    """Each rank's return value, in rank order; RunFailed if one raised or they did not end in time. A rank that
    raised ends the others at once. One that died without a Python error (gloo aborts a process on a size mismatch)
    leaves them COLLECTIVE_TIMEOUT_S to fail by themselves: a rank whose peer died says so in its next collective."""
    end = time.monotonic() + timeout
    while any(p.exitcode is None for p in processes) and time.monotonic() < end:
        if failed := [rank for rank, p in enumerate(processes) if p.exitcode]:
            if any((folder / f"rank{rank}.error").exists() for rank in failed):  # written whole before it exited
                break
            end = min(end, time.monotonic() + COLLECTIVE_TIMEOUT_S)
        time.sleep(0.1)
    ended = [p.exitcode for p in processes]
    for process in processes:
        process.kill()
        process.join()
    # A rank killed while it wrote its error leaves the file empty or cut short: its last line, if any.
    written = [path.read_text().strip() for path in sorted(folder.glob("rank*.error"))]
    errors = [text.splitlines()[-1] for text in written if text]
    if errors:
        raise RunFailed(min(errors, key=lambda error: any(sign in error.lower() for sign in HANG_SIGNS)))
    if failed := [(rank, code) for rank, code in enumerate(ended) if code]:
        rank, code = failed[0]
        how = signal.Signals(-code).name if code < 0 else f"exit code {code}"
        raise RunFailed(f"rank {rank} ended with {how} and no Python error (its own message is above)")
    if None in ended:
        raise RunFailed(f"the ranks timed out: they did not end within {timeout:.0f} s")
    return [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in range(len(processes))]


def run_ranks(entry: str, lab_file, world_size: int, meanwhile=lambda: None) -> tuple:
    """world_size ranks calling entry on the lab file, and meanwhile() in this process while they run (a reference
    run): what meanwhile returned, and each rank's return value."""
    with tempfile.TemporaryDirectory() as folder:
        processes = start_ranks(entry, lab_file, world_size, Path(folder))
        try:
            alongside = meanwhile()
        except BaseException:
            for process in processes:
                process.kill()
            raise
        return alongside, results(processes, Path(folder))


def cached(name: str) -> Path:
    """The file that keeps the reference run `name`: its name holds a digest of everything the run depends on (the
    code in REFERENCE_CODE, the lab's flags, torch's version, the kernels it ran), so a change to any of them makes a
    new run."""
    digest = hashlib.sha256(f"{name} {LAB_FLAGS} {torch.__version__} {kernels()}".encode())
    for path in sorted(path for pattern in REFERENCE_CODE for path in ROOT.glob(pattern)):
        digest.update(path.read_bytes())
    return CACHE / f"{name}-{digest.hexdigest()[:16]}.pt"


def kernels() -> str:
    """What chooses the kernels a run rounds with: the processor, the instruction sets torch uses on it, and the
    settings that hold them lower (KERNEL_SETTINGS)."""
    settings = {key: os.environ[key] for key in KERNEL_SETTINGS if key in os.environ}
    return f"{processor()} {torch.backends.cpu.get_cpu_capability()} {settings}"


def processor() -> str:
    """The processor's make, model and instruction sets: Linux's /proc/cpuinfo, elsewhere what platform says."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    fields = ("vendor_id", "cpu family", "model", "model name", "flags")
    return " ".join(line for line in first.splitlines() if line.split(":")[0].strip() in fields)


def load_reference(name: str):
    """The reference run `name` as kept by save_reference, or None if the code as it is never ran it here."""
    path = cached(name)
    return torch.load(path, weights_only=False) if path.exists() else None


def save_reference(name: str, result):
    """Keeps a reference run's result (written whole or not at all: checks may run side by side); returns it."""
    path = cached(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    torch.save(result, partial)
    os.replace(partial, path)
    return result


def start_ray(address: str, watched: dict | None = None, cpus: int = 2, **environment: str) -> None:
    """Ray for a lab's check: started on this machine with these CPUs (2: 2 workers), or the cluster at address. Its
    controller polls the workers every 0.2 s (each report waits for a poll), a report that a rank never joins fails
    after COLLECTIVE_TIMEOUT_S, and every process of the job imports labs/ from this repository (then what this
    process's PYTHONPATH holds) and runs labs.watch.setup_worker first (watched: labs.watch.environment's
    variables). The environment is set first: Ray Train hands it on to its controller and workers."""
    import ray

    from common.ray_setup import init_options, worker_setup

    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_TRAIN_COLLECTIVE_TIMEOUT_S=str(COLLECTIVE_TIMEOUT_S),
                      **environment)
    started_here = dict(num_cpus=cpus, include_dashboard=False) if address == "local" else {}
    python_path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    job = worker_setup()
    env_vars = {**job["env_vars"], "PYTHONPATH": python_path, **(watched or {})}
    ray.init(address=address, **started_here, **init_options(address),
             runtime_env={**job, "env_vars": env_vars, "worker_process_setup_hook": "labs.watch.setup_worker"})


def ray_error(error: Exception) -> str:
    """The line of a failed Ray run that says why: the ranks that never joined a report; else the lowest rank's own
    exception, its first line (Ray keeps each worker's, WorkerGroupError.worker_failures: its message shortens their
    tracebacks, some to before their exception's line); else the message's last line."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    hung = next((line for line in lines if "have not joined" in line), None)
    failures = getattr(error, "worker_failures", None)
    if hung or not failures:
        return hung or lines[-1]
    failure = failures[min(failures)]
    return f"{type(failure).__name__}: {(str(failure).strip().splitlines() or [''])[0]}"
