"""How long a `ray.train.report` takes, at Ray Train's default controller poll and at the steps' own.

    python benchmarks/report_latency.py --out benchmarks/published/report-latency

Ray Train V2's controller polls its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s by default) and a
worker's report waits for that poll, so a report costs up to one interval however little it carries. Each
interval is measured in a fresh process (a fresh local Ray): 2 CPU workers make --reports metric-only
reports, rank 0 times them, and the last report carries a checkpoint so that its metrics reach the Result.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # common/ and benchmarks/, also without `pip install -e .`
from benchmarks.compare_steps import describe_machine  # noqa: E402
from common.ray_setup import POLL_INTERVAL_S  # noqa: E402

RAY_DEFAULT_INTERVAL_S = 2.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("results/report-latency"))
    parser.add_argument("--interval", type=float, help=argparse.SUPPRESS)  # one measurement, in this process
    args = parser.parse_args()
    if args.interval is not None:
        print(json.dumps(measure(args.interval, args.reports)))
        return
    rows = [measure_in_fresh_process(interval, args.reports) for interval in (RAY_DEFAULT_INTERVAL_S, POLL_INTERVAL_S)]
    write(rows, args)


def measure_in_fresh_process(interval: float, reports: int) -> dict:
    cmd = [sys.executable, __file__, "--interval", str(interval), "--reports", str(reports)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(interval: float, reports: int) -> dict:
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


def write(rows: list, args) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    import ray

    lines = [f"`python benchmarks/report_latency.py --out {args.out}`", "",
             f"Machine: {describe_machine()}; Ray {ray.__version__}; {time.strftime('%Y-%m-%d')}", "",
             f"2 CPU workers, {args.reports} reports each ({args.reports - 1} metric-only, timed on rank 0, "
             "then one with a checkpoint); a fresh local Ray per row.", "",
             "| RAY_TRAIN_HEALTH_CHECK_INTERVAL_S | metric-only reports (s) | per report (s) | whole fit (s) |",
             "|---|---|---|---|"]
    lines += [f"| {r['interval_s']} | {r['metric_only_reports_s']:.1f} | {r['per_report_s']:.2f} | {r['fit_s']:.1f} |"
              for r in rows]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
