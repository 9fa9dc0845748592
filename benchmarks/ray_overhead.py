"""What Ray costs beside the training, three ways; each writes results.json to --out, and results.md from it.

    python benchmarks/ray_overhead.py cpu-share --out DIR -- COMMAND...  # where the CPU goes while a step trains
    python benchmarks/ray_overhead.py fit-processes --out DIR            # the smallest Ray Train run, by process
    python benchmarks/ray_overhead.py report-latency --out DIR           # what a ray.train.report costs

cpu-share starts COMMAND, waits --after seconds (past start-up, into the first epoch's training loop), reads the CPU
time and context switches of every process and thread on the machine from /proc and the steps on rank 0's progress
bar, again --seconds later, then stops the command. A process that used more than half a core in that window counts
as a training process; its threads are listed by name (the main thread apart), so a rank's own training thread is
told apart from the threads its launcher (Ray's core worker) runs beside it. Its busiest thread is its training
thread: how often the kernel took the CPU from it (involuntary switches: another thread was given the core) and how
often it gave the CPU up itself (voluntary: it waited, for a peer's gradients for instance).

fit-processes is the test suite's setting: a two-node Ray cluster on this machine (one CPU per node), started once,
and a driver already connected to it, so no Ray start and no import is counted. Each fit is a TorchTrainer with 2 CPU
workers whose training function makes one metric-only report, at the steps' controller poll (POLL_INTERVAL_S). While
it runs, /proc is read every 0.1 s: every other process's CPU time over the fit (Ray's own daemons included), whether
it started during the fit, and its role, from the titles Ray gives its workers (ray::TrainController.__init__,
ray::RayTrainWorker, ...). A worker left idle by the previous fit may be reused: not started, but counted.

report-latency: Ray Train V2's controller polls its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s by default)
and a worker's report waits for that poll, so a report costs up to one interval however little it carries. Each
interval is measured in a fresh process (a fresh local Ray): 2 CPU workers make --reports metric-only reports, rank 0
times them, and the last report carries a checkpoint so that its metrics reach the Result.

Linux only (/proc). The tables are tables.py's.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # common/ and benchmarks/, also without `pip install -e .`
from benchmarks.compare_steps import describe_machine, last_line_printed, this_command  # noqa: E402
from benchmarks.tables import cpu_share_markdown, fit_processes_markdown, report_latency_markdown  # noqa: E402
from common.ray_setup import POLL_INTERVAL_S  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
RAY_DEFAULT_INTERVAL_S = 2.0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    tools = parser.add_subparsers(dest="tool", required=True)
    share = tools.add_parser("cpu-share", help="where the CPU goes while COMMAND trains")
    share.add_argument("--after", type=float, default=45.0, help="seconds after launch when the window opens")
    share.add_argument("--seconds", type=float, default=60.0, help="length of the measured window")
    share.add_argument("--out", type=Path, required=True)
    share.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to measure")
    fits = tools.add_parser("fit-processes", help="the smallest Ray Train run on a running cluster")
    fits.add_argument("--fits", type=int, default=3)
    fits.add_argument("--out", type=Path, default=Path("results/ray-fit-processes"))
    latency = tools.add_parser("report-latency", help="ray.train.report at Ray's default poll and the steps'")
    latency.add_argument("--reports", type=int, default=10)
    latency.add_argument("--out", type=Path, default=Path("results/report-latency"))
    latency.add_argument("--interval", type=float, help=argparse.SUPPRESS)  # one measurement, in this process
    args = parser.parse_args()
    if args.tool == "cpu-share":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            share.error("no command to measure: put it after --")
        args.out.mkdir(parents=True, exist_ok=True)
        write(cpu_share(command, args), args.out, cpu_share_markdown)
    elif args.tool == "fit-processes":
        write(fit_processes(args), args.out, fit_processes_markdown)
    elif args.interval is not None:
        print(json.dumps(report_latency(args.interval, args.reports)))
    else:
        write(report_latencies(args), args.out, report_latency_markdown)


def write(report: dict, out: Path, markdown) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1))
    table = markdown(report)
    (out / "results.md").write_text(table)
    print(table)


# --- /proc ------------------------------------------------------------------------------------------------------


def argv_of(pid: str) -> list:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")


def read_stat(path: str) -> tuple:
    """A /proc stat file's name (between its parentheses, which the name may contain) and its user + system ticks."""
    stat = Path(path).read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return stat[stat.index("(") + 1:stat.rindex(")")], int(fields[11]) + int(fields[12])


# --- cpu-share ----------------------------------------------------------------------------------------------------


