"""Every published table, rendered from its results.json into the documents that show it.

    python benchmarks/tables.py            # rewrite every generated table in the documents
    python benchmarks/tables.py --check    # exit 1, naming them, if any differs from its results.json

A document marks a table `<!-- table: NAME -->`, then the table, then `<!-- /table -->` (HTML comments: Markdown and
Marp do not show them); NAME is one of TABLES, each a function of the results.json it names. No table is typed by
hand: tests/test_tables.py renders every region again and fails when a document differs. The benchmarks' own
results.md are drawn here too.
"""
import argparse
import json
import math
import re
import subprocess
from pathlib import Path

from benchmarks import steps as registry
from benchmarks.markdown import table
from benchmarks.record import ROOT, Run, evaluation_seconds, processor_of, steady_images_per_s
from benchmarks.suite_tables import account_tables, measured_sessions, tiers_line
from benchmarks.trace_analysis import load_trace, profile_table, profiled_steps, step_parts
from common.data import TRAIN_SIZES

PUBLISHED = ROOT / "benchmarks" / "published"
STEPS = PUBLISHED / "steps" / "results.json"
RECIPE = PUBLISHED / "recipe" / "results.json"
TUNE = PUBLISHED / "tune-sweep" / "results.json"
PROFILE = PUBLISHED / "profile" / "results.json"
REHEARSAL = PUBLISHED / "rehearsal" / "results.json"
LAB_TIMES = PUBLISHED / "lab-times" / "results.json"
ACTIVATIONS = PUBLISHED / "activations" / "results.json"
RAY_START = PUBLISHED / "ray-start" / "results.json"
RAY_START_LEVERS = PUBLISHED / "ray-start-levers" / "results.json"
# Ray DDP against torchrun DDP, repeated (benchmarks/README.md, "CPU share"): each folder one steps table of the pair.
RAY_VS_TORCHRUN = PUBLISHED / "archive" / "ray-vs-torchrun-epochs"
TENSOR_PARALLEL = PUBLISHED / "tensor-parallel" / "results.json"
# The test suite's account (tests/history/account/account.py): the whole suite before the tiers, the durations the
# tiers are decided from (tests/tiers.py), and both tiers as .ci/run runs them.
SUITE_BEFORE = ROOT / "tests" / "history" / "account" / "before.json"
SUITE_DURATIONS = ROOT / "tests" / "durations.json"
SUITE_TIERS = ROOT / "tests" / "history" / "account" / "tiers.json"
SUITE_TIERS_EARLIER = ROOT / "tests" / "history" / "account" / "tiers-00e212f.json"
SUITE_TIERS_FIRST = ROOT / "tests" / "history" / "account" / "tiers-1f45e07.json"
DOCUMENTS = ["README.md", "0*/README.md", "benchmarks/README.md", "benchmarks/published/*/README.md",
             "slides/workshop.md", "slides/README.md", "TROUBLESHOOTING.md", "labs/README.md", "tests/README.md",
             "tests/history/*/README.md"]
REGION = re.compile(r"(<!-- table: ([\w-]+) -->\n)(.*?)(<!-- /table -->)", re.S)

# What each steps-section run is, for a reader: the step and the command's difference.
RUN_NAMES = {
    "single_machine": "01 `train_single_machine.py`", "ddp": "01 `torchrun ... train_ddp.py`",
    "ray_ddp_1_worker": "02 `train_ray_ddp.py --num-workers 1`", "ray_ddp": "02 `train_ray_ddp.py`",
    "ray_ddp_poll_2s": "02, Ray's default 2 s controller poll", "ray_ddp_local": "02 `--num-workers 0` (local mode)",
    "ray_ddp_local_torchrun": "02 `torchrun ... --num-workers 0`",
    "ray_ddp_data": "02 `train_ray_ddp_with_ray_data.py`", "ray_fsdp": "03 `train_ray_fsdp.py` (FSDP1)",
    "ray_fsdp2": "04 `train_ray_fsdp2.py` (FSDP2)", "ray_fsdp2_mp_offload": "04 `... --mixed-precision --cpu-offload`"}
# Each strategy's memory run of the largest preset on 2 workers (torchrun's DDP and Ray's hold the same state)
GIANT_ON_TWO = {"ddp": "memory_ddp_n2", "ray_ddp": "memory_ddp_n2", "ray_fsdp": "memory_fsdp1_n2",
                "ray_fsdp2": "memory_fsdp2_n2"}


def runs(results: dict, section: str) -> list:
    return [Run(**r) for r in results["runs"] if r["section"] == section]


def ok_runs(results: dict, section: str) -> dict:
    return {r.name: r for r in runs(results, section) if r.status == "ok"}


def why_not(run: Run) -> str:
    return f"{run.status}: {run.skipped or run.error}"


def speed(run: Run) -> str:
    return f"{steady_images_per_s(run.summary):,.0f}"


def peaks(summary: dict) -> str:
    return " / ".join(f"{m:,.0f}" for m in summary["peak_memory_mb"])


def measured(results: dict) -> list:
    return ["", f"Measured on {measured_on(results)}."]


def measured_on(results: dict) -> str:
    """Where and when, for the line under a table; per command when --update made the runs with two."""
    made = made_by_runs(results)
    if len(made) <= 1:
        return f"{results['machine']}; {results['date']}, commit {results.get('commit', '?')}"
    # a run that follows another goes without saying (recipe_seed0_exact scores recipe_seed0's checkpoint)
    leading = [[n for n in names if not any(n.startswith(f"{m}_") for m in names)] for names in made.values()]
    return f"{results['machine']}; " + "; ".join(f"{', '.join(names)}: {date}, commit {commit}"
                                                  for (_, date, commit), names in zip(made, leading, strict=True))


def made_by_runs(results: dict) -> dict:
    """(command, date, commit) -> the names of the runs it made: one entry, unless --update added runs."""
    made = {}
    for r in results.get("runs", []):
        m = r.get("made_by") or results
        made.setdefault((m["command"], m["date"], m.get("commit")), []).append(r["name"])
    return made


def epochs_trained(results: dict, summary: dict) -> str:
    """'1 epoch', or '2 epochs of 60 steps' when the benchmark cut the epochs short."""
    cut, epochs = results.get("steps_per_epoch"), summary["epochs"]
    return f"{epochs} epoch{'s' * (epochs != 1)}" + (f" of {cut} steps" if cut else "")


def state_mb(summary: dict) -> float:
    """Rank 0's parameters, gradients and optimizer state: the bytes of the tensors it holds, in MB."""
    m = summary["memory_per_rank"][0]
    return m["params_mb"] + m["grads_mb"] + m["optimizer_mb"]


def outcome(run: Run | None, trained, skipped: str, killed: str, killed_saving: str) -> str:
    """How a memory run ended, in a table's words: trained(run) if it did, killed if Ray's memory monitor did it
    while it trained, killed_saving if it did once the run's log showed the last epoch trained (a step prints its
    epoch line before it gathers and saves its checkpoint)."""
    if run is None:
        return "-"
    if run.status == "ok":
        return trained(run)
    if run.status == "skipped":
        return skipped
    if "OutOfMemory" not in (run.error or ""):
        return "failed"
    return killed_saving if trained_before_killed(run) else killed


def trained_before_killed(run: Run) -> bool:
    """Whether the run's published log shows its last epoch's line (epoch N/N |)."""
    log = STEPS.parent / "logs" / f"{run.name}.log"
    return log.exists() and re.search(r"^epoch (\d+)/\1 \|", log.read_text(errors="replace"), re.M) is not None


