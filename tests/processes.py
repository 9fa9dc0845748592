"""The one way the tests start processes: from the repository root, unbuffered, one OpenMP thread each (as the
suite's shared runs compare numbers made that way), with a deadline on every wait, and killed with everything they
started (kill_tree) when a test or a run is done with them."""
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINING_STEPS = ("train_single_machine.py", "train_ddp.py", "train_ray_ddp.py", "train_ray_ddp_with_ray_data.py",
                  "train_ray_fsdp.py", "train_ray_fsdp2.py", "tune_ray_ddp.py")


def run(cmd, timeout=180, env=None, **kwargs) -> subprocess.CompletedProcess:
    """Run a command from the repository root, with these variables added; return the CompletedProcess (text). A
    training step must name its --model: no test depends on the default preset, which is chosen for 10-epoch runs,
    not for tests."""
    return subprocess.run(cmd, **command_options(cmd, env), capture_output=True, text=True, timeout=timeout, **kwargs)


def start(cmd, stdout=None, stderr=None, env=None, **options) -> subprocess.Popen:
    """run(), in the background: the started process, writing to these files (a pipe that nobody reads until the
    run ends would stop it once full), with these variables added."""
    return subprocess.Popen(cmd, **command_options(cmd, env), stdout=stdout, stderr=stderr, text=True, **options)


def command_options(cmd, env=None) -> dict:
    if any(str(part).endswith(TRAINING_STEPS) for part in cmd):
        assert "--model" in cmd, f"name the preset this test trains: {cmd}"
    return dict(cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})})


def python(script, *args, **kwargs) -> subprocess.CompletedProcess:
    return run([sys.executable, str(ROOT / script), *args], **kwargs)


def torchrun(script, nproc, *args, **kwargs) -> subprocess.CompletedProcess:
    from labs.harness import free_port  # the rendezvous port, as the labs' checks pick it
    return run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                "--master-port", str(free_port()), str(ROOT / script), *args], **kwargs)


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


def kill_tree(pid: int) -> None:
    """SIGKILL to a process, to its process group, and to every process it started that is still its descendant (a
    daemon that left the group, as Ray's may): nothing of it is left to use the cores or hold a port."""
    tree = descendants(pid)
    for target in (pid, *tree):
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # no group of its own, or already gone
        pass
