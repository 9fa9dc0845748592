"""Profiles a few training steps of DDP, FSDP1, FSDP2 and FSDP2 with CPU offload, side by side.

    python benchmarks/profile_steps.py --data synthetic
    python benchmarks/profile_steps.py --data-dir ../shared/data/cifar10 --profile-steps 4

Every variant is a Ray Train run of its step script with --profile-steps N (common/profiling.py); DDP runs as step
02, not 01, so that the variants differ by their strategy only, not by their launcher. Writes the traces, results.json
(every profiled step as trace_analysis.py reads it) and, by tables.py, results.md and timeline.png to --out.
"""
import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.compare_steps import command, execute
from benchmarks.record import ROOT, Run, describe_commit, describe_machine, made_by
from benchmarks.tables import write_profile_report
from benchmarks.trace_analysis import summarize
from common.model import DEFAULT_PRESET, PRESETS
from common.profiling import WARMUP_STEPS

VARIANTS = {  # name: (step, flags, title)
    "ddp": ("ray_ddp", [], "DDP (step 02)"),
    # The same all-reduces per optimizer step as "ddp", though every optimizer step is 4 micro-batches:
    # no_sync() skips the first 3 (without it, 4 times the calls).
    "ddp_accum4": ("ray_ddp", ["--grad-accum-steps", "4"], "DDP, 4 micro-batches (step 02)"),
    "fsdp1": ("ray_fsdp", [], "FSDP1 (step 03)"),
    "fsdp2": ("ray_fsdp2", [], "FSDP2 (step 04)"),
    "fsdp2_offload": ("ray_fsdp2", ["--cpu-offload"], "FSDP2 + CPU offload (step 04)"),
}


def main():
    args = parse_args()
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    variants = [name for name in VARIANTS if not args.only or name in args.only]
    results = dict(machine=describe_machine(), **made_by(describe_commit()), warmup_steps=WARMUP_STEPS,
                   profile_steps=args.profile_steps, variants=[])
    for i, name in enumerate(variants, 1):
        print(f"[{i}/{len(variants)}] {name}: ", end="", flush=True)
        variant = profile_variant(name, args, out)
        results["variants"].append(variant)
        print(variant["error"] or f"{variant['wall_s']:.0f} s", flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    timeline = write_profile_report(results, out)
    print(f"table: {out / 'results.md'} | timeline: {timeline} | traces: {out / 'traces'}")
    if any(v["status"] != "ok" for v in results["variants"]):
        raise SystemExit("error: some runs failed; their logs are in " + str(out / "logs"))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_PRESET, choices=PRESETS)
    p.add_argument("--data", default="cifar10", choices=["cifar10", "cifar10-val", "synthetic"])
    p.add_argument("--data-dir", default=None, help="passed to every step (default: theirs)")
    p.add_argument("--batch-size", type=int, default=128, help="global batch (the steps' default)")
    p.add_argument("--profile-steps", type=int, default=3, help="optimizer steps profiled per run")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--address", default=None, help="a Ray cluster (default: each run starts one)")
    p.add_argument("--only", nargs="+", default=[], choices=list(VARIANTS), help="variants to run")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "profile"))
    return p.parse_args()


def profile_variant(name: str, args, out: Path) -> dict:
    """Runs one variant in a fresh run folder, copies its traces into <out>/traces/<name>/."""
    step, flags, title = VARIANTS[name]
    profile = ["--profile-steps", str(args.profile_steps), "--max-failures", "0"]  # and no retry
    run = Run(name, "profile", step, args.num_workers, profile + flags,
              checkpoint_dir=tempfile.mkdtemp(prefix=f"profile-{name}-"))
    # one epoch just long enough for the warm-up and the profile, a short evaluation
    cmd = command(run, argparse.Namespace(**vars(args), epochs=1, steps_per_epoch=WARMUP_STEPS + args.profile_steps,
                                          eval_images=args.batch_size), args.address)
    started, load = time.time(), os.getloadavg()[0]  # other work on the machine skews the times
    execute(run, cmd, out / "logs" / f"{name}.log")
    variant = dict(name=name, title=title, command=" ".join(cmd), status="failed", error=None,
                   wall_s=time.time() - started, load_average=load, ranks=[])
    profiles = sorted(Path(run.checkpoint_dir).glob("**/profile/rank0.json.gz"))
    if run.status != "ok" or not profiles:
        variant["error"] = f"FAILED ({run.error or 'no trace written'})"
    else:
        variant["status"], variant["ranks"] = "ok", summarize(profiles[-1].parents[1])["ranks"]
        (out / "traces" / name).mkdir(parents=True, exist_ok=True)
        for rank in variant["ranks"]:  # beside the results: the run folder is deleted
            rank["trace"] = str(Path(shutil.copy(rank["trace"], out / "traces" / name)).relative_to(out))
    shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    return variant


if __name__ == "__main__":
    main()
