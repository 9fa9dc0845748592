"""Where a Ray run's start goes, process by process, next to torchrun's: from the command to the first optimizer step.

    python benchmarks/ray_start.py --out benchmarks/published/ray-start    # with nothing else running

The smallest run (`--model tiny --data synthetic`, 2 processes, 2 steps): what is left is the start. Four runs, one
after the other: step 01 under torchrun; step 02 starting its own Ray (as in the room); step 02 twice on a Ray started
before it (`ray start --head`, token on, as README's cluster path; then `--address`). Each run's launch to
first step is the step's own summary.json (its time to first step) plus its imports, as compare_steps.py reads it,
with the step's phases (its imports done, train() started, data and model ready).
While it runs, every process on the machine is read from /proc every 0.1 s: when it appeared, each title it took
(a Ray worker is ray::IDLE until it is given an actor), and its CPU seconds up to the first step. A second pass of
the fresh run with PYTHONPROFILEIMPORTTIME=1 (Ray hands the environment on to every process it starts) reads what each
process imported and how long that took; it is not timed. The machine is 2 cores: a process's CPU seconds are the
time it took from the others. Writes results.json; tables.py renders it.

    python benchmarks/ray_start.py --levers 5 --out benchmarks/published/ray-start-levers    # 18 min (2-core Zen 4)

Each lever that the account points at, one at a time, in alternated rounds (the same order each round, the running
cluster up throughout so that every run shares its idle load): torchrun; step 02 starting its own Ray; the same
with one lever changed; step 02 on the running cluster. Each run's launch to first step and its first step to the
end of the process; the medians are what the documents quote. One run each is too noisy on 2 cores: a variant
beats another only where their ranges part.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.ray_overhead import TICKS, machine_ticks
from benchmarks.record import ROOT, describe_commit, describe_machine, made_by, wait_until_quiet
from common.meter import summary_of

CUT = ["--model", "tiny", "--data", "synthetic", "--epochs", "1", "--steps-per-epoch", "2", "--eval-images", "64"]
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "01-vanilla-pytorch-ddp/train_ddp.py", *CUT]
RAY = ["02-ray-train-ddp/train_ray_ddp.py", *CUT, "--num-workers", "2"]
SAMPLE_S = 0.1  # /proc read in Python: about a tenth of a core at this rate (its own row)
CODE = ("common", "benchmarks/ray_start.py", "01-vanilla-pytorch-ddp/train_ddp.py", "02-ray-train-ddp/train_ray_ddp.py")
DEADLINE_S = 300  # a run past it is killed, with every process it started, and the benchmark fails


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/ray-start"))
    parser.add_argument("--levers", type=int, metavar="ROUNDS",
                        help="measure each lever in LEVERS instead, in ROUNDS alternated rounds")
    args = parser.parse_args()
    if args.levers:
        return measure_levers(args.levers, args.out)
    made = made_by(describe_commit(CODE, "the code it runs"))
    work = Path(tempfile.mkdtemp(prefix="rs-"))  # short: Ray's socket paths live under it
    runs = [measure("torchrun", TORCHRUN, work)]
    runs.append(measure("Ray, fresh", RAY, work, imports=True))
    with running_cluster(work) as address:  # its workers are started by its raylet, without the driver's environment
        runs.append(measure("Ray, running cluster (1st run)", [*RAY, "--address", address], work))
        runs.append(measure("Ray, running cluster (2nd run)", [*RAY, "--address", address], work))
    write_results(args.out, work, made, runs=runs)


def write_results(out: Path, work: Path, made: dict, **measured) -> None:
    """OUT/results.json: the machine, the command and commit, the setting, then what was measured; work removed."""
    results = dict(machine=describe_machine(), **made, cores=os.cpu_count(), setting=" ".join(CUT), **measured)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {out / 'results.json'}")


# name: (how it differs from step 02 as the room runs it, its extra environment); the running cluster's is apart
LEVERS = {
    "Ray, fresh": ("none: the step as the room runs it (it starts its own Ray)", {}),
    "Ray, fresh, Ray's 2 s controller poll": (
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=2, Ray's default (the steps set 0.2 s): the controller's poll, which "
        "every report waits for and which notices the run's end", {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "2"}),
    "Ray, fresh, workers preload torch": (
        "RAY_preload_python_modules=torch,torchvision: Ray's module preloading, every worker process imports them "
        "as it starts", {"RAY_preload_python_modules": "torch,torchvision"}),
}
RUNNING = "Ray, running cluster"
TEMPORARY = ("HOME", "RAY_TMPDIR")  # the running cluster's folders, gone with it: not published


def measure_levers(rounds: int, out: Path) -> None:
    """torchrun, LEVERS and the running cluster, in ROUNDS rounds of one run each: launch to first step and first
    step to the end."""
    made = made_by(describe_commit(CODE, "the code it runs"))
    work = Path(tempfile.mkdtemp(prefix="rs-"))
    plain = dict(os.environ)  # the fresh runs' and torchrun's: not the running cluster's drivers' (token, home)
    with running_cluster(work) as address:
        variants = {"torchrun": ("step 01 under torchrun, for scale", TORCHRUN, plain),
                    **{name: (what, RAY, {**plain, **env}) for name, (what, env) in LEVERS.items()},
                    RUNNING: ("--address: a Ray started before (ray start --head, token on), warmed by one run first",
                              [*RAY, "--address", address], dict(os.environ))}
        lever_run(*variants[RUNNING][1:], work)  # its first run starts a helper that the cluster keeps
        runs = {name: [] for name in variants}
        for round_ in range(rounds):
            for name, (_, command, env) in variants.items():
                runs[name].append(lever_run(command, env, work))
                print(f"round {round_ + 1}/{rounds} {name}: {runs[name][-1]}", flush=True)
    write_results(out, work, made, rounds=rounds, levers=[
        dict(name=name, what=what, command=" ".join(["python", *command]),
             env={k: v for k, v in env.items() if plain.get(k) != v and k not in TEMPORARY}, runs=runs[name],
             **medians(runs[name]))
        for name, (what, command, env) in variants.items()])


def lever_run(command: list, env: dict, work: Path) -> dict:
    """One run once the machine is quiet: launch to first step and first step to the process's end, in seconds."""
    load = wait_until_quiet()
    folder = Path(tempfile.mkdtemp(dir=work))
    environment = {"RAY_TMPDIR": str(folder), **env, "PYTHONUNBUFFERED": "1"}
    launched = time.time()
    output = run_to_deadline([sys.executable, *command, "--checkpoint-dir", str(folder / "checkpoints")],
                             environment)
    ended = time.time()
    started, summary = script_start(output)
    first_step = started + summary["time_to_first_step_s"]
    return dict(load_average_before=load, first_step_s=round(first_step - launched, 1),
                end_s=round(ended - first_step, 1))


