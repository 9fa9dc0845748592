"""What every benchmark records beside its numbers, and how its runs are made: the run record of compare_steps.py,
the machine, the commit and the command that made a result, a quiet machine before each timed run."""
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
STEP_SCRIPTS = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("0[0-9]-*/*.py"))  # what a result ran


@dataclass
class Run:
    name: str
    section: str
    step: str
    workers: int
    flags: list = field(default_factory=list)
    skipped: str | None = None
    status: str = "not run"
    summary: dict | None = None
    env: dict = field(default_factory=dict)
    launch_to_first_step_s: float | None = None
    imports_s: float | None = None
    error: str | None = None
    checkpoint_dir: str | None = None  # kept after the run (another run reads it), else a temporary one
    side_by_side: bool = False  # runs at the same time as the side-by-side runs next to it
    wall_s: float | None = None  # from starting the command to its JSON line: what the person waits
    made_by: dict | None = None  # the command, date and commit that made it (several in an --update's results)


def steady_images_per_s(summary: dict) -> float:
    """Epochs after the first when there are several: the first pays for warm-up (allocations, caches)."""
    later = summary["history"][1:] or summary["history"]
    return sum(h["images_per_s"] for h in later) / len(later)


def evaluation_seconds(run: dict) -> float:
    """A steps run's wall time per epoch outside training, after its first step: evaluation, the checkpoint, the
    report and, once, the exit."""
    s = run["summary"]
    return (run["wall_s"] - run["launch_to_first_step_s"] - sum(h["epoch_time_s"] for h in s["history"])) / s["epochs"]


def describe_machine() -> str:
    """The processor (with its family and model: one name covers several generations), cores, RAM, GPUs, torch."""
    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").exists():
        info = {key.strip(): value.strip() for key, value in (line.split(":", 1) for line in Path(
            "/proc/cpuinfo").read_text().split("\n\n")[0].splitlines() if ":" in line)}
        cpu = f"{info.get('model name', cpu)} (family {info.get('cpu family', '?')} model {info.get('model', '?')})"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return (f"{cpu}, {os.cpu_count()} cores, {ram:.0f} GiB RAM, " + (f"{len(gpus)} x {gpus[0]}" if gpus else "no GPU")
            + f"; torch {torch.__version__}")


def processor_of(machine: str) -> str:
    """describe_machine()'s processor alone: "AMD EPYC (family 26 model 2)"."""
    return re.sub(r", \d+ cores.*", "", machine)


def describe_commit(paths: tuple = ("common", *STEP_SCRIPTS), what: str = "the steps") -> str:
    """The code that runs: the commit, and whether paths (what, for a reader) had changes on top of it."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    changed = git("status", "--porcelain", "--untracked-files=no", "--", *paths)
    return git("rev-parse", "--short", "HEAD") + (f" (with uncommitted changes to {what})" if changed else "")


def made_by(commit: str) -> dict:
    """The command (this benchmark's file name and its arguments), the date and the commit that made a result."""
    return dict(command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), date=time.strftime("%Y-%m-%d"),
                commit=commit)


QUIET_BELOW = 1.0  # the 1-minute load average each run waits for: the cores its own, as in the room


def wait_until_quiet(limit_s: float = 600) -> float:
    """The 1-minute load average once it is below QUIET_BELOW, or as it is after limit_s (then recorded as such)."""
    deadline = time.monotonic() + limit_s
    while os.getloadavg()[0] >= QUIET_BELOW and time.monotonic() < deadline:
        time.sleep(5)
    return round(os.getloadavg()[0], 2)
