"""The one way the tests start processes: from the repository root, unbuffered, one OpenMP thread each (as the
suite's shared runs compare numbers made that way), with a deadline on every wait, and killed with everything they
started (kill_tree) when a test or a run is done with them."""
import atexit
import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINING_STEPS = ("train_single_machine.py", "train_ddp.py", "train_ray_ddp.py", "train_ray_ddp_with_ray_data.py",
                  "train_ray_fsdp.py", "train_ray_fsdp2.py", "tune_ray_ddp.py")


# Another processor's kernels, on this one: ATen's dispatch held to a lower instruction set, MKL's code path
# fixed to an older processor's (its conditional numerical reproducibility), oneDNN's capped. torch names each
# capability as get_cpu_capability() reports it.
KERNELS = {"DEFAULT": dict(ATEN_CPU_CAPABILITY="default", MKL_CBWR="COMPATIBLE", ONEDNN_MAX_CPU_ISA="SSE41"),
           "AVX2": dict(ATEN_CPU_CAPABILITY="avx2", MKL_CBWR="AVX2", ONEDNN_MAX_CPU_ISA="AVX2")}
CAPABILITIES = ["DEFAULT", "AVX2", "AVX512"]  # x86's, in order: torch on other processors offers DEFAULT alone


def lower_capabilities() -> list[str]:
    """The capabilities this machine offers below the one torch picks for it: the suite's other runs use that one."""
    import torch
    own = torch.backends.cpu.get_cpu_capability()
    return CAPABILITIES[:CAPABILITIES.index(own)] if own in CAPABILITIES else []


def kernels(capability: str) -> dict:
    """The environment that holds a process to this capability's kernels (KERNELS), once a process started with it
    has reported that capability: a setting torch ignored would leave a test of other kernels testing these."""
    reported = run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                   env=KERNELS[capability])
    assert reported.stdout.strip() == capability, reported.stderr
    return KERNELS[capability]


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
    from common.rendezvous import free_port  # as the labs' checks pick theirs
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


class Preloaded:
    """`python -m MODULE ARGS`, each run forked from a server that has imported these modules: the same run, as its
    own process, without an interpreter's start and those imports (about 2.5 s of CPU for a lab's check, which
    imports torch, torchvision and Ray). What they read from the environment as they are imported is read as the
    server starts: a run in another environment (a fixture set a variable since) gets a new server. Each run's output
    is kept in folder (NN.out, NN.err), if one is given."""

    def __init__(self, module: str, *preload: str, folder: Path | None = None):
        self.module, self.preload, self.folder = module, preload, folder
        self.server, self.env, self.count = None, {}, 0

    def run(self, cmd, timeout: float) -> subprocess.CompletedProcess:
        """run(cmd, timeout) for cmd = [sys.executable, "-m", MODULE, *args]; past the timeout the server is killed
        with the run, and the next run starts another."""
        assert list(cmd[:3]) == [sys.executable, "-m", self.module], cmd
        env = command_options(cmd)["env"]
        if self.server is None or self.server.poll() is not None or without_pytests(env) != self.env:
            self.close()
            self.env = without_pytests(env)
            self.server = start([sys.executable, __file__, self.module, *self.preload], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        self.count += 1
        with tempfile.TemporaryDirectory() as temporary:
            out, err = (Path(self.folder or temporary, f"{self.count:02d}.{stream}") for stream in ("out", "err"))
            out.touch(), err.touch()  # what a run killed before it wrote anything printed
            self.server.stdin.write(json.dumps(dict(args=[str(part) for part in cmd[3:]], env=env,
                                                    out=str(out), err=str(err))) + "\n")
            self.server.stdin.flush()
            if not select.select([self.server.stdout], [], [], timeout)[0]:
                self.close()
                raise subprocess.TimeoutExpired(cmd, timeout, out.read_text(), err.read_text())
            code = self.server.stdout.readline()
            assert code, f"the server of {self.module} ended (its error above)"
            return subprocess.CompletedProcess(cmd, int(code), out.read_text(), err.read_text())

    def close(self) -> None:
        if self.server is not None:
            kill_tree(self.server.pid)
            self.server.wait(timeout=60)


def without_pytests(env: dict) -> dict:
    """The environment but for the variable pytest sets for each test."""
    return {key: value for key, value in env.items() if key != "PYTEST_CURRENT_TEST"}


def serve(module: str, *preload: str) -> None:
    """Preloaded's server: for each request line, a forked child runs the module as __main__; then its exit code."""
    sys.path[0] = str(ROOT)  # as `python -m` has it: the working directory, not tests/
    for name in preload:
        importlib.import_module(name)
    for line in sys.stdin:
        request = json.loads(line)
        child = os.fork()
        if child == 0:
            os._exit(run_forked(module, **request))
        print(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), flush=True)


def run_forked(module: str, args: list[str], env: dict, out: str, err: str) -> int:
    """What `python -m module args` does after its imports, in this environment, with its output in these files."""
    os.environ.clear()
    os.environ.update(env)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else exit.code is not None
        if isinstance(exit.code, str):
            print(exit.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # as the interpreter's exit would: Ray's shutdown, multiprocessing's joins
    sys.stdout.flush()
    sys.stderr.flush()
    return int(code)


if __name__ == "__main__":
    serve(*sys.argv[1:])