# --- The documents' tables ---------------------------------------------------------------------------------------
def steps_table(results: dict) -> list:
    """Every step side by side: the same model, data, global batch and epochs."""
    first = next(iter(ok_runs(results, "steps").values())).summary
    heading = [f"run ({first['model']}, {epochs_trained(results, first)}, global batch {first['global_batch_size']})",
               "processes", "test accuracy", "images/s", "launch to first step", "peak memory per rank"]
    rows = [[RUN_NAMES.get(r.name, r.name), r.workers, why_not(r), "", "", ""] if r.status != "ok" else
            [RUN_NAMES.get(r.name, r.name), r.summary["world_size"], f"{r.summary['test_accuracy']:.2%}", speed(r),
             f"{r.launch_to_first_step_s:.1f} s", f"{peaks(r.summary)} MB"] for r in runs(results, "steps")]
    return table(heading, rows) + measured(results)


def startup_rows(runs: list, label) -> list:
    """Launch to first step, phase by phase, and the whole: from the benchmark's clock (imports) and the script's own
    timestamps (summary["startup_s"]: when the launcher's part, data loading and model building ended)."""
    def phases(run):
        t = run.summary["startup_s"]
        return [run.imports_s, t["launcher"], t["data"] - t["launcher"], t["model"] - t["data"],
                run.summary["time_to_first_step_s"] - t["model"], run.launch_to_first_step_s]
    return table(["run", "imports", "launcher: process group, or Ray and its workers", "data", "model", "first step",
                  "total"], [[label(r)] + [f"{p:.1f}" for p in phases(r)] for r in runs if r.status == "ok"])


def epoch_minutes(run, cut_to_steps: int | None = None) -> str:
    """Minutes from launch to the last line of one epoch. A training run is its start-up, its first epoch and one
    epoch's evaluation as measured; an epoch cut to fewer steps is completed at the run's steady images/s."""
    if not run or not run.wall_s:
        return "-"
    if run.section not in ("steps", "tp"):
        return f"{math.ceil(run.wall_s / 60)} min"
    s = run.summary
    seconds = run.launch_to_first_step_s + s["history"][0]["epoch_time_s"] + evaluation_seconds(vars(run))
    if cut_to_steps:
        full_steps = TRAIN_SIZES[s["data"]] // s["global_batch_size"]
        seconds += (full_steps - cut_to_steps) * s["global_batch_size"] / steady_images_per_s(s)
    return f"{math.ceil(seconds / 60)} min"


def path_table(results: dict) -> list:
    """README's path through the steps, with the minutes each command took from launch to its last line."""
    runs = {**ok_runs(results, "steps"), **ok_runs(results, "tune"), **ok_runs(results, "inference")}
    cut = results.get("steps_per_epoch")

    def minutes(name):
        return epoch_minutes(runs.get(name), cut)
    # lab: the exercises of labs/README.md that check the step's lesson (step 03's sharding is lab 04's)
    rows = [
        ["[01](01-vanilla-pytorch-ddp/README.md)", "`train_single_machine.py`, then `train_ddp.py` under torchrun",
         f"{minutes('single_machine')} + {minutes('ddp')}", "the baseline, then everything plain DDP makes you write",
         "[01](labs/README.md#the-labs), [the hang clinic](labs/README.md#the-hang-clinic)"],
        ["[02](02-ray-train-ddp/README.md)", "`train_ray_ddp.py` (and a Ray Data variant)", minutes("ray_ddp"),
         "what Ray Train takes off your hands, and what it does not", "[02, 02-hang](labs/README.md#the-labs)"],
        ["[03](03-ray-train-fsdp/README.md)", "`train_ray_fsdp.py`", minutes("ray_fsdp"),
         "sharding with one argument (FSDP1)", "(04's)"],
        ["[04](04-ray-train-fsdp2/README.md)", "`train_ray_fsdp2.py`", minutes("ray_fsdp2"),
         "FSDP2 by hand: `fully_shard`, mixed precision, offload, sharded checkpoints",
         "[04, 04-accumulate](labs/README.md#the-labs)"],
        ["[05](05-ray-tune/README.md)", "`tune_ray_ddp.py`", minutes("ray_tune"),
         "Ray Tune over step 02's loop, the Train V2 way", "[05](labs/README.md#the-labs)"],
        ["[06](06-ray-data-inference/README.md)", "`batch_inference.py`", minutes("inference_2_actors"),
         "use the model: batch inference with Ray Data", "[06](labs/README.md#the-labs)"]]
    how = (f" The benchmark cut each training epoch to {cut} steps; the rest of the epoch is added at the run's "
           f"measured images/s." if cut else "")
    tp = json.loads(TENSOR_PARALLEL.read_text()) if TENSOR_PARALLEL.exists() else None
    tp_run = ok_runs(tp, "tp").get("tp_ray_tp") if tp else None
    rows.append(["[07](07-tensor-parallel/README.md)", "`train_ray_tp.py`",
                 epoch_minutes(tp_run, tp.get("steps_per_epoch")) if tp else "-",
                 "tensor parallelism: each block's matrices split across workers; activation checkpointing",
                 "[07](labs/README.md#the-labs)"])
    of_07 = (f" Step 07's from its own benchmark ({tp_run.workers} workers, evaluated on the first "
             f"{tp['eval_images']:,} test images), on {measured_on(tp)}." if tp_run else "")
    return (table(["step", "what you run", "minutes, as below", "the lesson", "lab"], rows)
            + ["", f"Minutes from launch to the last line, on {measured_on(results)}.{how}{of_07}"])


def compared() -> list:
    """The steps that are columns of the comparison table and slide (the registry: benchmarks/steps.py)."""
    return [s for s in registry.STEPS if s.by_hand]


def short_label(step: registry.Step) -> str:
    """A slide's column: the label without its step number."""
    return re.sub(r" \(\d+\)$", "", step.label)


