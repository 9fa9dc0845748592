"""Profiles a few training steps of DDP, FSDP1, FSDP2 and FSDP2 with CPU offload, side by side.

    python benchmarks/profile_steps.py --data synthetic
    python benchmarks/profile_steps.py --data-dir ../shared/data/cifar10 --profile-steps 4

Every variant is a Ray Train run of its step script on --num-workers workers with --profile-steps N
(common/profiling.py): after 2 warm-up steps, torch.profiler records N optimizer steps and every
rank writes its trace, which trace_analysis.py reads. DDP runs as step 02 (Ray), not step 01
(torchrun), so that the four differ by their strategy only, not by their launcher. This writes
into --out: the traces (traces/<variant>/rank<r>.json.gz, for https://ui.perfetto.dev),
results.json (the machine, the command, the date, and per variant and rank the breakdown of every
profiled step), results.md (the table) and timeline.png (one training step per rank, drawn from
the traces, the variants stacked).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # common/, also without `pip install -e .`
from common.model import DEFAULT_PRESET, PRESETS  # noqa: E402
from common.profiling import WARMUP_STEPS  # noqa: E402
from compare_steps import SCRIPTS, describe_commit, describe_machine, last_error_line  # noqa: E402
from trace_analysis import PHASES, load_trace, profiled_steps, step_parts, summarize  # noqa: E402

VARIANTS = {  # name: (step, flags, title)
    "ddp": ("ray_ddp", [], "DDP (step 02)"),
    # The same all-reduces per optimizer step as "ddp", though every optimizer step is 4 micro-batches:
    # no_sync() skips the first 3 (without it, 4 times the calls).
    "ddp_accum4": ("ray_ddp", ["--grad-accum-steps", "4"], "DDP, 4 micro-batches (step 02)"),
    "fsdp1": ("ray_fsdp", [], "FSDP1 (step 03)"),
    "fsdp2": ("ray_fsdp2", [], "FSDP2 (step 04)"),
    "fsdp2_offload": ("ray_fsdp2", ["--cpu-offload"], "FSDP2 + CPU offload (step 04)"),
}
PHASE_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer": "#55a868",
                "other": "#b0b0b0"}
KIND_COLORS = {"all_reduce": "#c44e52", "all_gather": "#8172b3", "reduce_scatter": "#937860",
               "broadcast": "#da8bc3"}


def main():
    args = parse_args()
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    variants = [name for name in VARIANTS if not args.only or name in args.only]
    results = dict(machine=describe_machine(), date=time.strftime("%Y-%m-%d"),
                   command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), commit=describe_commit(),
                   warmup_steps=WARMUP_STEPS, profile_steps=args.profile_steps, variants=[])
    for i, name in enumerate(variants, 1):
        print(f"[{i}/{len(variants)}] {name}: ", end="", flush=True)
        variant = profile_variant(name, args, out)
        results["variants"].append(variant)
        print(variant["error"] or f"{variant['wall_s']:.0f} s", flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(results_markdown(results))
    timeline = draw_timeline([v for v in results["variants"] if v["status"] == "ok"], out)
    print(f"table: {out / 'results.md'} | timeline: {timeline} | traces: {out / 'traces'}")
    if any(v["status"] != "ok" for v in results["variants"]):
        raise SystemExit("error: some runs failed; their logs are in " + str(out / "logs"))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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


def command(name: str, args) -> list:
    """One epoch just long enough for the warm-up and the profile, a short evaluation, no retry."""
    step, flags, _ = VARIANTS[name]
    cmd = [sys.executable, str(ROOT / SCRIPTS[step]), "--model", args.model, "--data", args.data,
           "--epochs", "1", "--steps-per-epoch", str(WARMUP_STEPS + args.profile_steps),
           "--batch-size", str(args.batch_size), "--eval-images", str(args.batch_size),
           "--profile-steps", str(args.profile_steps), "--num-workers", str(args.num_workers),
           "--max-failures", "0", *flags]
    for flag, value in [("--data-dir", args.data_dir), ("--address", args.address)]:
        if value is not None:
            cmd += [flag, value]
    return cmd


def profile_variant(name: str, args, out: Path) -> dict:
    """Runs one variant in a fresh run folder, copies its traces into <out>/traces/<name>/."""
    cmd = command(name, args)
    run_dir = Path(tempfile.mkdtemp(prefix=f"profile-{name}-"))
    log_path = out / "logs" / f"{name}.log"
    started, load = time.time(), os.getloadavg()[0]  # other work on the machine skews the times
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        returncode = subprocess.call([*cmd, "--checkpoint-dir", str(run_dir)], cwd=ROOT,
                                     stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
    variant = dict(name=name, title=VARIANTS[name][2], command=" ".join(cmd), status="failed",
                   error=None, wall_s=time.time() - started, load_average=load, ranks=[])
    profiles = sorted(run_dir.glob("**/profile/rank0.json.gz"))
    if returncode or not profiles:
        variant["error"] = f"FAILED ({last_error_line(log_path)})"
    else:
        variant["status"] = "ok"
        variant["ranks"] = copy_traces(summarize(profiles[-1].parents[1])["ranks"], out / "traces" / name)
    shutil.rmtree(run_dir, ignore_errors=True)
    return variant


def copy_traces(ranks: list, to: Path) -> list:
    """The ranks' summaries, their traces copied beside the results (the run folder is deleted)."""
    to.mkdir(parents=True, exist_ok=True)
    for rank in ranks:
        rank["trace"] = str(Path(shutil.copy(rank["trace"], to)).relative_to(to.parents[1]))
    return ranks