def medians(runs: list) -> dict:
    return {f"median_{key}": round(statistics.median(run[key] for run in runs), 1) for key in ("first_step_s", "end_s")}


def measure(name: str, command: list, work: Path, imports: bool = False) -> dict:
    """One run, timed and watched; then, for imports, the same run again with Python's import timing on."""
    print(f"{name}: {' '.join(command)}", flush=True)
    load = wait_until_quiet()
    run = timed_run(command, Path(tempfile.mkdtemp(dir=work)))  # short: Ray's socket paths are at most 107 bytes
    if imports:
        run["imports"] = imports_by_role(command, Path(tempfile.mkdtemp(dir=work)))
    print(f"  launch to first step {run['launch_to_first_step_s']} s", flush=True)
    return dict(name=name, command=" ".join(["python", *command]), load_average_before=load, **run)


def timed_run(command: list, folder: Path) -> dict:
    env = {"RAY_TMPDIR": str(folder), **os.environ, "PYTHONUNBUFFERED": "1"}  # a fresh Ray's session: here
    before = processes()
    busy_at_launch = machine_ticks()
    launched = time.time()
    output, seen = watched_run(command, folder, env)
    started, summary = script_start(output)
    script_started = started - launched  # its imports done: make_parser ran
    first_step = started + summary["time_to_first_step_s"]
    busy = seen.pop("machine")
    phases = dict(imports=script_started, **{phase: script_started + at for phase, at in summary["startup_s"].items()})
    return dict(launch_to_first_step_s=round(first_step - launched, 1),
                phases_s={phase: round(at, 1) for phase, at in phases.items()},
                machine_busy_core_s=round(cpu_at(busy, first_step) - busy_at_launch / TICKS, 1),
                processes=account(seen, before, launched, first_step))