def cpu_share(command: list, args) -> dict:
    with open(args.out / "run.log", "w") as log:
        run = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               preexec_fn=let_ctrl_c_interrupt)
        try:
            time.sleep(args.after)
            if run.poll() is not None:
                raise SystemExit(f"error: the command ended after {args.after} s, before the window; see {log.name}")
            before, machine_before, steps_before = thread_stats(), machine_ticks(), steps_done(log.name)
            time.sleep(args.seconds)
            after, machine_after, steps_after = thread_stats(), machine_ticks(), steps_done(log.name)
        finally:
            stop(run)  # the window is all we need: the rest of the run would add nothing
    return summarize(before, after, machine_after - machine_before, steps_after - steps_before, args.seconds, command)


def stop(run: subprocess.Popen) -> None:
    """Ctrl-C for the command's whole process group: torchrun passes it to its ranks, and a Ray driver shuts down
    the local Ray it started (checked: no Ray process is left). SIGKILL if that takes over a minute."""
    if run.poll() is not None:
        return  # it already ended
    os.killpg(run.pid, signal.SIGINT)
    try:
        run.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()


def let_ctrl_c_interrupt() -> None:
    """In the command's process, before it starts: Ctrl-C's default action back. A shell starts background jobs
    (`&`, nohup) with SIGINT ignored, which their children inherit; a Python command would then never see the
    KeyboardInterrupt that stop() relies on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def thread_stats() -> dict:
    """{(pid, tid): (process name, thread name, user + system ticks, voluntary and involuntary context switches)}
    for every thread on the machine."""
    stats = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = argv_of(pid)[:3]
            for tid in os.listdir(f"/proc/{pid}/task"):
                thread, ticks = read_stat(f"/proc/{pid}/task/{tid}/stat")
                name = " ".join(argv).replace("\n", " ").strip() or f"[{thread}]"  # [kernel thread]
                status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
                switches = [int(re.search(rf"^{kind}_ctxt_switches:\s+(\d+)", status, re.M)[1])
                            for kind in ("voluntary", "nonvoluntary")]
                stats[pid, tid] = (name, thread, ticks, *switches)
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended while being read
    return stats


def steps_done(log: str) -> int:
    """The optimizer steps rank 0's progress bar shows so far ("epoch 1:  19%|...| 74/390 [...")."""
    counts = re.findall(r"\| (\d+)/\d+ \[", Path(log).read_text(errors="replace"))
    if not counts:
        raise SystemExit(f"error: no progress bar in {log} when the window opened or closed; pass a larger --after")
    return int(counts[-1])