def results_markdown(results: dict) -> str:
    lines = [f"# Profiled training steps ({results['date']})", "",
             f"Machine: {results['machine']}", "",
             f"Command: `python benchmarks/{results['command']}` (code: commit {results['commit']})", "",
             "Load average when each run started (other work on the machine slows it): " +
             ", ".join(f"{v['name']} {v['load_average']:.1f}" for v in results["variants"]), "",
             f"Milliseconds per optimizer step: the mean of {results['profile_steps']} steps after "
             f"{results['warmup_steps']} warm-up steps. Communication: each collective's calls per step "
             "and their milliseconds in all, as gloo's threads ran them (waits for the other rank included). "
             "Overlapped: the communication time during which the training thread computed.", ""]
    return "\n".join(lines + results_table(results) + ["", NOTE]) + "\n"


def results_table(results: dict) -> list:
    """A row per variant and rank; a failed variant's row gives its error."""
    lines = ["| variant | rank | step | forward | backward | optimizer | other | communication per step | overlapped |",
             "|---|---|---|---|---|---|---|---|---|"]
    for v in results["variants"]:
        if v["status"] != "ok":
            lines.append(f"| {v['title']} | | {v['error']} | | | | | | |")
        for rank in v["ranks"]:
            lines.append(markdown_row(v["title"], rank))
    return lines


def markdown_row(title: str, rank: dict) -> str:
    m = rank["mean"]
    calls = "; ".join(f"{kind}: {c['calls']:g} calls, {c['ms']:.1f} ms"
                      for kind, c in m["collectives"].items())
    share = m["overlapped_ms"] / m["communication_ms"] if m["communication_ms"] else 0
    phases = " | ".join(f"{m[f'{phase}_ms']:.0f}" for phase in PHASES)
    return (f"| {title} | {rank['rank']} | {phases} | {calls} | "
            f"{m['overlapped_ms']:.1f} of {m['communication_ms']:.1f} ms ({share:.0%}) |")


NOTE = (
    "On CPUs each rank is a training thread plus gloo's threads, and the ranks share the cores. "
    "DDP issues each gradient bucket's all-reduce during backward, which can overlap the rest of "
    "backward. FSDP1 and FSDP2 on CPUs wait for each all-gather and reduce-scatter as soon as they "
    "issue it (no CUDA streams to overlap on), and gloo has no reduce-scatter: it all-reduces the "
    "whole tensor and keeps its slice. A collective's time includes waiting for the slower rank.")


