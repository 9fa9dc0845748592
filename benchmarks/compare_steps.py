"""Runs the workshop's steps side by side with identical settings; writes a results table.

    python benchmarks/compare_steps.py --data-dir DIR                 # steps, memory, inference
    python benchmarks/compare_steps.py --data-dir DIR --only recipe   # the 10-epoch recipe, seeds 0 and 1
    python benchmarks/compare_steps.py --data-dir DIR --only recipe --recipe-seeds 1 --update   # redo one seed
    python benchmarks/compare_steps.py --data-dir DIR --only tp tp-giant --steps-per-epoch 30 \
        --out benchmarks/published/tensor-parallel     # step 07 beside DDP and FSDP2

What each section runs and measures: benchmarks/README.md. Every number comes from the final JSON line the scripts
print; each run's output is kept in <out>/logs/, the machine, date and commit in <out>/results.json.
"""
import argparse
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import groupby
from pathlib import Path

import torch

from benchmarks import steps as registry
from benchmarks.record import ROOT, Run, describe_commit, describe_machine, made_by, steady_images_per_s
from benchmarks.tables import steps_results_markdown
from common.meter import summary_of
from common.model import DEFAULT_PRESET, PRESETS, build_model, count_params

KEPT_CHECKPOINTS = ROOT / "benchmarks" / "results" / "checkpoints"  # git-ignored: tens of MB each
ADAMW_FP32_BYTES_PER_PARAM = 16  # weight, gradient and AdamW's two moments, 4 bytes each
# Step 05 as its README runs it in class: 4 trials of one short epoch, one worker each
# Sections that run only when --only names them: the 10-epoch recipe, and step 07's comparison (its own table)
ASKED_BY_NAME = ("recipe", "tp", "tp-giant")
STEP_05_IN_CLASS = ["--num-workers", "1", "--num-samples", "4", "--epochs", "1", "--steps-per-epoch", "50"]


def main():
    args = parse_args()
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    machine, commit = describe_machine(), describe_commit()  # at the start: the code that runs
    previous = json.loads((out / "results.json").read_text()) if args.update else None
    if previous:  # checked before the runs, not after them
        check_comparable(previous, machine, args, out / "results.json")
    # The memory section last: its Ray instance (started when it starts) would run beside the steps' own
    planned = (plan_step_runs(args) + [Run("ray_tune", "tune", "ray_tune", 1, STEP_05_IN_CLASS)]
               + plan_inference_runs(args) + plan_memory_runs(args) + plan_recipe_runs(args) + plan_tp_runs(args))
    only = set(args.only)  # run names or sections; by default every run but those of the sections asked by name
    runs = [r for r in planned if ({r.name, r.section} & only if only else r.section not in ASKED_BY_NAME)]
    if not runs:
        raise SystemExit(f"error: --only {' '.join(args.only)} matches no run; names: "
                         f"{', '.join(r.name for r in planned)}")
    reads = {flag for r in runs if r.step == "inference" for flag in r.flags}
    for run in runs:  # the single-machine steps run keeps the checkpoint that the inference section reads
        if run.section == "steps" and str(KEPT_CHECKPOINTS / run.name) in reads:
            run.checkpoint_dir = str(KEPT_CHECKPOINTS / run.name)
    memory_cluster = None

    def execute_or_skip(run: Run) -> Run:
        if run.skipped:
            run.status = "skipped"
        else:
            address = args.address or (memory_cluster if run.section == "memory" else None)
            execute(run, command(run, args, address), out / "logs" / f"{run.name}.log")
        return run
    # One run after another, but the recipe's seeds side by side (one thread each): two 10-epoch runs
    for batch in [list(group) for _, group in groupby(runs, key=lambda r: r.side_by_side or r.name)]:
        if memory_cluster is None and batch[0].section == "memory":  # not before: the steps start their own Ray
            memory_cluster = start_memory_cluster(args, runs)
        for run in batch:
            print(f"[{runs.index(run) + 1}/{len(runs)}] {run.name}: " + ("started" if len(batch) > 1 else ""),
                  end="\n" if len(batch) > 1 else "", flush=True)
        with ThreadPoolExecutor(len(batch)) as pool:  # one run at a time, but for the recipe's seeds
            for run in pool.map(execute_or_skip, batch):
                print((f"{run.name}: " if len(batch) > 1 else "") + outcome_line(run), flush=True)
    if memory_cluster:
        import ray

        ray.shutdown()
    ray_start_s = measure_ray_start() if any(r.section == "steps" and r.status == "ok" and r.step.startswith("ray")
                                             and not args.address for r in runs) else None
    made = made_by(commit)
    for run in runs:
        run.made_by = made
    results = dict(machine=machine, **made, ray_start_s=ray_start_s, steps_per_epoch=args.steps_per_epoch,
                   eval_images=args.eval_images, runs=[vars(r) for r in runs])
    if previous:
        results = updated(previous, results)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(steps_results_markdown(results))
    print(f"table: {out / 'results.md'} | logs: {out / 'logs'}")
    if any(r.status == "failed" for r in runs):
        raise SystemExit("error: some runs failed; their logs are in " + str(out / "logs"))


