"""One prepared run for a GPU machine (1 GPU, 16 CPU cores), to start the moment one is lent: every step on the GPU,
then torchrun DDP against Ray DDP on the CPUs with 1 to 8 processes.

    python benchmarks/device_run.py --out benchmarks/published/gpu-nvidia-h200-x1   # on the GPU machine
    python benchmarks/device_run.py --dry-run                                       # anywhere, on CPU (CI runs it)

What runs, with its limits and sizes: benchmarks/README.md, section "GPU and 16 cores". Every planned command goes
through its step's own parser first, so that a typo costs no device time; --dry-run does that, then runs two of the
runs at a tiny size on CPU and writes the same files.
"""
import argparse
import contextlib
import io
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from benchmarks.compare_steps import command, execute, outcome_line
from benchmarks.record import ROOT, Run, describe_commit, describe_machine, made_by
from benchmarks.tables import device_run_markdown
from common.model import DEFAULT_PRESET, PRESETS

GLOBAL_BATCH = 128  # the steps' default, as in the published CPU tables
CPU_EVAL_IMAGES = 128  # evaluation on the CPUs takes longer than the few training steps measured
# Ray runs give up at their first failure: a restart would spend the budget on a run already lost.
NO_RETRY = ["--max-failures", "0"]
# Step 03 on one GPU: in local mode, FullyShardedDataParallel by hand over one process (prepare_model leaves a world
# of one unwrapped, and step 03 refuses one Ray worker for that reason).
FSDP1_ONE_GPU = ["--num-workers", "0"]
TINY = dict(model="tiny", epochs=2, steps_per_epoch=1, cpu_steps_per_epoch=1, batch_size=32, eval_images=32)
KILL_GRACE_S = 10  # after its limit, a run gets SIGTERM, and SIGKILL this much later
MIN_RUN_S = 20  # a run is not started with less of the budget left


class FlagsAccepted(BaseException):
    """Raised in place of running a step once its parser accepted the flags; a step's `except Exception` lets it by."""


def main():
    args = parse_args()
    started, out = time.time(), Path(args.out)
    try:
        (out / "logs").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"error: --out {out} cannot be created ({e.strerror}); pass a writable folder")
    checkpoints = Path(tempfile.mkdtemp(prefix="device-run-"))  # step 01's, which step 06 reads
    try:
        check_commands(plan_runs(args, checkpoints), args)
        settings = argparse.Namespace(**{**vars(args), **TINY}) if args.dry_run else args
        runs = plan_runs(settings, checkpoints)
        if args.dry_run:  # two runs, one per way a step starts: python (step 01 alone; the Ray steps too), torchrun
            torchrun = next(r.name for r in runs if r.section == "scaling" and r.step == "ddp")
            for run in runs:
                if run.name not in ("single_machine", torchrun) and not run.skipped:
                    run.skipped = "dry run: its command was checked by its step's parser, not run"
        results = describe_run(settings, runs)
        for number, run in enumerate(runs, 1):
            start_or_skip(run, runs, settings, started, out)
            print(f"[{number}/{len(runs)}] {run.name}: {outcome_line(run)}", flush=True)
            write_results(results, runs, started, out)
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)
    print(f"total: {time.time() - started:.0f} s (budget {args.budget_s:.0f} s) | table: {out / 'results.md'} | "
          f"logs: {out / 'logs'}")
    if failed := [r.name for r in runs if r.status == "failed"]:
        raise SystemExit(f"error: {len(failed)} of {len(runs)} runs failed ({', '.join(failed)}); why: "
                         f"{out / 'results.md'}, their logs: {out / 'logs'}")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "device-run"))
    p.add_argument("--dry-run", action="store_true",
                   help="on CPU: check every planned command, run two at a tiny size, write the files")
    p.add_argument("--model", default=DEFAULT_PRESET, choices=PRESETS, help="every run's preset (default: the steps')")
    p.add_argument("--epochs", type=int, default=3, help="per training run; the first is the warm-up")
    p.add_argument("--steps-per-epoch", type=int, default=32,
                   help="on the GPU (32: all 4,096 synthetic training images at the global batch of 128)")
    p.add_argument("--cpu-steps-per-epoch", type=int, default=6, help="on the CPUs")
    p.add_argument("--processes", type=int, nargs="+", default=[1, 8, 2, 4],
                   help="CPU runs' sizes, in this order: the ends first, so that a spent budget loses a middle one "
                        "(each must divide the global batch of 128: the steps' own parsers refuse others)")
    p.add_argument("--threads-per-process", type=int, default=2, help="CPU runs: OMP_NUM_THREADS of each process")
    p.add_argument("--budget-s", type=float, default=450, help="all the runs together; each also has its own limit")
    # Not flags: the steps' global batch, and every evaluation image on the GPU (TINY's differ)
    p.set_defaults(batch_size=GLOBAL_BATCH, eval_images=None)
    args = p.parse_args()
    if args.epochs < 2:
        p.error(f"--epochs {args.epochs} leaves no epoch after the warm-up; use 2 or more")
    for flag in ("--steps-per-epoch", "--cpu-steps-per-epoch", "--threads-per-process", "--budget-s"):
        if getattr(args, flag[2:].replace("-", "_")) <= 0:
            p.error(f"{flag} must be more than 0")
    if not shutil.which("timeout"):
        p.error("no `timeout` command (GNU coreutils), which holds each run to its limit; install coreutils")
    if not args.dry_run and not torch.cuda.is_available():
        p.error("this machine has no GPU; run with --dry-run here, or without it on a GPU machine")
    return args