def draw_timeline(variants: list, out: Path) -> Path:
    """One training step per rank, lanes for compute and communication, a panel per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(variants), 1, figsize=(16, 1.3 + 1.3 * len(variants)), sharex=True,
                             squeeze=False)
    for ax, variant in zip(axes[:, 0], variants, strict=True):
        draw_variant(ax, variant, out)
    axes[-1, 0].set_xlabel("ms from the start of the step", fontsize=12)
    kinds = {kind for v in variants for rank in v["ranks"] for kind in rank["mean"]["collectives"]}
    handles = [Patch(color=c, label=p) for p, c in PHASE_COLORS.items()] + [
        Patch(color=c, label=k.replace("_", "-")) for k, c in KIND_COLORS.items() if k in kinds]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=11, frameon=False)
    fig.text(0.5, 0.01, CAPTION, ha="center", fontsize=10, color="#444444")
    fig.tight_layout(rect=(0, 0.035, 1, 0.95))
    path = out / "timeline.png"
    fig.savefig(path, dpi=120)
    return path


CAPTION = ("compute: the training thread, solid while in an operator, pale while in the phase but "
           "not computing (waiting, Python); comm: gloo's threads running collectives")


def draw_variant(ax, variant: dict, out: Path) -> None:
    """The same optimizer step on every rank: the one whose length is the median on rank 0."""
    traces = [load_trace(out / rank["trace"]) for rank in variant["ranks"]]
    steps = [profiled_steps(events) for events in traces]
    chosen = sorted(range(len(steps[0])), key=lambda i: steps[0][i]["dur"])[len(steps[0]) // 2]
    ranks = [step_parts(events, rank_steps[chosen])
             for events, rank_steps in zip(traces, steps, strict=True)]
    origin = min(parts["start"] for parts in ranks)
    labels = []
    for r, parts in enumerate(ranks):
        compute_lane, comm_lane = 2 * r, 2 * r + 1
        labels += [f"rank {r} compute", f"rank {r} comm"]
        for phase, intervals in phase_spans(parts).items():  # pale: the phase, solid: computing
            bars(ax, intervals, origin, compute_lane, PHASE_COLORS[phase], alpha=0.25)
            bars(ax, clip(parts["compute"], intervals), origin, compute_lane, PHASE_COLORS[phase])
        for kind, color in KIND_COLORS.items():
            runs = [c["ran"] for c in parts["collectives"] if c["kind"] == kind and c["ran"]]
            bars(ax, runs, origin, comm_lane, color)
    ax.set_yticks(range(len(labels)), labels, fontsize=10)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_title(f"{variant['title']}: profiled step {chosen + 1} of {len(steps[0])}", loc="left",
                 fontsize=13)
    ax.tick_params(axis="x", labelsize=11)
    ax.grid(axis="x", alpha=0.3)


def phase_spans(parts: dict) -> dict:
    """The step's time by phase; what no phase covers is "other"."""
    spans = {phase: parts[phase] for phase in ("forward", "backward", "optimizer")}
    covered, other, cursor = sorted(i for v in spans.values() for i in v), [], parts["start"]
    for start, end in covered:
        if start > cursor:
            other.append((cursor, start))
        cursor = max(cursor, end)
    return dict(spans, other=other + ([(cursor, parts["end"])] if cursor < parts["end"] else []))


def clip(intervals: list, within: list) -> list:
    return [(max(a, s), min(b, e)) for a, b in intervals for s, e in within if a < e and s < b]


def bars(ax, intervals: list, origin: float, lane: int, color: str, alpha: float = 1.0) -> None:
    if intervals:
        ax.broken_barh([((s - origin) / 1000, (e - s) / 1000) for s, e in intervals],
                       (lane - 0.4, 0.8), color=color, alpha=alpha, linewidth=0)


if __name__ == "__main__":
    main()
