"""A lab's ranks, started as torchrun starts its processes (the environment it gives them, one thread each), each
calling a function on the attendee's file; their results, or why they failed, within a deadline."""
import importlib
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed.distributed_c10d as c10d

from common.rendezvous import free_port
from labs.outcome import HANG_SIGNS

# A rank is forked from the check where fork is safe with torch imported (Linux); Python's own default elsewhere
# (macOS: spawn, a new interpreter).
START_RANK = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
RANK_TIMEOUT_S = 150  # a run's limit, far above its time (about 10 s) on a busy 2-core machine
# How long a rank waits in a collective that another rank never joins before it fails (gloo's default: 30 min). A
# lab's run takes a few seconds between two collectives even on a busy machine (its ranks start together); every
# check of a run that hangs waits this long, which the suite pays once per wrong answer that hangs.
COLLECTIVE_TIMEOUT_S = 15


class RunFailed(Exception):
    """A rank raised or hung; the message is its last line (a real error's before a hang's), the traceback was
    printed."""


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
        raise RunFailed(min(errors, key=cause_first))
    if failed := [(rank, code) for rank, code in enumerate(ended) if code]:
        rank, code = failed[0]
        how = signal.Signals(-code).name if code < 0 else f"exit code {code}"
        raise RunFailed(f"rank {rank} ended with {how} and no Python error (its own message is above)")
    if None in ended:
        raise RunFailed(f"the ranks timed out: they did not end within {timeout:.0f} s")
    return [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in range(len(processes))]


def cause_first(error: str) -> int:
    """A rank's own error, then a collective's timeout, then a peer that left (HANG_SIGNS' order): what ended a run
    before what it caused. A rank that timed out exits, and the peer it left says "closed by peer" if it writes
    before it is killed."""
    return next((order for order, sign in enumerate(HANG_SIGNS, 1) if sign in error.lower()), 0)


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