def check_comparable(previous: dict, machine: str, args, path: Path):
    """--update puts new runs in a table beside old ones: same machine, same epoch length, same evaluation."""
    if previous["machine"] != machine:
        raise SystemExit(f"error: --update: {path} was measured on {previous['machine']}, not on this machine "
                         f"({machine}); run every run here, without --update")
    if previous.get("steps_per_epoch") != args.steps_per_epoch:
        raise SystemExit(f"error: --update: {path} cut its epochs to {previous.get('steps_per_epoch')} steps, this "
                         f"command to {args.steps_per_epoch}; pass --steps-per-epoch {previous.get('steps_per_epoch')}")
    if previous.get("eval_images") != args.eval_images:
        raise SystemExit(f"error: --update: {path} scored its runs on {previous.get('eval_images') or 'all the'} test "
                         f"images, this command on {args.eval_images or 'all'}; pass the same --eval-images")


def updated(previous: dict, results: dict) -> dict:
    """previous's runs with results' in their place (or after them, if new): one table from two commands on one
    machine. Each run keeps the command, date and commit that made it."""
    provenance = {key: previous[key] for key in ("command", "date", "commit")}
    new = {r["name"]: r for r in results["runs"]}
    merged = [new.pop(r["name"], {**r, "made_by": r.get("made_by") or provenance}) for r in previous["runs"]]
    return {**results, "ray_start_s": results.get("ray_start_s") or previous.get("ray_start_s"),
            "runs": merged + list(new.values())}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_PRESET, choices=PRESETS,
                   help="steps section: the model every step trains (default: the steps' default)")
    p.add_argument("--data", default="cifar10", choices=["cifar10", "cifar10-val", "synthetic"])
    p.add_argument("--data-dir", default=None, help="passed to every step (default: the steps' default)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=None, help="global batch (default: the steps' default)")
    p.add_argument("--steps-per-epoch", type=int, default=None, help="cut epochs short (same for every step)")
    p.add_argument("--eval-images", type=int, default=None,
                   help="score each run on the first N test images (default: all; same for every step)")
    p.add_argument("--num-workers", type=int, default=2, help="processes of the multi-process steps")
    p.add_argument("--memory-model", default=list(PRESETS)[-1], choices=PRESETS, help="default: the largest")
    p.add_argument("--memory-workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--address", default=None, help="a running Ray cluster for every Ray run (default: the "
                   "steps start their own, as a user would; the memory section starts one with enough CPUs)")
    p.add_argument("--inference-checkpoint", default=None,
                   help="inference section: the checkpoint step 06 reads (default: the single-machine run's)")
    p.add_argument("--recipe-epochs", type=int, default=10, help="recipe section: epochs of each seed's run")
    p.add_argument("--recipe-seeds", type=int, nargs="+", default=[0, 1],
                   help="recipe section: a run per seed, side by side, the cores shared out between them")
    p.add_argument("--exact-test-images", type=int, default=None,
                   help="recipe section: also score each checkpoint on the first N test images alone")
    p.add_argument("--only", nargs="+", default=[],
                   help="run names or sections (steps, memory, inference, recipe, tp, tp-giant); default: all but "
                        "recipe, tp and tp-giant")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--update", action="store_true",
                   help="keep the runs already in <out>/results.json that this command does not redo")
    args = p.parse_args()
    if args.update and not (Path(args.out) / "results.json").is_file():
        p.error(f"--update: {Path(args.out) / 'results.json'} does not exist; run without --update to make it")
    return args


def plan_step_runs(args) -> list:
    n, gpus = args.num_workers, torch.cuda.device_count()
    runs = [Run("single_machine", "steps", "single_machine", 1), Run("ddp", "steps", "ddp", n),
            Run("ray_ddp_1_worker", "steps", "ray_ddp", 1), Run("ray_ddp", "steps", "ray_ddp", n),
            # Ray Train's local mode: one process with no Ray, and torchrun's N processes
            Run("ray_ddp_local", "steps", "ray_ddp", 1, ["--num-workers", "0"]),
            Run("ray_ddp_local_torchrun", "steps", "ray_ddp", n, ["--num-workers", "0"]),
            Run("ray_ddp_poll_2s", "steps", "ray_ddp", n, env={"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "2.0"}),
            Run("ray_ddp_data", "steps", "ray_ddp_data", n), Run("ray_fsdp", "steps", "ray_fsdp", n),
            Run("ray_fsdp2", "steps", "ray_fsdp2", n),
            Run("ray_fsdp2_mp_offload", "steps", "ray_fsdp2", n, ["--mixed-precision", "--cpu-offload"])]
    for run in runs:
        if gpus and run.workers > gpus:
            run.skipped = f"{run.workers} processes need {run.workers} GPUs, this machine has {gpus}"
        elif run.workers > (os.cpu_count() or 1) and not gpus:
            run.skipped = f"{run.workers} processes need {run.workers} CPU cores, this machine has {os.cpu_count()}"
    return runs


def plan_memory_runs(args) -> list:
    """DDP keeps all state on every rank; on a CPU machine the ranks share its RAM, on GPUs each rank has
    its own. Runs that cannot fit are predicted from the exact byte count and not started."""
    with torch.device("meta"):
        state_bytes = ADAMW_FP32_BYTES_PER_PARAM * count_params(build_model(args.memory_model))
    gpus = torch.cuda.device_count()
    capacity = torch.cuda.get_device_properties(0).total_memory if gpus else os.sysconf("SC_PAGE_SIZE") * \
        os.sysconf("SC_PHYS_PAGES")
    runs = []
    for n in args.memory_workers:
        for name, step, flags in [(f"memory_ddp_n{n}", "ray_ddp", []), (f"memory_fsdp1_n{n}", "ray_fsdp", []),
                                  (f"memory_fsdp2_n{n}", "ray_fsdp2", []),
                                  (f"memory_fsdp2_offload_n{n}", "ray_fsdp2", ["--cpu-offload"])]:
            if step == "ray_fsdp" and n < 2:
                continue  # step 03 shards over 2 or more workers only
            run = Run(name, "memory", step, n, flags)
            need = state_bytes * (1 if gpus else n)  # GPUs: a device per rank; CPUs: the ranks share the RAM
            if gpus and n > gpus:
                run.skipped = f"needs {n} GPUs, this machine has {gpus}"
            elif step == "ray_ddp" and need > 0.9 * capacity:
                where = "of GPU memory" if gpus else f"of RAM, shared by the {n} ranks"
                run.skipped = (f"does not fit: DDP keeps all {state_bytes / 2**30:.1f} GiB of weights, gradients "
                               f"and AdamW state on every rank; {need / 2**30:.1f} GiB > 90% of "
                               f"{capacity / 2**30:.1f} GiB {where}")
            runs.append(run)
    return runs


def plan_inference_runs(args) -> list:
    """Step 06 on the single-machine run's checkpoint (or --inference-checkpoint), 1 and 2 Ray Data actors."""
    checkpoint = args.inference_checkpoint or str(KEPT_CHECKPOINTS / "single_machine")
    runs = [Run(f"inference_{n}_actor{'s' * (n > 1)}", "inference", "inference", n,
                ["--checkpoint", checkpoint, "--actors", str(n)]) for n in (1, 2)]
    for run in runs:
        if run.workers > (os.cpu_count() or 1):
            run.skipped = f"{run.workers} actors need {run.workers} CPU cores, this machine has {os.cpu_count()}"
    return runs


def plan_recipe_runs(args) -> list:
    """The steps' defaults (the recipe) for --recipe-epochs, one run per --recipe-seeds side by side, the cores
    shared out between them (their epoch times are not the recipe's speed: the steps section's single-machine
    run is), then step 06 on each checkpoint's first --exact-test-images."""
    threads = max(1, (os.cpu_count() or 1) // len(args.recipe_seeds))
    runs = [Run(f"recipe_seed{seed}", "recipe", "single_machine", 1,
                ["--epochs", str(args.recipe_epochs), "--seed", str(seed)],
                checkpoint_dir=str(KEPT_CHECKPOINTS / f"recipe_seed{seed}"), env={"OMP_NUM_THREADS": str(threads)},
                side_by_side=True) for seed in args.recipe_seeds]
    return runs + [Run(f"recipe_seed{seed}_exact", "recipe", "inference", 1,
                       ["--checkpoint", str(KEPT_CHECKPOINTS / f"recipe_seed{seed}"), "--eval-images",
                        str(args.exact_test_images)]) for seed in args.recipe_seeds if args.exact_test_images]


def plan_tp_runs(args) -> list:
    """Step 07 beside DDP and FSDP2 on --num-workers: the steps section's settings (tp), and one step of
    --memory-model as the memory section runs it (tp-giant), where DDP is predicted, as there, when it cannot fit."""
    n = args.num_workers
    runs = [Run(f"tp_{step}", "tp", step, n) for step in ("ray_ddp", "ray_fsdp2", "ray_tp")]
    memory = {r.name: r for r in plan_memory_runs(argparse.Namespace(**{**vars(args), "memory_workers": [n]}))}
    ddp = memory[f"memory_ddp_n{n}"]
    return runs + [Run(f"tp_giant_{step}", "tp-giant", step, n, skipped=ddp.skipped if step == "ray_ddp" else None)
                   for step in ("ray_ddp", "ray_fsdp2", "ray_tp")]


def start_memory_cluster(args, runs) -> str | None:
    """One Ray instance with a logical CPU per worker (4 workers on a 2-core machine are fine for a
    memory probe), which the memory runs attach to with --address."""
    needed = [r.workers for r in runs if r.section == "memory" and not r.skipped]
    if args.address or not needed:
        return None
    import ray

    ray.init(num_cpus=max(max(needed), os.cpu_count() or 1), include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    return ray.get_runtime_context().gcs_address


def command(run: Run, args, address: str | None) -> list:
    script = str(ROOT / registry.step(run.step).script)
    data_dir = ["--data-dir", args.data_dir] if args.data_dir else []
    at = ["--address", address] if address else []
    if run.step in ("inference", "ray_tune"):  # their own data defaults; their tables go to a scratch folder
        data = (["--data", args.data] if run.step == "inference" else []) + data_dir  # step 05 tunes on its split
        scratch = Path(tempfile.gettempdir()) / f"bench-{run.name}-{os.getpid()}"  # execute removes it
        return [sys.executable, script, *data, *run.flags, "--out", str(scratch), *at]
    if run.section == "recipe":  # the steps' defaults, model included
        return [sys.executable, script, "--data", args.data, *data_dir, *run.flags]
    if run.section in ("memory", "tp-giant"):  # one step, one image per worker at the largest count, no retries
        batch = str(math.lcm(*args.memory_workers) if run.section == "memory" else run.workers)
        flags = ["--model", args.memory_model, "--data", "synthetic", "--epochs", "1", "--steps-per-epoch", "1",
                 "--batch-size", batch, "--eval-images", batch, "--max-failures", "0"]
    else:
        flags = ["--model", args.model, "--data", args.data, "--epochs", str(args.epochs)]
        for flag, value in [("--data-dir", args.data_dir), ("--batch-size", args.batch_size),
                            ("--steps-per-epoch", args.steps_per_epoch), ("--eval-images", args.eval_images)]:
            if value is not None:
                flags += [flag, str(value)]
    flags += run.flags
    if run.step == "ddp" or run.name == "ray_ddp_local_torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                str(run.workers), script, *flags]
    if run.step == "single_machine" or "--num-workers" in run.flags:  # local mode's --num-workers 0: no Ray
        return [sys.executable, script, *flags]
    return [sys.executable, script, *flags, "--num-workers", str(run.workers), *at]


def execute(run: Run, cmd: list, log_path: Path) -> None:
    """Run one step in a fresh checkpoint folder (or the one kept for a later run); keep its output; read its
    final JSON line."""
    checkpoint_dir = run.checkpoint_dir or tempfile.mkdtemp(prefix=f"bench-{run.name}-")
    if run.checkpoint_dir:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)  # a fresh run, not the resumption of an old one
    if run.step != "inference":
        cmd = [*cmd, "--checkpoint-dir", checkpoint_dir]
    launched, summary, seen_at = time.time(), None, None
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        process = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", **run.env}, text=True,
                                   stdout=subprocess.PIPE, stderr=log)
        for line in process.stdout:
            log.write(line)
            log.flush()  # so that `tail -f` on the log follows the run
            if line.startswith("{"):
                summary, seen_at = summary_of(json.loads(line)), time.time()
        returncode = process.wait()
    if not run.checkpoint_dir:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)  # a giant model's checkpoints are tens of GB
    if "--out" in cmd:  # steps 05's and 06's own tables (command)
        shutil.rmtree(cmd[cmd.index("--out") + 1], ignore_errors=True)
    if returncode or summary is None:
        run.status, run.error = "failed", last_error_line(log_path)
        return
    run.status, run.summary, run.wall_s = "ok", summary, seen_at - launched
    if run.step not in ("inference", "ray_tune"):
        # wall_time_s runs from the script's own start, after its imports: add what came before it.
        run.imports_s = seen_at - summary["wall_time_s"] - launched
        run.launch_to_first_step_s = run.imports_s + summary["time_to_first_step_s"]


def last_error_line(log_path: Path) -> str:
    """Why a run failed: the script's own one-line error, else Ray's out-of-memory kill (which the
    shutdown errors printed after it would hide), else the last line that names an error."""
    lines = [line.strip() for line in log_path.read_text().splitlines() if line.strip()]
    for wanted in (lambda line: line.startswith("error:"), lambda line: "OutOfMemoryError" in line,
                   lambda line: "Error" in line):
        if found := [line for line in lines if wanted(line)]:
            return found[-1][:300]
    return (lines or ["no output"])[-1][:300]


def outcome_line(run: Run) -> str:
    s = run.summary
    if run.status != "ok":
        return f"skipped: {run.skipped}" if run.status == "skipped" else f"FAILED ({run.error})"
    if run.step == "inference":
        return f"{s['images']:,} images, {s['images_per_s']:,.0f} images/s, accuracy {s['accuracy']:.2%}"
    if run.step == "ray_tune":
        return f"{len(s['trials'])} trials in {run.wall_s:.0f} s, best {s['best']['best_accuracy']:.2%}"
    state = sum((s.get("memory_per_rank") or [{}])[0].get(k, 0) for k in ("params_mb", "grads_mb", "optimizer_mb"))
    return (f"test acc {s['test_accuracy']:.2%}, {steady_images_per_s(s):,.0f} img/s, first step after "
            f"{run.launch_to_first_step_s:.1f} s" + (f", {state:,.0f} MB state on rank 0" if state else ""))


def measure_ray_start() -> float:
    """Seconds that the steps' ray.init takes to start a local Ray, in a fresh process, imports excluded."""
    code = ("import time, ray; from common.ray_setup import init_options; t = time.time(); "
            "ray.init(address='local', **init_options('local')); print(time.time() - t)")
    return float(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