def machine_ticks() -> int:
    """Busy ticks of the whole machine, all cores (user, nice, system, irq, softirq, steal)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # less idle and iowait


def summarize(before: dict, after: dict, machine_busy: int, steps: int, seconds: float, command: list) -> dict:
    def cores(ticks: int) -> float:
        return ticks / TICKS / seconds

    per_process, per_thread = defaultdict(int), defaultdict(lambda: defaultdict(int))
    names, busiest = {}, {}
    for key, (name, thread, ticks, voluntary, involuntary) in after.items():
        start = before.get(key, (None, None, 0, 0, 0))  # a thread born in the window counts from 0
        used = ticks - start[2]
        names[key[0]] = name
        if used > busiest.get(key[0], (0,))[0]:
            busiest[key[0]] = (used, dict(cores=cores(used), voluntary_switches_per_s=(voluntary - start[3]) / seconds,
                                          involuntary_switches_per_s=(involuntary - start[4]) / seconds))
        per_process[key[0]] += used
        per_thread[key[0]]["main thread" if key[0] == key[1] else thread] += used  # OpenMP's threads share its name
    training = [pid for pid, ticks in per_process.items() if cores(ticks) > 0.5]
    return dict(
        command=" ".join(command), machine=describe_machine(), window_s=seconds, cpus=os.cpu_count(),
        machine_busy_cores=cores(machine_busy),
        steps_per_s=steps / seconds,
        training_processes=[dict(pid=int(pid), name=names[pid], cores=cores(per_process[pid]),
                                 threads={t: cores(n) for t, n in sorted(per_thread[pid].items(), key=lambda x: -x[1])
                                          if cores(n) >= 0.001},
                                 training_thread=busiest[pid][1])
                            for pid in sorted(training, key=lambda pid: -per_process[pid])],
        other_processes=[dict(pid=int(pid), name=names[pid], cores=cores(ticks))
                         for pid, ticks in sorted(per_process.items(), key=lambda x: -x[1])
                         if pid not in training and cores(ticks) >= 0.002])


# --- fit-processes ------------------------------------------------------------------------------------------------


def fit_processes(args) -> dict:
    os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = str(POLL_INTERVAL_S)
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, include_dashboard=False))
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        fits = [measure_fit() for _ in range(args.fits)]
    finally:
        ray.shutdown()
        cluster.shutdown()
    return dict(command=this_command(), machine=describe_machine(), poll_interval_s=POLL_INTERVAL_S, fits=fits)


def measure_fit() -> dict:
    import ray.train
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def report_once(config):
        ray.train.report({"loss": 1.0})

    before = processes()
    seen, done = {}, threading.Event()
    watcher = threading.Thread(target=watch, args=(seen, done))
    watcher.start()
    start = time.perf_counter()
    TorchTrainer(report_once, scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(storage_path=tempfile.mkdtemp())).fit()
    wall = time.perf_counter() - start
    done.set()
    watcher.join()
    used = [dict(role=role(p["titles"]), new=pid not in before,
                 cpu_s=round(p["cpu_s"] - before.get(pid, (None, 0.0))[1], 2)) for pid, p in seen.items()]
    used = sorted((p for p in used if p["cpu_s"] >= 0.05 and p["role"] != "this driver"), key=lambda p: -p["cpu_s"])
    return dict(wall_s=round(wall, 1), new_processes=sum(p["new"] for p in used),
                cpu_s=round(sum(p["cpu_s"] for p in used), 1), processes=used)


def watch(seen: dict, done: threading.Event) -> None:
    """Every process's titles while the fit runs (a Ray worker is ray::IDLE, then ray::TrainController.__init__,
    ...) and its CPU time, the last one seen: a process that exits loses its last 0.1 s at most."""
    while not done.wait(0.1):
        for pid, (title, cpu_s) in processes().items():
            entry = seen.setdefault(pid, dict(titles=[], cpu_s=0.0))
            if title not in entry["titles"]:
                entry["titles"].append(title)
            entry["cpu_s"] = cpu_s


def role(titles: list) -> str:
    """A process's role: the actor class or task it ran (its titles name them), else its program or script."""
    named = [t.removeprefix("ray::").split(".")[0] for t in titles if t.startswith("ray::") and t != "ray::IDLE"]
    return named[0] if named else ("idle worker" if "ray::IDLE" in titles else titles[0])


def processes() -> dict:
    """pid: (title, CPU seconds) of every process readable in /proc; the title is a Ray worker's ray::..., else its
    program's name, or the script a Python process runs."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = argv_of(pid)
            name, ticks = read_stat(f"/proc/{pid}/stat")
        except OSError:
            continue
        scripts = [Path(a).name for a in argv[1:3] if a.endswith(".py")]
        title = "this driver" if int(pid) == os.getpid() else (scripts or [Path(argv[0]).name])[0]
        if argv[0].startswith("ray::"):
            title = argv[0].strip()
        elif not argv[0]:  # a kernel thread
            title = name
        found[pid] = (title, ticks / TICKS)
    return found


# --- report-latency -----------------------------------------------------------------------------------------------


def report_latencies(args) -> dict:
    import ray

    rows = [json.loads(last_line_printed([sys.executable, __file__, "report-latency", "--interval", str(interval),
                                          "--reports", str(args.reports)]))  # a fresh process: a fresh local Ray
            for interval in (RAY_DEFAULT_INTERVAL_S, POLL_INTERVAL_S)]
    return dict(command=this_command(), machine=describe_machine(), ray=ray.__version__,
                date=time.strftime("%Y-%m-%d"), reports=args.reports, rows=rows)


def report_latency(interval: float, reports: int) -> dict:
    os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = str(interval)  # before Ray starts: it hands it on
    import ray
    import ray.train
    from ray.train import Checkpoint, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def report_often(config):
        start = time.perf_counter()
        for i in range(config["reports"] - 1):
            ray.train.report({"report": i})
        seconds = time.perf_counter() - start
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = Checkpoint.from_directory(folder) if ray.train.get_context().get_world_rank() == 0 else None
            ray.train.report({"reports_s": seconds}, checkpoint=checkpoint)

    ray.init(logging_level="ERROR", log_to_driver=False)
    with tempfile.TemporaryDirectory() as storage:
        start = time.perf_counter()
        result = TorchTrainer(report_often, train_loop_config={"reports": reports},
                              scaling_config=ScalingConfig(num_workers=2),
                              run_config=RunConfig(storage_path=storage)).fit()
        fit_s = time.perf_counter() - start
    per_report = result.metrics["reports_s"] / (reports - 1)
    return {"interval_s": interval, "reports": reports, "metric_only_reports_s": result.metrics["reports_s"],
            "per_report_s": per_report, "fit_s": fit_s}


if __name__ == "__main__":
    main()