def watched_run(command: list, folder: Path, env: dict) -> tuple:
    """The command's stamped output, and what watch() saw of every process while it ran."""
    seen, done = {}, threading.Event()
    watcher = threading.Thread(target=watch, args=(seen, done), daemon=True)
    watcher.start()
    try:
        output = run_to_deadline([sys.executable, *command, "--checkpoint-dir", str(folder / "checkpoints")], env)
    finally:
        done.set()
        watcher.join()
    return output, seen


def run_to_deadline(words: list, env: dict) -> str:
    """The command's output (stderr in stdout), each line stamped with when it arrived (time.time(), tab, line);
    past DEADLINE_S its process group is killed, Ray's processes with it."""
    process = subprocess.Popen(words, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    killer = threading.Timer(DEADLINE_S, os.killpg, args=(process.pid, signal.SIGKILL))
    killer.start()
    lines = [f"{time.time()}\t{line}" for line in process.stdout]
    killer.cancel()
    if process.wait():
        raise SystemExit(f"error: {' '.join(words)} ended with {process.returncode}:\n{''.join(lines)[-3000:]}")
    return "".join(lines)


def script_start(output: str) -> tuple:
    """When the step's script started timing itself (its imports done: its JSON last line arrived wall_time_s
    later), and the summary that line names."""
    for line in output.splitlines():
        stamp, text = line.split("\t", 1)
        if text.startswith("{"):
            summary = summary_of(json.loads(text))
            return float(stamp) - summary["wall_time_s"], summary
    raise SystemExit(f"error: the run printed no summary line:\n{output[-3000:]}")


def watch(seen: dict, done: threading.Event) -> None:
    """Every process's titles with when each was first seen, and its CPU seconds over time; the machine's busy
    seconds over time under "machine"."""
    while not done.wait(SAMPLE_S):
        now = time.time()
        seen.setdefault("machine", []).append((now, machine_ticks() / TICKS))
        for pid, (title, cpu_s) in processes().items():
            entry = seen.setdefault(pid, dict(titles=[], cpu=[]))
            if title not in [t for t, _ in entry["titles"]]:
                entry["titles"].append((title, now))
            entry["cpu"].append((now, cpu_s))


def cpu_at(samples: list, moment: float) -> float:
    """The CPU seconds of the last sample at or before moment (the first one if none: the process was young)."""
    return max((s for s in samples if s[0] <= moment), default=samples[0])[1]


def account(seen: dict, before: dict, launched: float, first_step: float) -> list:
    """Each process that used CPU before the first step: its role, when it appeared and took its role (seconds from
    launch; None when it ran before the launch), and its CPU seconds until the first step."""
    rows = []
    for pid, entry in seen.items():
        appeared = entry["titles"][0][1] if pid not in before else None
        if appeared is not None and appeared > first_step:
            continue
        start_cpu = before[pid][1] if pid in before else 0.0
        used = cpu_at(entry["cpu"], first_step) - start_cpu
        if used < 0.05:
            continue
        role, took_role = role_of(entry["titles"])
        since_launch = [None if moment is None else round(moment - launched, 1) for moment in (appeared, took_role)]
        rows.append(dict(role=role, pid=int(pid), appeared_s=since_launch[0], role_s=since_launch[1],
                         cpu_s=round(used, 2)))
    return sorted(rows, key=lambda row: -row["cpu_s"])


def role_of(titles: list) -> tuple:
    """A process's role and when it took it: the actor class or task a Ray worker ran (its titles name them; None
    until then), else its program, module or script."""
    named = [(t.removeprefix("ray::").split(".")[0], at) for t, at in titles
             if t.startswith("ray::") and t != "ray::IDLE"]
    if named:
        return named[0]
    return ("idle Ray worker", None) if titles[0][0] == "ray::IDLE" else (titles[0][0], None)


def processes() -> dict:
    """pid: (title, CPU seconds) of every process readable in /proc; the title is a Ray worker's ray::..., else the
    module (-m) or script a Python process runs, else its program's name."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if not argv[0]:
            continue  # a kernel thread
        cpu_s = (int(fields[11]) + int(fields[12])) / TICKS
        found[pid] = ("this benchmark, reading /proc" if int(pid) == os.getpid() else title_of(argv), cpu_s)
    return found


def title_of(argv: list) -> str:
    if argv[0].startswith("ray::"):
        return argv[0].strip()
    if "-m" in argv[1:3]:
        return argv[argv.index("-m") + 1]
    scripts = [Path(a).name for a in argv[1:4] if a.endswith(".py")]
    return (scripts or [Path(argv[0]).name])[0]


def imports_by_role(command: list, folder: Path) -> dict:
    """Role: its imports of PACKAGES (seconds), from a run with PYTHONPROFILEIMPORTTIME=1: the driver's stderr, and
    a Ray worker's log (worker-...-PID.err, its role from the titles /proc showed; one process of each role)."""
    env = {"RAY_TMPDIR": str(folder), **os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPROFILEIMPORTTIME": "1"}
    output, seen = watched_run(command, folder, env)
    texts = {title_of(["python", *command]): output}  # the driver's, under its script's name as /proc shows it
    logs = Path(env["RAY_TMPDIR"]) / "ray" / "session_latest" / "logs"  # a running cluster's, or this run's Ray
    for log in logs.glob("worker-*.err"):
        pid = log.stem.rsplit("-", 1)[1]
        if pid in seen:
            texts[role_of(seen[pid]["titles"])[0]] = log.read_text(errors="replace")
    return {role: import_times(text) for role, text in texts.items()}


IMPORT_LINE = re.compile(r"(?:[\d.]+\t)?import time:\s+\d+ \|\s+(\d+) \| *([\w.]+)$")  # the driver's: stamped
PACKAGES = ("ray", "ray.train", "ray.data", "pyarrow", "pandas", "torch", "torchvision", "common")


def import_times(text: str) -> dict:
    """Seconds each of PACKAGES took to import, itself and what it imported first (Python imports a module once: its
    one line, at whatever depth; the first such line, so that lines of other processes printed after are left)."""
    seconds = {}
    for line in text.splitlines():
        match = IMPORT_LINE.match(line)  # not a worker's line that Ray forwards to the driver, "(pid=...) import..."
        if match and match[2] in PACKAGES:
            seconds.setdefault(match[2], round(int(match[1]) / 1e6, 2))
    return seconds


class running_cluster:
    """`ray start --head` as README's cluster path has it (token authentication on, a token of its own), in a home
    and temporary folder of its own; stopped with everything it started when the with ends."""

    def __init__(self, work: Path):
        self.home, self.tmp = work / "home", work / "cluster"
        self.home.mkdir(parents=True)
        self.tmp.mkdir()

    def __enter__(self) -> str:
        from common.rendezvous import free_port
        port = free_port()
        env = {**os.environ, "HOME": str(self.home), "RAY_AUTH_MODE": "token", "RAY_TMPDIR": str(self.tmp)}
        subprocess.run(["ray", "get-auth-token", "--generate"], env=env, check=True, capture_output=True, timeout=60)
        self.head = subprocess.Popen(["ray", "start", "--head", f"--port={port}", "--block"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.saved = {name: os.environ.get(name) for name in ("HOME", "RAY_AUTH_MODE", "RAY_TMPDIR")}
        os.environ.update(HOME=str(self.home), RAY_AUTH_MODE="token", RAY_TMPDIR=str(self.tmp))  # its drivers' too
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while subprocess.run(["ray", "status", f"--address={address}"], env=env, capture_output=True,
                             timeout=60).returncode:
            if time.monotonic() > deadline or self.head.poll() is not None:
                raise SystemExit(f"error: ray start --head did not answer at {address} within 60 s")
            time.sleep(1)
        return address

    def __exit__(self, *_):
        for name, value in self.saved.items():
            os.environ.pop(name) if value is None else os.environ.update({name: value})
        os.killpg(self.head.pid, signal.SIGTERM)
        try:
            self.head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.head.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