def plan_runs(args, checkpoints: Path) -> list:
    """Every step on one process on the GPU, step 06 on step 01's checkpoint, then torchrun DDP and Ray DDP at each
    size on the CPUs, the GPU hidden from both."""
    evaluation = ["--eval-images", str(args.eval_images)] if args.eval_images else []
    runs = [Run("single_machine", "steps", "single_machine", 1, evaluation,
                checkpoint_dir=str(checkpoints / "single_machine")),
            Run("ddp", "steps", "ddp", 1, evaluation),
            Run("ray_ddp", "steps", "ray_ddp", 1, NO_RETRY + evaluation),
            Run("ray_fsdp", "steps", "ray_fsdp", 1, NO_RETRY + evaluation + FSDP1_ONE_GPU),
            Run("ray_fsdp2", "steps", "ray_fsdp2", 1, NO_RETRY + evaluation),
            Run("ray_fsdp2_mixed_precision", "steps", "ray_fsdp2", 1, NO_RETRY + evaluation + ["--mixed-precision"]),
            Run("ray_fsdp2_cpu_offload", "steps", "ray_fsdp2", 1, NO_RETRY + evaluation + ["--cpu-offload"]),
            Run("inference_1_actor", "inference", "inference", 1,
                ["--checkpoint", str(checkpoints / "single_machine"), "--actors", "1"] + evaluation)]
    env = {"OMP_NUM_THREADS": str(args.threads_per_process), "CUDA_VISIBLE_DEVICES": ""}
    evaluation = ["--eval-images", str(args.eval_images or CPU_EVAL_IMAGES)]
    for n in args.processes:
        runs += [Run(f"cpu_torchrun_ddp_n{n}", "scaling", "ddp", n, evaluation, env=env),
                 Run(f"cpu_ray_ddp_n{n}", "scaling", "ray_ddp", n, NO_RETRY + ["--no-gpu"] + evaluation, env=env)]
    return runs


def step_command(run: Run, args) -> list:
    """compare_steps' command for the run, with this script's sizes: the CPU runs' epochs are shorter."""
    steps = args.cpu_steps_per_epoch if run.section == "scaling" else args.steps_per_epoch
    settings = argparse.Namespace(model=args.model, data="synthetic", data_dir=None, epochs=args.epochs,
                                  steps_per_epoch=steps, batch_size=args.batch_size,
                                  eval_images=None)  # in each run's flags: the GPU's and the CPUs' differ
    return command(run, settings, None)