def changed_lines(old: str, new: str) -> int:
    diff = subprocess.run(["diff", "-u", old, new], cwd=ROOT, capture_output=True, text=True).stdout
    return sum(1 for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---"))


def comparison_table(results: dict) -> list:
    """torchrun DDP, Ray DDP, Ray FSDP1 and FSDP2 side by side: every cell counted in the scripts, measured in the
    steps and memory sections, or a behaviour the tests check."""
    steps, memory = ok_runs(results, "steps"), {r.name: r for r in runs(results, "memory")}

    def row(label, cell):
        return [label] + [cell(step) for step in compared()]

    def measured_cell(value):
        return lambda step: value(steps[step.name]) if step.name in steps else "-"
    rows = [row("lines in the script", lambda step: len((ROOT / step.script).read_text().splitlines())),
            row("lines changed from the step before (`diff -u`)",
                lambda step: changed_lines(step.grows_from, step.script)),
            row("what you write by hand", lambda step: step.by_hand),
            row("fault tolerance", lambda step: step.faults),
            row("parameters + gradients + AdamW state per rank",
                measured_cell(lambda r: f"{state_mb(r.summary):,.1f} MB")),
            row("the largest preset on 2 workers", lambda step: outcome(
                memory.get(GIANT_ON_TWO.get(step.name)),
                lambda r: f"trained, {state_mb(r.summary) / 1024:,.1f} GiB per rank",
                "does not fit", "killed: out of memory",
                "trained its step, killed saving its checkpoint: out of memory")),
            row("launch to first step", measured_cell(lambda r: f"{r.launch_to_first_step_s:.1f} s")),
            row("training images/s, 2 processes", measured_cell(speed))]
    first = next(iter(steps.values())).summary if steps else {}
    trained = epochs_trained(results, first) if first else "one epoch"
    return table([""] + [s.label for s in compared()], rows) + [
        "", f"{trained.capitalize()} of `{first.get('model')}`, global batch {first.get('global_batch_size')}; the "
            f"largest preset, `giant`, for one step. Measured on {measured_on(results)}."
            + (" " + ray_start_summary(json.loads(RAY_START_LEVERS.read_text())) if RAY_START_LEVERS.exists()
               else "")]


def local_mode_table(results: dict) -> list:
    """Step 02 with Ray, and in Ray Train's local mode (one process; torchrun's), against torchrun DDP."""
    steps = ok_runs(results, "steps")
    rows = [[RUN_NAMES[name], r.summary["world_size"], f"{r.launch_to_first_step_s:.1f} s",
             f"{r.imports_s + r.summary['startup_s']['launcher']:.1f} s", speed(r)]
            for name in ("ray_ddp", "ray_ddp_local", "ray_ddp_local_torchrun", "ddp") if (r := steps.get(name))]
    return table(["run", "processes", "launch to first step", "of it, before the training function", "images/s"],
                 rows) + measured(results)


def tune_sweep(results: dict) -> list:
    best = results["best"]["trial_id"]
    rows = [[f"`{t['searched']}`" + (" (trial 0, the recipe)" if t["trial_id"].endswith("00000") else ""),
             f"**{t['best_accuracy']:.2%}**" if t["trial_id"] == best else f"{t['best_accuracy']:.2%}",
             f"{t['epochs_run']}" + (" (ASHA)" if t["stopped_early"] else "")]
            for t in sorted(results["trials"], key=lambda t: -(t["best_accuracy"] or 0))]
    return (table(["searched flags", "best validation accuracy", "epochs run"], rows)
            + ["", f"{results['cluster']}; {results['wall_time_s']:.0f} s in all."])


def rehearsal_table(results: dict) -> list:
    """The core talk's live commands against their slots (slides/rehearse.py): one row per slide."""
    by_slide = {}
    for c in results["commands"]:
        by_slide.setdefault((c["slide"], c["title"], c["slot_min"]), []).append(c)
    rows = []
    for (number, title, slot), commands in by_slide.items():
        seconds, failed = sum(c["seconds"] for c in commands), [c for c in commands if not c["ok"]]
        rows.append([f"{number}: {title}", "<br>".join(f"`{c['command']}`" for c in commands), f"{slot:g} min",
                     f"{seconds:.0f} s" + (", over its slot" if seconds > 60 * slot else "")
                     + (f", {len(failed)} failed" if failed else "")])
    before, after = results["load_average_before"], results["load_average_after"]
    return table(["slide", "what runs", "slot", "measured"], rows) + [
        "", f"Rehearsed on {results['machine']}; {results['started_utc']}, commit {results['commit']}, "
            f"{results['data']}; load average (1, 5, 15 min) {', '.join(map(str, before))} before, "
            f"{', '.join(map(str, after))} after."]


def lab_times(results: dict, labs: tuple = ()) -> list:
    """Each lab's check (only labs, if given) on its untouched starting file and on its solution."""
    checks = {}
    for r in results["runs"]:
        checks.setdefault(r["lab"], {})[r["file"]] = f"{r['seconds']:.0f} s ({r['passed'] or 'no'} checks passed)"
    busiest = max(r["load_before"] for r in results["runs"])
    return table(["lab", "`python -m labs.check LAB`, on the untouched file", "on the solution"], [
        [lab, files["untouched"], files["solution"]] for lab, files in checks.items() if lab in labs or not labs]) + [
        "", f"Wall clock with Python's start, one run each, one after the other, nothing else running (the 1-minute "
            f"load average before each, the checks before it included, at most {busiest:.2f}); measured on "
            f"{results['machine']}; {results['date']}, commit {results['commit']}."]


# --- compare_steps.py's results.md --------------------------------------------------------------------------------
def steps_results_markdown(results: dict, title: str = "Benchmark results", about: list = ()) -> str:
    """compare_steps.py's results.md: what ran where, then each section that has runs."""
    steps, memory, inference = runs(results, "steps"), runs(results, "memory"), runs(results, "inference")
    tune, recipe = ok_runs(results, "tune"), runs(results, "recipe")
    lines = [f"# {title} ({results['date']})", "", f"Machine: {results['machine']}", "", *about]
    made = made_by_runs(results)
    for (command, date, commit), names in made.items():
        lines += [f"Command: `python benchmarks/{command}` ({date}" + (f", code: commit {commit}" if commit else "")
                  + (f"; runs: {', '.join(names)})" if len(made) > 1 else ")"), ""]
    if steps:
        lines += steps_markdown(steps) + ["", TIMING_NOTE, "", "## Launch to first step, phase by phase (s)", ""]
        lines += startup_rows(steps, lambda r: r.name)
        if results.get("ray_start_s") is not None:
            lines += ["", f"Of a Ray run's launcher phase, starting a local Ray (`ray.init`, measured alone, imports "
                          f"excluded) took {results['ray_start_s']:.1f} s; the rest is Ray Train starting its "
                          f"controller and worker processes, which import torch, and setting up the process group."]
        lines += [""] + figures(steps)
    if memory:
        lines += memory_markdown(memory)
    if inference:
        lines += ["## Batch inference (step 06)", ""] + inference_table(inference) + [""]
    if tune:
        run = next(iter(tune.values()))
        lines += ["## Step 05 as in class", "", f"{len(run.summary['trials'])} trials in {run.wall_s:.0f} s from "
                  f"launch; best validation accuracy {run.summary['best']['best_accuracy']:.2%}.", ""]
    if recipe:
        lines += ["## The recipe, with the steps' defaults", ""] + recipe_table(recipe) + [""]
    if runs(results, "tp") or runs(results, "tp-giant"):
        lines += ["## Step 07: TP beside DDP and FSDP2", ""] + tensor_parallel_table(results) + [""]
    return "\n".join(lines) + "\n"


def steps_markdown(steps: list) -> list:
    """The steps section's table, with the loss and wall time that the documents' steps table leaves out."""
    ok = [r.summary for r in steps if r.status == "ok"]
    title = [f"## Steps: model {ok[0]['model']} ({ok[0]['params']:,} parameters), data {ok[0]['data']}, global batch "
             f"{ok[0]['global_batch_size']}, {ok[0]['epochs']} epoch(s)", ""] if ok else []
    rows = [[r.name, r.workers, why_not(r), "", "", "", "", ""] if r.status != "ok" else
            [r.name, r.summary["world_size"], f"{r.summary['test_accuracy']:.2%}", f"{r.summary['train_loss']:.4f}",
             speed(r), f"{r.launch_to_first_step_s:.1f}", f"{r.summary['wall_time_s']:.0f}", peaks(r.summary)]
            for r in steps]
    return title + table(["run", "processes", "test acc", "train loss", "img/s", "launch to first step (s)",
                          "wall (s)", "peak memory per rank (MB)"], rows)


def inference_table(runs: list) -> list:
    """Step 06's whole Ray Data run (actors starting, reading, classifying each image and its mirror image,
    writing Parquet), per number of actors."""
    return table(["actors", "images", "seconds", "images/s", "accuracy"], [
        [r.workers, why_not(r), "", "", ""] if r.status != "ok" else
        [r.summary["actors"], f"{r.summary['images']:,}", f"{r.summary['seconds']:.1f}",
         f"{r.summary['images_per_s']:,.0f}", f"{r.summary['accuracy']:.2%}"] for r in runs])


def recipe_table(runs: list) -> list:
    """Each seed's run: its test accuracy epoch by epoch's end, and on the exact test images if scored."""
    exact = {r.name.removesuffix("_exact"): r.summary for r in runs if r.step == "inference" and r.status == "ok"}

    def alone(name):
        e = exact.get(name)
        return f"{e['accuracy']:.2%} ({e['correct']:,} of {e['counted']:,})" if e else "-"
    return table(["run", "model", "epochs", "train loss", "test accuracy", "on the first test images alone"], [
        [r.name, why_not(r), "", "", "", ""] if r.status != "ok" else
        [r.name, r.summary["model"], r.summary["epochs"], f"{r.summary['train_loss']:.4f}",
         f"**{r.summary['test_accuracy']:.2%}**", alone(r.name)] for r in runs if r.step != "inference"])


TIMING_NOTE = (
    "img/s counts the training loop only (batches from in-memory uint8 tensors, augmentation on the device, "
    "forward, backward, optimizer step), averaged over the epochs after the first when there are several. "
    "Evaluation and checkpointing are not in img/s; they are in wall time. Launch to first step runs from "
    "the benchmark starting the command to the end of the first optimizer step: Python imports, Ray start-up, "
    "worker start, data loading and model construction included.")


def figures(steps: list) -> list:
    by_name = {r.name: r for r in steps if r.status == "ok"}
    ips = {name: steady_images_per_s(r.summary) for name, r in by_name.items()}
    lines = ["Comparisons (ratios of the runs above):", ""]
    if "ray_ddp" in by_name and "ddp" in by_name:
        ray, ddp = by_name["ray_ddp"], by_name["ddp"]
        lines.append(f"- Ray overhead: Ray DDP / torchrun DDP throughput = {ips['ray_ddp'] / ips['ddp']:.3f} "
                     f"({ray.workers} workers each); launch to first step {ray.launch_to_first_step_s:.1f} s "
                     f"with Ray vs {ddp.launch_to_first_step_s:.1f} s with torchrun.")
    for one, many in [("single_machine", "ddp"), ("ray_ddp_1_worker", "ray_ddp")]:
        if one in by_name and many in by_name:
            lines.append(f"- Scaling: {many} with {by_name[many].workers} processes / {one} with 1 = "
                         f"{ips[many] / ips[one]:.2f}x throughput.")
    if "ray_ddp" in by_name and "ray_ddp_poll_2s" in by_name:
        fast, slow = by_name["ray_ddp"].summary, by_name["ray_ddp_poll_2s"].summary
        lines.append(f"- Controller poll every 0.2 s (the steps' default) vs Ray's default 2 s: "
                     f"{ips['ray_ddp']:,.0f} vs {ips['ray_ddp_poll_2s']:,.0f} img/s, "
                     f"wall time {fast['wall_time_s']:.0f} vs {slow['wall_time_s']:.0f} s.")
    if "ray_fsdp" in by_name and "ray_fsdp2" in by_name:
        one, two = by_name["ray_fsdp"].summary, by_name["ray_fsdp2"].summary
        lines.append(f"- FSDP1 (step 03) vs FSDP2 (step 04), same run settings: {ips['ray_fsdp']:,.0f} vs "
                     f"{ips['ray_fsdp2']:,.0f} img/s; state on rank 0 {state_mb(one):,.2f} vs {state_mb(two):,.2f} MB; "
                     f"peak memory per rank {max(one['peak_memory_mb']):,.0f} vs {max(two['peak_memory_mb']):,.0f} MB; "
                     f"test accuracy {one['test_accuracy']:.2%} vs {two['test_accuracy']:.2%}.")
    if "ray_ddp" in by_name:
        s = by_name["ray_ddp"].summary
        n, grads = s["world_size"], s["memory_per_rank"][0]["grads_mb"]
        lines.append(f"- Communication: DDP all-reduces {grads:,.1f} MB of gradients per step; a ring all-reduce "
                     f"sends and receives 2(N-1)/N of that per rank, {2 * (n - 1) / n * grads:,.1f} MB at N={n}, "
                     f"against {1000 * s['global_batch_size'] / ips['ray_ddp']:,.0f} ms of compute per step here. "
                     f"Per step, this volume stays the same as N grows (it tends to 2x the gradients) while each "
                     f"rank's compute shrinks as 1/N of the global batch: the network, not the processors, sets the "
                     f"limit to scaling.")
    return lines + [""] if len(lines) > 2 else []  # no heading over an empty list (a single run compares nothing)


STRATEGIES = {"ray_ddp": "DDP (step 02)", "ray_fsdp": "FSDP1 (step 03)", "ray_fsdp2": "FSDP2 (step 04)",
              "ray_tp": "TP (step 07)"}


def tensor_parallel_table(results: dict) -> list:
    """Step 07 beside DDP and FSDP2 on the same workers: the steps' settings (images/s, state and peak per rank),
    then one step of the largest preset (state and peak per rank, or why it did not run)."""
    def per_rank(r):
        m = r.summary["memory_per_rank"]
        return " / ".join(f"{x['params_mb'] + x['grads_mb'] + x['optimizer_mb']:,.1f}" for x in m)

    def giant(r):
        if r.status != "ok":
            return ["does not fit (below)" if r.status == "skipped" else why_not(r), ""]
        m = r.summary["memory_per_rank"]
        return [" / ".join(f"{(x['params_mb'] + x['grads_mb'] + x['optimizer_mb']) / 1024:,.2f}" for x in m),
                " / ".join(f"{p / 1024:,.1f}" for p in r.summary["peak_memory_mb"])]
    small = {r.step: r for r in runs(results, "tp") if r.status == "ok"}
    large = {r.step: r for r in runs(results, "tp-giant")}
    rows = [[STRATEGIES[step], f"{steady_images_per_s(small[step].summary):,.0f}" if step in small else "-",
             per_rank(small[step]) if step in small else "-",
             peaks(small[step].summary) if step in small else "-", *(giant(large[step]) if step in large else
                                                                     ["-", ""])] for step in STRATEGIES if
            step in small or step in large]
    first = next(iter(small.values())).summary
    big = next((r.summary for r in large.values() if r.status == "ok"), {})
    return table(["strategy", "images/s", "state per rank (MB)", "peak per rank (MB)",
                  f"`{big.get('model', 'giant')}`, one step: state per rank (GiB)", "peak per rank (GiB)"], rows) + [
        "", f"{results['runs'][0]['workers']} Ray workers on CPUs; `{first['model']}`, global batch "
            f"{first['global_batch_size']}, {epochs_trained(results, first)}; `{big.get('model', 'giant')}` one step "
            f"of {big.get('global_batch_size', '?')} images. State: parameters, gradients and AdamW state, the "
            "bytes of the tensors each rank holds; peak: the process's peak resident memory. "
            + "".join(f"{STRATEGIES[r.step]} on `giant` {r.skipped}. " for r in large.values() if r.skipped)
            + f"Measured on {measured_on(results)}."]


def memory_markdown(memory: list) -> list:
    ok = [r.summary for r in memory if r.status == "ok"]
    return (["## Memory per rank: " + (f"model {ok[0]['model']} ({ok[0]['params']:,} parameters)" if ok else ""), "",
             "Parameters, gradients and optimizer state are exact: the bytes of the tensors each rank holds (its "
             "shard under FSDP2). Peak is the process's peak resident memory on CPU, or peak allocated GPU memory. "
             f"One training step with a global batch of {ok[0]['global_batch_size'] if ok else '?'} images, "
             "synthetic data.", ""] + memory_rows(memory)
            + ["", "Rank 0 is shown; the other ranks' shards differ by at most one row of each parameter."])


def memory_rows(memory: list) -> list:
    def row(r):
        strategy = STRATEGIES[r.step]
        known = [strategy, r.workers, "yes" if "--cpu-offload" in r.flags else "no"]
        if r.status != "ok":
            return known + [why_not(r), "", "", "", ""]
        m = r.summary["memory_per_rank"][0]
        return known + [f"{m['params_mb']:,.0f}", f"{m['grads_mb']:,.0f}", f"{m['optimizer_mb']:,.0f}",
                        f"{state_mb(r.summary) / 1024:,.2f}", f"{max(r.summary['peak_memory_mb']) / 1024:,.1f}"]
    return table(["strategy", "workers", "CPU offload", "parameters (MB)", "gradients (MB)", "optimizer (MB)",
                  "total state (GiB)", "peak (GiB)"], [row(r) for r in memory])


def device_run_markdown(results: dict) -> str:
    """device_run.py's results.md: compare_steps' sections for the runs on the GPU, then DDP's scaling on the CPUs."""
    dry = " A dry run: tiny sizes, on CPU, two runs run." if results["dry_run"] else ""
    return steps_results_markdown(results, f"Every step on a GPU, and DDP on {results['cpu_count']} CPU cores", [
        f"GPU driver {results['driver']}, CUDA {results['cuda']} (torch's); {results['elapsed_s']:.0f} s of a "
        f"{results['budget_s']:.0f} s budget.{dry}", ""]) + "\n".join(
        [f"## torchrun DDP and Ray DDP on the CPUs, {results['threads_per_process']} threads per process", ""]
        + cpu_scaling_table(results)) + "\n"


def cpu_scaling_table(results: dict) -> list:
    """torchrun DDP and Ray DDP at each number of processes: images/s, Ray's over torchrun's, and start-up."""
    scaling = {r.name: r for r in runs(results, "scaling")}
    rows = []
    for n in sorted({r.workers for r in scaling.values()}):
        torchrun, ray = scaling[f"cpu_torchrun_ddp_n{n}"], scaling[f"cpu_ray_ddp_n{n}"]
        both = torchrun.status == ray.status == "ok"
        rows.append([n, n * results["threads_per_process"],
                     *(speed(r) if r.status == "ok" else why_not(r) for r in (torchrun, ray)),
                     f"{steady_images_per_s(ray.summary) / steady_images_per_s(torchrun.summary):.2f}" if both else "-",
                     ", ".join(f"{r.launch_to_first_step_s:.1f} s" if r.status == "ok" else "-"
                               for r in (torchrun, ray))])
    return table(["processes", "threads", "torchrun DDP images/s", "Ray DDP images/s", "Ray / torchrun",
                  "launch to first step: torchrun, Ray"], rows) + [
        "", f"Model {results['model']}, global batch {results['global_batch_size']}, {results['epochs']} epochs of "
            f"{results['cpu_steps_per_epoch']} steps; images/s is the mean of the epochs after the first. The GPU "
            f"hidden (CUDA_VISIBLE_DEVICES=''), OMP_NUM_THREADS={results['threads_per_process']} in every process."]


# --- profile_steps.py's results.md and timeline.png --------------------------------------------------------------
PHASE_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer": "#55a868", "other": "#b0b0b0"}
KIND_COLORS = {"all_reduce": "#c44e52", "all_gather": "#8172b3", "reduce_scatter": "#937860", "broadcast": "#da8bc3"}


def write_profile_report(results: dict, out: Path) -> Path | None:
    """profile_steps.py's results.md and timeline.png in out, from its results.json and the traces beside it; returns
    the timeline, None when no variant ran."""
    (out / "results.md").write_text(profile_results_markdown(results))
    ran = [v for v in results["variants"] if v["status"] == "ok"]
    return draw_timeline(ran, out) if ran else None


def profile_results_markdown(results: dict) -> str:
    lines = [f"# Profiled training steps ({results['date']})", "",
             f"Machine: {results['machine']}", "",
             f"Command: `python benchmarks/{results['command']}` (code: commit {results['commit']})", "",
             "Load average when each run started (other work on the machine slows it): " +
             ", ".join(f"{v['name']} {v['load_average']:.1f}" for v in results["variants"]), "",
             f"Milliseconds per optimizer step: the mean of {results['profile_steps']} steps after "
             f"{results['warmup_steps']} warm-up steps. Communication: each collective's calls per step "
             "and their milliseconds in all, as gloo's threads ran them (waits for the other rank included). "
             "Overlapped: the communication time during which the training thread computed.", ""]
    return "\n".join(lines + profile_table(results) + [
        "", "On CPUs each rank is a training thread plus gloo's threads, and the ranks share the cores. DDP issues "
            "each gradient bucket's all-reduce during backward, which can overlap the rest of backward. FSDP1 and "
            "FSDP2 on CPUs wait for each all-gather and reduce-scatter as soon as they issue it (no CUDA streams to "
            "overlap on), and gloo has no reduce-scatter: it all-reduces the whole tensor and keeps its slice. A "
            "collective's time includes waiting for the slower rank."]) + "\n"


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
    fig.text(0.5, 0.01, "compute: the training thread, solid while in an operator, pale while in the phase but not "
             "computing (waiting, Python); comm: gloo's threads running collectives", ha="center", fontsize=10,
             color="#444444")
    fig.tight_layout(rect=(0, 0.035, 1, 0.95))
    fig.savefig(out / "timeline.png", dpi=120)
    return out / "timeline.png"


def draw_variant(ax, variant: dict, out: Path) -> None:
    """The same optimizer step on every rank: the one whose length is the median on rank 0."""
    traces = [load_trace(out / rank["trace"]) for rank in variant["ranks"]]
    steps = [profiled_steps(events) for events in traces]
    chosen = sorted(range(len(steps[0])), key=lambda i: steps[0][i]["dur"])[len(steps[0]) // 2]
    ranks = [step_parts(events, rank_steps[chosen]) for events, rank_steps in zip(traces, steps, strict=True)]
    origin = min(parts["start"] for parts in ranks)
    labels = []
    for r, parts in enumerate(ranks):
        compute_lane, comm_lane = 2 * r, 2 * r + 1
        labels += [f"rank {r} compute", f"rank {r} comm"]
        for phase, intervals in phase_spans(parts).items():  # pale: the phase, solid: computing
            bars(ax, intervals, origin, compute_lane, PHASE_COLORS[phase], alpha=0.25)
            bars(ax, clip(parts["compute"], intervals), origin, compute_lane, PHASE_COLORS[phase])
        for kind, color in KIND_COLORS.items():
            bars(ax, [c["ran"] for c in parts["collectives"] if c["kind"] == kind and c["ran"]], origin, comm_lane,
                 color)
    ax.set_yticks(range(len(labels)), labels, fontsize=10)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_title(f"{variant['title']}: profiled step {chosen + 1} of {len(steps[0])}", loc="left", fontsize=13)
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


def cpu_share_markdown(report: dict) -> str:
    training, others = report["training_processes"], report["other_processes"]
    lines = [f"`{report['command']}`", "", f"Machine: {report['machine']}", "",
             f"{report['window_s']:.0f} s window, {report['cpus']} cores; the machine was busy "
             f"{report['machine_busy_cores']:.3f} cores on average; rank 0 made {report['steps_per_s']:.3f} optimizer "
             f"steps per second.", ""]
    threads = [", ".join(f"{t} {c:.3f}" for t, c in p["threads"].items()) for p in training]
    lines += table(["process", "cores", "its threads (cores)"], [
        [f"{p['pid']} `{p['name'][:60]}`", f"{p['cores']:.3f}", its] for p, its in zip(training, threads, strict=True)]
        + [[f"every other process ({len(others)} over 0.002)", f"{sum(p['cores'] for p in others):.3f}", ""]])
    lines += [""] + table(["training process", "its training thread (cores)", "the kernel took its core (per s)",
                           "it gave its core up (per s)"], [
        [p["pid"], f"{t['cores']:.3f}", f"{t['involuntary_switches_per_s']:.1f}",
         f"{t['voluntary_switches_per_s']:.1f}"] for p in training for t in [p["training_thread"]]])
    lines += [""] + table(["other process", "cores"], [[f"{p['pid']} `{p['name'][:80]}`", f"{p['cores']:.3f}"]
                                                       for p in others[:12]])
    return "\n".join(lines) + "\n"


# --- Slide-sized tables (slides/workshop.md): few columns, short names, one line under each. ---------------------
SLIDE_RUN_NAMES = {
    "single_machine": "01 one process", "ddp": "01 torchrun DDP", "ray_ddp_1_worker": "02 Ray DDP, 1 worker",
    "ray_ddp": "02 Ray DDP", "ray_ddp_poll_2s": "02 Ray DDP, 2 s poll", "ray_ddp_local": "02 local mode",
    "ray_ddp_local_torchrun": "02 local, torchrun", "ray_ddp_data": "02 Ray Data", "ray_fsdp": "03 FSDP1",
    "ray_fsdp2": "04 FSDP2", "ray_fsdp2_mp_offload": "04 bf16 + offload"}
SLIDE_CORE_RUNS = ["single_machine", "ddp", "ray_ddp", "ray_fsdp", "ray_fsdp2"]
SLIDE_VARIANT_RUNS = ["ray_ddp_1_worker", "ray_ddp_local", "ray_ddp_local_torchrun", "ray_ddp_data",
                      "ray_fsdp2_mp_offload"]  # five rows and a line under them fill a slide


def slide_measured_on(results: dict) -> str:
    """When and where, short enough for a line under a slide's table: the date (first, so that a line never breaks
    inside it), then the processor's name without its family and model, the cores, RAM and GPUs."""
    machine = re.sub(r" \(family [^)]*\)", "", results["machine"].split("; torch")[0])
    return f"{results['date']}, {machine}"


def steps_slide(results: dict, names: list) -> list:
    """The steps table of the slides, for the runs named: the main path, or its variants."""
    by_name = {r.name: r for r in runs(results, "steps")}
    # "first step at": seconds from launch to the end of the first optimizer step (the steps table's "launch to
    # first step"), a short heading that keeps five columns on a slide
    rows = [[SLIDE_RUN_NAMES[r.name], r.workers, r.status, "", ""] if r.status != "ok" else
            [SLIDE_RUN_NAMES[r.name], r.summary["world_size"], f"{r.summary['test_accuracy']:.2%}", speed(r),
             f"{r.launch_to_first_step_s:.1f} s"] for r in (by_name[n] for n in names if n in by_name)]
    first = next(iter(ok_runs(results, "steps").values()), None)
    what = (f"`{first.summary['model']}`, {epochs_trained(results, first.summary)}, global batch "
            f"{first.summary['global_batch_size']}") if first else "the steps"
    if "--data-dir" in results["command"]:  # the machine's offline copy: benchmarks/README.md, "The recipe"
        what += "; test images partly JPEG-rebuilt"
    return table(["run", "processes", "test accuracy", "images/s", "first step at"], rows) + [
        "", f"{slide_measured_on(results)}: {what}"]


def steps_findings_slide(results: dict) -> list:
    """What the steps table says, as bullets: every number computed from the same runs."""
    steps = ok_runs(results, "steps")
    ips = {name: steady_images_per_s(r.summary) for name, r in steps.items()}
    lines = []
    if same := [n for n in ("ddp", "ray_ddp", "ray_fsdp", "ray_fsdp2") if n in steps]:
        accuracies = sorted({f"{steps[n].summary['test_accuracy']:.2%}" for n in same})
        lines.append(f"- Same training, same result: the 2-process fp32 runs end at {' / '.join(accuracies)}")
    if "ddp" in ips and "ray_ddp" in ips:
        # One run a row, and images/s varies by several percent between runs: the range of the repeats beside it
        repeats = ray_vs_torchrun_runs()
        low, high = ray_vs_torchrun_range(repeats)
        lines.append(f"- Ray DDP trains at {ips['ray_ddp'] / ips['ddp']:.2f} of torchrun DDP's images/s in this run, "
                     f"{low:.3f} to {high:.3f} in {len(repeats)} repeats {repeats_machine(repeats, results)}")
    if "single_machine" in ips and "ddp" in ips:
        # Like for like: both use the 2 cores (one process with 2 threads, two with one each). Ray's 1-worker run is
        # no baseline: Ray gives a worker one CPU and one thread, so its gain to 2 workers is mostly threads.
        lines.append(f"- 1 process to 2, each run on both cores: {ips['ddp'] / ips['single_machine']:.2f}x the "
                     f"images/s (one process, then torchrun DDP)")
    if starts := [(label, steps[n].launch_to_first_step_s) for n, label in
                  [("ddp", "torchrun"), ("ray_ddp", "Ray"), ("ray_ddp_local", "local mode")] if n in steps]:
        lines.append(f"- Launch to first step, `{next(iter(steps.values())).summary['model']}`, one run each: "
                     + ", ".join(f"{label} {s:.1f} s" for label, s in starts))
    if not lines:
        return ["Not measured yet."]
    return lines + ["", f"{slide_measured_on(results)}: the runs of the steps table"]


def ray_vs_torchrun_runs() -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(RAY_VS_TORCHRUN.glob("*/results.json"))]


def ray_vs_torchrun_range(repeats: list[dict]) -> tuple[float, float]:
    """The lowest and highest Ray DDP / torchrun DDP images/s of the archived repeats."""
    ratios = [steady_images_per_s(steps["ray_ddp"].summary) / steady_images_per_s(steps["ddp"].summary)
              for steps in (ok_runs(results, "steps") for results in repeats)]
    return min(ratios), max(ratios)


def repeats_machine(repeats: list[dict], results: dict) -> str:
    """Where and when the archived repeats ran, beside the table they repeat (results): its processor, or theirs."""
    machines = sorted({processor_of(repeat["machine"]) for repeat in repeats})
    where = "the same processor" if machines == [processor_of(results["machine"])] else " / ".join(machines)
    return f"on {where}, {repeats[0]['date']}"


def memory_slide(results: dict) -> list:
    """The memory lesson on a slide: DDP, FSDP1 and FSDP2 on 1, 2 and 4 workers, state per rank and outcome."""
    memory = {r.name: r for r in runs(results, "memory")}
    full = memory.get("memory_ddp_n1")
    rows = []
    for n in sorted({r.workers for r in memory.values()}):
        # One worker: FSDP2 holds what DDP does (its row is in the full table).
        for strategy in ["DDP"] + ["FSDP1", "FSDP2"] * (n > 1):
            if (r := memory.get(f"memory_{strategy.lower()}_n{n}")) is None:
                continue
            # DDP holds everything on every rank: a DDP run that did not fit would have held the 1-worker run's state
            state = r if r.status == "ok" else full if strategy == "DDP" and full and full.status == "ok" else None
            need = re.search(r"([\d.]+ GiB) > 90% of ([\d.]+) GiB", r.skipped or "")
            rows.append([strategy, n, f"{state_mb(state.summary) / 1024:.2f} GiB" if state else "-", outcome(
                r, lambda r: f"trained, peak {max(r.summary['peak_memory_mb']) / 1024:.1f} GiB",
                f"not started: {need[1]} > {need[2]} GiB" if need else "not started", "killed by Ray: out of memory",
                "trained; killed saving")])
    ok = [r for r in memory.values() if r.status == "ok"]
    what = f"`{ok[0].summary['model']}`, one step each" if ok else "the largest preset"
    return table(["strategy", "workers", "state per rank", "outcome"], rows) + [
        "", f"{slide_measured_on(results)}: {what}"]


def comparison_slide(results: dict) -> list:
    """"Which one when", measured: the four strategies side by side, in cells short enough for a slide."""
    steps, memory = ok_runs(results, "steps"), {r.name: r for r in runs(results, "memory")}
    ips = {s.name: steady_images_per_s(steps[s.name].summary) for s in compared() if s.name in steps}

    def row(label, cell):
        return [label] + [cell(s.name) for s in compared()]
    rows = [row("images/s, 2 ranks", lambda n: f"{ips[n]:,.0f}" if n in ips else "-"),
            row("of torchrun's", lambda n: f"{ips[n] / ips['ddp']:.2f}" if n in ips and "ddp" in ips else "-"),
            row("first step", lambda n: f"{steps[n].launch_to_first_step_s:.1f} s" if n in steps else "-"),
            row("`giant`, 2 ranks", lambda n: outcome(memory.get(GIANT_ON_TWO.get(n)),
                                                      lambda r: f"{state_mb(r.summary) / 1024:.1f} GiB each",
                                                      "does not fit", "killed", "killed saving")),
            # Both restart every rank: torchrun --max-restarts leaves finding the checkpoint to the script, Ray Train
            # hands the last reported one to the new workers (ray.train.get_checkpoint()).
            row("a crash", lambda n: "you resume" if n == "ddp" else "Ray resumes")]
    first = next(iter(steps.values())).summary if steps else {}
    return table([""] + [short_label(s) for s in compared()], rows) + [
        "", f"{slide_measured_on(results)}: `{first.get('model')}`"]


def diffs_slide(results: dict) -> list:
    """The designed diffs and their size, counted in the scripts now (the results are not read)."""
    return table(["the lesson", "lines changed"], [
        [s.lesson, changed_lines(s.grows_from, s.script)
         if (ROOT / s.grows_from).is_file() and (ROOT / s.script).is_file() else "not written yet"]
        for s in registry.STEPS if s.grows_from])


def activations_table(results: dict) -> list:
    """benchmarks/activations.py: each way's peak, what the peak holds by kind, and its time per step."""
    base = results["ways"][0]
    kinds = [k for k in base["at_peak_bytes"] if any(w["at_peak_bytes"][k] for w in results["ways"])]
    rows = [[w["way"], f"{w['peak_bytes'] / 2**20:,.1f}", *(f"{w['at_peak_bytes'][k] / 2**20:,.1f}" for k in kinds),
             f"{w['step_s']:.2f}", f"{w['step_s'] / base['step_s']:.2f}",
             f"{w['weights_max_difference_from_as_is']:.1e}"] for w in results["ways"]]
    return table(["way", "peak (MiB)", *(f"{k} at peak" for k in kinds), "s per step", f"of {base['way']}",
                  "weights after 2 steps, largest difference"], rows) + [
        "", f"`{results['model']}`, {results['images']} images (one rank's share of the global batch 128 on 2 ranks), "
            f"one AdamW step; the median of {results['steps']} steps. Measured on {measured_on(results)}."]


def activations_slide(results: dict) -> list:
    """The activations lesson on a slide: each way's peak and time per step, against the step as it is."""
    base = results["ways"][0]
    rows = [[w["way"], f"{w['peak_bytes'] / 2**20:,.0f} MiB", f"{w['at_peak_bytes']['activations'] / 2**20:,.0f} MiB",
             f"{w['step_s'] / base['step_s']:.2f}x"] for w in results["ways"]]
    return table(["one rank's step", "peak", "activations at peak", "time"], rows) + [
        "", f"{slide_measured_on(results)}: `{results['model']}`, {results['images']} images a rank"]


def ray_start_table(results: dict) -> list:
    """benchmarks/ray_start.py: each run's launch to first step, when each phase ended, and the CPU it took."""
    torchrun = results["runs"][0]["launch_to_first_step_s"]
    rows = [[r["name"], f"{r['launch_to_first_step_s']:.1f}", f"{r['launch_to_first_step_s'] / torchrun:.1f}x",
             *(f"{r['phases_s'][phase]:.1f}" for phase in ("imports", "launcher", "data", "model")),
             f"{r['machine_busy_core_s']:.1f}",
             f"{r['machine_busy_core_s'] / (results['cores'] * r['launch_to_first_step_s']):.0%}",
             len(r["processes"])] for r in results["runs"]]
    return table(["run", "launch to first step", "of torchrun's", "the driver's imports done", "train() starts",
                  "data ready", "model ready", "CPU s used by then", "of the cores' time",
                  "processes that used CPU"], rows) + [
        "", f"Seconds from launch. {results['cores']} cores; `{results['setting']}`, 2 processes. Measured on "
            f"{measured_on(results)}."]


RAY_FRESH, RAY_WARM = "Ray, fresh", "Ray, running cluster (2nd run)"  # ray_start.py's runs that the documents quote


def median_first_steps(results: dict) -> dict:
    """ray_start.py --levers: each variant's median launch to first step, by name."""
    return {lever["name"]: lever["median_first_step_s"] for lever in results["levers"]}


RAY_START_STAGES = [  # (what runs, whose it is): each stage ends where the next begins, the last at the first step
    ("the driver imports the step's modules (Ray Train, torch, torchvision)", "the step"),
    ("Ray starts (a fresh run: GCS, raylet, dashboard, agents), then the controller's process", "Ray"),
    ("the controller imports Ray Train and torch, starts its helpers, then the workers' processes", "Ray Train"),
    ("the workers import Ray and take their roles", "Ray Train"),
    ("the workers import the step's modules, join the process group (a dataset manager starts beside them)",
     "the step, and Ray Train"),
    ("the step: data, model, first step", "the step"),
]


def ray_start_stage_ends(run: dict) -> list:
    """When each of RAY_START_STAGES ended, in seconds from launch, read from the run's phases and processes."""
    def moments(role, key):
        return [p[key] for p in run["processes"] if p["role"] == role and p[key] is not None]
    return [run["phases_s"]["imports"], min(moments("TrainController", "appeared_s")),
            min(moments("RayTrainWorker", "appeared_s")), max(moments("RayTrainWorker", "role_s")),
            run["phases_s"]["launcher"], run["launch_to_first_step_s"]]


def ray_start_timeline(results: dict) -> list:
    """Step 02's start, stage by stage, fresh and on a running cluster: each second named, and whose it is."""
    runs = {r["name"]: r for r in results["runs"]}
    names = [RAY_FRESH, RAY_WARM]
    ends = {name: ray_start_stage_ends(runs[name]) for name in names}
    rows = [[stage, whose, *(f"{ends[n][i] - (ends[n][i - 1] if i else 0):.1f}" for n in names)]
            for i, (stage, whose) in enumerate(RAY_START_STAGES)]
    rows.append(["launch to first step", "", *(f"{ends[n][-1]:.1f}" for n in names)])
    return table(["stage", "whose", "fresh (s)", "running cluster (s)"], rows) + [
        "", f"Read from the runs above: the step's phases and when each process appeared or took its role. Measured "
            f"on {measured_on(results)}."]


def ray_start_processes(results: dict, run_name: str) -> list:
    """One run's processes: when each appeared (- : it ran before the launch), when a Ray worker took its role, and
    its CPU seconds until the first step; for the fresh run, the imports of one process of each role."""
    run = next(r for r in results["runs"] if r["name"] == run_name)
    imports = run.get("imports", {})
    packages = [p for p in ("ray.train", "ray.data", "pandas", "torch", "torchvision")
                if any(p in seconds for seconds in imports.values())]

    def at(seconds):
        return "-" if seconds is None else f"{seconds:.1f}"
    rows = [[p["role"], at(p["appeared_s"]), at(p["role_s"]), f"{p['cpu_s']:.2f}",
             *(f"{imports[p['role']][package]:.2f}" if package in imports.get(p["role"], {}) else ""
               for package in packages)]
            for p in run["processes"]]
    return table(["process", "appeared", "took its role", "CPU s until the first step",
                  *(f"imports `{p}`" for p in packages)], rows) + [
        "", f"{run['name']}: launch to first step {run['launch_to_first_step_s']:.1f} s, seconds from launch. "
            + ("Imports: seconds each package took to import in one process of each role (itself and what it "
               "imported first; blank: imported before the log began, or not at all), from a second run with "
               "Python's import timing on, which slows them. " if imports else "")
            + f"Measured on {measured_on(results)}."]


def ray_start_levers(results: dict) -> list:
    """ray_start.py --levers: each lever's launch to first step and first step to the end, medians and ranges."""
    torchrun = results["levers"][0]["median_first_step_s"]

    def spread(lever, key):
        values = [run[key] for run in lever["runs"]]
        return f"{min(values):.1f}-{max(values):.1f}"
    rows = [[lever["name"], lever["what"], f"{lever['median_first_step_s']:.1f}", spread(lever, "first_step_s"),
             f"{lever['median_first_step_s'] / torchrun:.1f}x", f"{lever['median_end_s']:.1f}",
             spread(lever, "end_s")] for lever in results["levers"]]
    return table(["run", "what differs", "launch to first step", "range", "of torchrun's", "first step to the end",
                  "range"], rows) + [
        "", f"Seconds: medians of {results['rounds']} rounds, each run once a round in this order, the running "
            f"cluster up throughout; `{results['setting']}`, 2 processes. Measured on {measured_on(results)}."]


def ray_start_summary(results: dict) -> str:
    """The comparison's last words: ray_start.py --levers' medians of torchrun and Ray, and where to read them."""
    medians = median_first_steps(results)
    return (f"Launch to first step, `tiny`, medians of {results['rounds']} alternated runs of "
            f"benchmarks/ray_start.py --levers: torchrun {medians['torchrun']:.1f} s, "
            f"Ray {medians['Ray, fresh']:.1f} s starting its own Ray (as the steps do), "
            f"{medians['Ray, running cluster']:.1f} s on a running cluster; "
            f"each second, process by process: [Ray's start](benchmarks/README.md#rays-start-process-by-process). "
            f"Measured on {measured_on(results)}.")


def ray_start_slide(results: dict) -> list:
    """Why Ray starts slowly, as a bullet: fresh and on a running cluster, against torchrun (medians, --levers)."""
    medians = median_first_steps(results)
    return [f"- Slow start: first step at {medians['Ray, fresh']:.1f} s, {medians['Ray, running cluster']:.1f} s "
            f"on a running cluster (torchrun {medians['torchrun']:.1f} s): Ray Train's processes, per run", "",
            f"{slide_measured_on(results)}: `tiny`, medians of {results['rounds']}"]


TABLES = {
    "path": (STEPS, path_table),
    "comparison": (STEPS, comparison_table),
    "steps": (STEPS, steps_table),
    "local-mode": (STEPS, local_mode_table),
    "startup": (STEPS, lambda results: startup_rows(ok_runs(results, "steps").values(), lambda r: RUN_NAMES.get(
        r.name, r.name)) + ["", f"Seconds. Measured on {measured_on(results)}."]),
    "memory": (STEPS, lambda results: memory_rows(runs(results, "memory")) + measured(results)),
    "inference": (STEPS, lambda results: inference_table(runs(results, "inference")) + measured(results)),
    "recipe": (RECIPE, lambda results: recipe_table(runs(results, "recipe")) + measured(results)),
    "profile": (PROFILE, lambda results: profile_table(results) + [
        "", f"Milliseconds per optimizer step, the mean of {results['profile_steps']} profiled steps; measured on "
            f"{measured_on(results)}."]),
    "tune-sweep": (TUNE, tune_sweep),
    "steps-slide": (STEPS, lambda results: steps_slide(results, SLIDE_CORE_RUNS)),
    "steps-variants-slide": (STEPS, lambda results: steps_slide(results, SLIDE_VARIANT_RUNS)),
    "steps-findings-slide": (STEPS, steps_findings_slide),
    "memory-slide": (STEPS, memory_slide),
    "diffs-slide": (STEPS, diffs_slide),
    "ray-start-slide": (RAY_START_LEVERS, ray_start_slide),
    "comparison-slide": (STEPS, comparison_slide),
    "rehearsal": (REHEARSAL, rehearsal_table),
    "lab-times": (LAB_TIMES, lab_times),
    "tensor-parallel": (TENSOR_PARALLEL, tensor_parallel_table),
    "activations": (ACTIVATIONS, activations_table),
    "activations-slide": (ACTIVATIONS, activations_slide),
    "ray-start": (RAY_START, ray_start_table),
    "ray-start-timeline": (RAY_START, ray_start_timeline),
    "ray-start-fresh": (RAY_START, lambda results: ray_start_processes(results, RAY_FRESH)),
    "ray-start-running": (RAY_START, lambda results: ray_start_processes(results, RAY_WARM)),
    "ray-start-levers": (RAY_START_LEVERS, ray_start_levers),
    "suite-before": (SUITE_BEFORE, account_tables),
    "suite-before-sessions": (SUITE_BEFORE, measured_sessions),
    "suite-durations": (SUITE_DURATIONS, account_tables),
    "suite-tiers-account": (SUITE_TIERS, account_tables),
    "suite-tiers-sessions": (SUITE_TIERS, measured_sessions),
    "suite-tiers": (SUITE_TIERS, lambda results: tiers_line(results, json.loads(SUITE_TIERS_EARLIER.read_text()))),
    "suite-tiers-earlier-account": (SUITE_TIERS_EARLIER, account_tables),
    "suite-tiers-first-account": (SUITE_TIERS_FIRST, account_tables),
    **{f"lab-times-{step}": (LAB_TIMES, lambda results, labs=labs: lab_times(results, labs)) for step, labs in [
        ("01", ("01", "hang-rank0", "hang-uneven", "hang-shape")), ("02", ("02", "02-hang")),
        ("04", ("04", "04-accumulate")), ("05", ("05",)), ("06", ("06",)), ("07", ("07",))]},
}


def render(name: str) -> str:
    """The table, or, until its results.json is published, a line that says so."""
    path, table = TABLES[name]
    if not path.exists():
        where = ("tests/history/account/README.md" if path.is_relative_to(ROOT / "tests")
                 else "benchmarks/README.md, section Maintainers")
        return f"Not measured on today's code yet: `{path.relative_to(ROOT)}` is made by a command in {where}.\n"
    return "\n".join(table(json.loads(path.read_text()))) + "\n"


def documents() -> list:
    return sorted({p for pattern in DOCUMENTS for p in ROOT.glob(pattern)})


def rewritten(text: str) -> str:
    def fill(match):
        opening, name, _, closing = match.groups()
        if name not in TABLES:
            raise SystemExit(f"error: no table named {name!r}; names: {', '.join(TABLES)}")
        return opening + render(name) + closing
    return REGION.sub(fill, text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a document differs")
    check = parser.parse_args().check
    stale = [path for path in documents() if rewritten(path.read_text()) != path.read_text()]
    names = ", ".join(str(path.relative_to(ROOT)) for path in stale)
    if check and stale:
        raise SystemExit(f"error: tables differ from their results.json in {names}; run python benchmarks/tables.py")
    for path in [] if check else stale:
        path.write_text(rewritten(path.read_text()))
    print(("stale: " if check else "rewrote: ") + (names or "nothing"))


if __name__ == "__main__":
    main()
