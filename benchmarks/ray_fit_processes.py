"""What the smallest Ray Train run costs on a running cluster: wall time, and every process Ray starts for it.

    python benchmarks/ray_fit_processes.py --out benchmarks/published/ray-fit-processes

The test suite's setting: a two-node Ray cluster on this machine (one CPU per node), started once, and a driver
already connected to it, so no Ray start and no import is counted. Each fit is a TorchTrainer with 2 CPU workers
whose training function makes one metric-only report, at the steps' controller poll (POLL_INTERVAL_S). While it
runs, /proc is read every 0.1 s: every other process's CPU time over the fit (Ray's own daemons included), whether
it started during the fit, and its role, from the titles Ray gives its workers (ray::TrainController.__init__,
ray::RayTrainWorker, ...). A worker left idle by the previous fit may be reused: not started, but counted.
Linux only. Writes results.md and results.json to --out.
"""
import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # common/ and benchmarks/, also without `pip install -e .`
from benchmarks.compare_steps import describe_machine  # noqa: E402
from common.ray_setup import POLL_INTERVAL_S  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/ray-fit-processes"))
    args = parser.parse_args()
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
    write(fits, args)


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
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        scripts = [Path(a).name for a in argv[1:3] if a.endswith(".py")]
        title = "this driver" if int(pid) == os.getpid() else (scripts or [Path(argv[0]).name])[0]
        if argv[0].startswith("ray::"):
            title = argv[0].strip()
        elif not argv[0]:  # a kernel thread
            title = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        found[pid] = (title, (int(fields[11]) + int(fields[12])) / TICKS)
    return found


def write(fits, args):
    args.out.mkdir(parents=True, exist_ok=True)
    report = dict(machine=describe_machine(), poll_interval_s=POLL_INTERVAL_S, fits=fits)
    (args.out / "results.json").write_text(json.dumps(report, indent=1))
    lines = [f"`python benchmarks/ray_fit_processes.py --fits {args.fits} --out {args.out}`", "",
             f"Machine: {report['machine']}", "",
             "A two-node Ray cluster on this machine (1 CPU per node), a driver already connected; each fit a "
             f"TorchTrainer with 2 CPU workers and one metric-only report, RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="
             f"{POLL_INTERVAL_S}.", "",
             "| fit | wall time (s) | CPU time of every other process (s) | processes started for it |",
             "|---|---|---|---|"]
    lines += [f"| {i} | {f['wall_s']} | {f['cpu_s']} | {f['new_processes']} |" for i, f in enumerate(fits, 1)]
    lines += ["", f"Fit {len(fits)}, process by process (0.05 s of CPU or more):", "",
              "| process | started for this fit | CPU time (s) |", "|---|---|---|"]
    lines += [f"| {p['role']} | {'yes' if p['new'] else 'no'} | {p['cpu_s']} |" for p in fits[-1]["processes"]]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