def check_commands(runs: list, args) -> None:
    """Every planned command through its step's own parser and checks (and torchrun's), without running it: in one
    fresh process per GPU visibility, since whether a GPU is visible changes what the steps accept."""
    by_visibility = {}
    for run in (r for r in runs if not r.skipped):
        by_visibility.setdefault(run.env.get("CUDA_VISIBLE_DEVICES"), []).append(
            dict(name=run.name, argv=step_command(run, args)[1:], env=run.env))

    def refusals_in_a_fresh_process(visibility_and_entries: tuple) -> list:
        visibility, entries = visibility_and_entries
        env = {**os.environ, **({} if visibility is None else {"CUDA_VISIBLE_DEVICES": visibility})}
        code = "from benchmarks import device_run; device_run.print_refusals()"
        result = subprocess.run([sys.executable, "-c", code], input=json.dumps(entries), cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=300)
        try:
            return json.loads(result.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            return [f"the check itself failed: {(result.stderr.strip().splitlines() or ['no output'])[-1]}"]
    with ThreadPoolExecutor(len(by_visibility)) as pool:
        refusals = [r for found in pool.map(refusals_in_a_fresh_process, by_visibility.items()) for r in found]
    if refusals:
        raise SystemExit(f"error: planned commands refused by their step's parser: {'; '.join(refusals)}; fix "
                         f"their flags in benchmarks/device_run.py")


def print_refusals() -> None:
    """In the fresh process of check_commands: each command of stdin's list, run until its parser has accepted the
    flags; prints, as its last line, a JSON list of what was refused and why."""
    from common.flags import Parser

    accept = Parser.parse_args

    def accept_then_stop(self, args=None, namespace=None):
        accept(self, args, namespace)
        raise FlagsAccepted

    Parser.parse_args = accept_then_stop
    print(json.dumps([refusal for entry in json.load(sys.stdin) if (refusal := refused(**entry))]))


def refused(name: str, argv: list, env: dict) -> str | None:
    """Why the step (or torchrun) refuses this command, in its own words; None if it accepts it."""
    environment, errors = dict(os.environ), io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            if argv[:2] == ["-m", "torch.distributed.run"]:
                from torch.distributed.run import get_args_parser

                launcher = get_args_parser().parse_args(argv[2:])
                argv = [launcher.training_script, *launcher.training_script_args]
                env = {**env, "WORLD_SIZE": launcher.nproc_per_node, "LOCAL_WORLD_SIZE": launcher.nproc_per_node}
            os.environ.update(env)
            sys.argv = argv
            runpy.run_path(argv[0], run_name="__main__")
    except FlagsAccepted:
        return None
    except SystemExit as e:
        said = errors.getvalue().strip().splitlines()
        return f"{name}: {said[-1] if said else e.code}"
    except Exception as e:  # a script that cannot even start is refused too
        return f"{name}: {type(e).__name__}: {e}"
    finally:
        os.environ.clear()
        os.environ.update(environment)
    return f"{name}: {Path(argv[0]).name} ran without parsing its flags with common.flags.Parser"


def start_or_skip(run: Run, runs: list, args, started: float, out: Path) -> None:
    """Run it within its own limit and what is left of the budget, unless it cannot run."""
    left = args.budget_s - (time.time() - started)
    single = next(r for r in runs if r.name == "single_machine")
    if run.step == "inference" and single.status != "ok" and not run.skipped:
        run.skipped = "step 01 alone, whose checkpoint it reads, did not finish"
    elif left < MIN_RUN_S and not run.skipped:
        run.skipped = f"not started: less than {MIN_RUN_S} s of the {args.budget_s:.0f} s budget left"
    if run.skipped:
        run.status = "skipped"
        return
    limit = int(min(own_limit_s(run), left))
    launched = time.time()
    try:
        execute(run, ["timeout", "--kill-after", str(KILL_GRACE_S), str(limit), *step_command(run, args)],
                out / "logs" / f"{run.name}.log")
    except Exception as e:  # one run's surprise (say, a line of its output that looks like JSON) ends only that run
        run.status, run.error = "failed", f"device_run could not run it: {type(e).__name__}: {e}"
        return
    if run.status == "failed" and time.time() - launched >= limit:
        run.error = f"stopped at its {limit} s limit; from its log: {run.error}"
    expected = None if args.dry_run else ("cpu" if run.section == "scaling" else "cuda")
    if run.status == "ok" and expected and run.summary.get("device") != expected:
        run.status, run.error = "failed", f"ran on {run.summary.get('device')}, not on {expected}"


def own_limit_s(run: Run) -> int:
    """About three times what the run should take on the GPU machine; Ray's start-up and shutdown take 10-20 s."""
    return 90 if run.step in ("single_machine", "ddp") else 150


def describe_run(args, runs: list) -> dict:
    """The machine (its GPU, driver and CUDA), the command, and the settings that every run shares."""
    made = made_by(describe_commit())
    for run in runs:
        run.made_by = made
    return dict(machine=describe_machine(), gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                gpus=torch.cuda.device_count(), driver=nvidia_driver(), cuda=torch.version.cuda,
                cpu_count=os.cpu_count(), torch=torch.__version__, **made, dry_run=args.dry_run,
                ray_start_s=None, model=args.model, epochs=args.epochs, global_batch_size=args.batch_size,
                steps_per_epoch=args.steps_per_epoch, cpu_steps_per_epoch=args.cpu_steps_per_epoch,
                threads_per_process=args.threads_per_process, budget_s=args.budget_s,
                limits_s={r.name: own_limit_s(r) for r in runs})


def nvidia_driver() -> str | None:
    """The driver's version from nvidia-smi, if this machine has it."""
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return (smi.stdout.strip().splitlines() or [None])[0]


def write_results(results: dict, runs: list, started: float, out: Path) -> None:
    results = {**results, "elapsed_s": time.time() - started, "runs": [vars(r) for r in runs]}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    try:
        markdown = device_run_markdown(results)
    except Exception as e:  # a table that cannot be drawn must not stop the runs to come; results.json has it all
        markdown = f"results.md could not be drawn ({type(e).__name__}: {e}); the runs are in results.json\n"
    (out / "results.md").write_text(markdown)


if __name__ == "__main__":
    main()
