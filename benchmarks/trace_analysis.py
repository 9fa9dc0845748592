"""Where the time of a profiled step went, read from the traces that --profile-steps writes (common/profiling.py),
outside the training processes: per optimizer step, forward, backward and the optimizer, the calls and time of each
collective, and how much of the communication overlapped compute.

    python benchmarks/trace_analysis.py RUN_FOLDER     # the table, for a run's profile/rank<r>.json.gz

How it reads a trace on CPUs (gloo; what PyTorch 2.14 records, checked by tests/test_profiling.py): one training
thread runs forward, backward (autograd runs CPU work on the thread that called backward()) and the optimizer.
Backward runs from the first autograd::engine::evaluate_function to Optimizer.step#...; forward from the model's first
event to backward; the rest of the step (the next batch, augmentation) is "other". Each collective shows where it was
issued, on the training thread (c10d::...), and where it ran, on a gloo thread (gloo:..., waits for the other ranks
included; gloo runs a reduce-scatter as an all-reduce): calls are counted where issued, time where run. Compute is the
training thread's time in operators (aten::*); overlapped, the communication time during which it computed. On GPUs
(one GPU's trace was read) a collective runs as an NCCL kernel and compute is the other kernels.
"""
import bisect
import gzip
import json
import math
import re
import sys
from pathlib import Path

from benchmarks.markdown import table

AUTOGRAD_FUNCTION = "autograd::engine::evaluate_function"
PHASES = ("step", "forward", "backward", "optimizer", "other")
KINDS = {"reducescatter": "reduce_scatter", "allreduce": "all_reduce", "allgather": "all_gather",
         "broadcast": "broadcast", "alltoall": "all_to_all", "barrier": "barrier"}


def summarize(run_folder) -> dict:
    """Every rank's profiled steps, from the traces in <run_folder>/profile/, and their mean."""
    traces = sorted((int(re.search(r"rank(\d+)", path.name)[1]), path)
                    for path in Path(run_folder, "profile").glob("rank*.json.gz"))
    if not traces:
        raise SystemExit(f"error: no traces in {Path(run_folder, 'profile')}; run a step with --profile-steps N")
    ranks = [dict(rank=rank, trace=str(trace), steps=(steps := analyze_trace(load_trace(trace))), mean=mean(steps))
             for rank, trace in traces]
    return dict(profiled_steps=len(ranks[0]["steps"]), ranks=ranks)


def load_trace(path) -> list[dict]:
    """A Chrome trace's complete events, and the starts of its forward-to-backward arrows."""
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events
            if e.get("ph") == "X" or (e.get("ph") == "s" and e.get("cat") == "fwdbwd")]


def analyze_trace(events: list[dict]) -> list[dict]:
    """The breakdown of every profiled step, in order."""
    return [breakdown(step_parts(events, step)) for step in profiled_steps(events)]


def profiled_steps(events: list[dict]) -> list[dict]:
    """The steps on the training thread (a GPU trace also shows each step on the GPU's timeline)."""
    steps = [e for e in events if e["name"].startswith("ProfilerStep#") and e["ph"] == "X"
             and e.get("cat") != "gpu_user_annotation"]
    return sorted(steps, key=lambda e: e["ts"])


def step_parts(events: list[dict], step: dict) -> dict:
    """One optimizer step: its forward and backward passes (one of each per micro-batch), the
    optimizer, when the training thread computed, and the collectives; in microseconds."""
    start, end, thread = step["ts"], end_of(step), step["tid"]
    inside = [e for e in events if start <= e["ts"] < end and e is not step]
    mine = [e for e in inside if e["tid"] == thread]
    optimizer_steps = [span(e) for e in mine if e["name"].startswith("Optimizer.step#")]
    zero_grads = [span(e) for e in mine if e["name"].startswith("Optimizer.zero_grad#")]
    # a forward starts at DDP's or FSDP1's forward, FSDP2's forward hooks, or an operator that autograd records
    forward_starts = sorted(e["ts"] for e in mine if e["ph"] == "s" or e["name"].endswith(".forward")
                            or e["name"].startswith(("FSDP::root_pre_forward", "FSDP::pre_forward")))
    backward = backward_passes(inside, forward_starts, optimizer_steps)
    return dict(start=start, end=end, forward=forward_passes(forward_starts, backward, start),
                backward=backward, optimizer=optimizer_steps + zero_grads,
                compute=compute_intervals(inside, thread), collectives=collectives(inside))


def backward_passes(events: list[dict], forward_starts: list, optimizer_steps: list) -> list:
    """(start, end) of each backward(): autograd's functions until a forward starts. The pass that the optimizer follows
    lasts until the optimizer starts: after autograd's last function, DDP still waits there for its last all-reduce."""
    passes = []
    for start, end in sorted(span(e) for e in events if e["name"].startswith(AUTOGRAD_FUNCTION)):
        if passes and not starts_between(forward_starts, passes[-1][1], start):
            passes[-1] = (passes[-1][0], max(passes[-1][1], end))
        else:
            passes.append((start, end))
    for i, (start, end) in enumerate(passes):
        optimizer = min((s for s, _ in optimizer_steps if s >= end), default=None)
        if optimizer is not None and not starts_between(forward_starts, end, optimizer):
            passes[i] = (start, optimizer)
    return passes


def forward_passes(forward_starts: list, backward: list, step_start: float) -> list:
    """(start, end) of each forward: from the first forward event after the previous backward
    (or the step's start) to its backward. Before it: the next batch, augmentation."""
    passes, previous_end = [], step_start
    for start, end in backward:
        first = bisect.bisect_left(forward_starts, previous_end)
        if first < len(forward_starts) and forward_starts[first] < start:
            passes.append((forward_starts[first], start))
        previous_end = end
    return passes


def starts_between(starts: list, begin: float, end: float) -> bool:
    """Whether a sorted list holds a time in [begin, end)."""
    first = bisect.bisect_left(starts, begin)
    return first < len(starts) and starts[first] < end


def compute_intervals(events: list[dict], thread) -> list[tuple]:
    """When the device computed: GPU kernels other than NCCL's when the trace has any, else the
    training thread's operators."""
    kernels = [span(e) for e in events if e.get("cat") == "kernel" and not is_run(e)]
    return union(kernels or [span(e) for e in events if e["tid"] == thread and e["name"].startswith("aten::")])


def collectives(events: list[dict]) -> list[dict]:
    """Each collective issued in the step, its kind, and when it ran (None: no run in the trace).

    The process group runs them in the order they were issued: each issue takes the first later
    run of its kind (for a reduce-scatter on gloo, an all-reduce)."""
    issued = outermost([e for e in events if e["name"].startswith("c10d::") and collective_kind(e["name"])])
    runs = sorted((e for e in events if is_run(e)), key=lambda e: e["ts"])
    found = []
    for issue in issued:
        kind = collective_kind(issue["name"])
        run = next((r for r in runs if r["ts"] >= issue["ts"] and collective_kind(r["name"]) in
                    (kind, "all_reduce" if kind == "reduce_scatter" else kind)), None)
        if run is not None:
            runs.remove(run)
        found.append(dict(kind=kind, ran=None if run is None else span(run)))
    found += [dict(kind=collective_kind(r["name"]), ran=span(r)) for r in runs]  # issued unseen
    return found


def is_run(event: dict) -> bool:
    name = event["name"]
    return name.startswith("gloo:") or (event.get("cat") == "kernel" and "nccl" in name.lower())


def collective_kind(name: str) -> str | None:
    """all_reduce, all_gather, reduce_scatter ... from c10d::, gloo: or NCCL kernel names."""
    plain = name.lower().replace("_", "")
    return next((kind for key, kind in KINDS.items() if key in plain), None)


def outermost(events: list[dict]) -> list[dict]:
    """Drops the events nested in another of the same thread (a collective made of others)."""
    kept, busy_until = [], {}
    for e in sorted(events, key=lambda e: e["ts"]):
        if e["ts"] >= busy_until.get(e["tid"], -math.inf):
            kept.append(e)
            busy_until[e["tid"]] = end_of(e)
    return kept


def breakdown(parts: dict) -> dict:
    """A step's milliseconds: phases, each collective kind (calls, ms), communication, overlap."""
    forward, backward, optimizer = union(parts["forward"]), union(parts["backward"]), union(parts["optimizer"])
    busy = union(forward + backward + optimizer)
    phases = dict(step=parts["end"] - parts["start"],
                  forward=total(forward) - total(intersection(forward, optimizer)),
                  backward=total(backward), optimizer=total(optimizer))
    phases["other"] = phases["step"] - total(busy)
    kinds = {}
    for c in parts["collectives"]:
        kind = kinds.setdefault(c["kind"], dict(calls=0, ms=0.0))
        kind["calls"] += 1
        kind["ms"] += total([c["ran"]]) / 1000 if c["ran"] else 0.0
    communication = union(c["ran"] for c in parts["collectives"] if c["ran"])
    return dict({f"{name}_ms": us / 1000 for name, us in phases.items()}, collectives=kinds,
                communication_ms=total(communication) / 1000,
                overlapped_ms=total(intersection(communication, parts["compute"])) / 1000)


def mean(steps: list[dict]) -> dict:
    """The steps' average: every number, and every collective's calls and ms."""
    def average(values):
        return sum(values) / len(steps)
    kinds = sorted({kind for s in steps for kind in s["collectives"]})
    return dict({key: average(s[key] for s in steps) for key in steps[0] if key.endswith("_ms")}, collectives={
        kind: {field: average(s["collectives"].get(kind, {}).get(field, 0) for s in steps) for field in ("calls", "ms")}
        for kind in kinds})


def span(event: dict) -> tuple:
    return event["ts"], end_of(event)


def end_of(event: dict) -> float:
    return event["ts"] + event.get("dur", 0)


def union(intervals) -> list[tuple]:
    """Sorted, disjoint intervals covering the same time as the given ones."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def intersection(a: list[tuple], b: list[tuple]) -> list[tuple]:
    """The time in both of two unions (sorted, disjoint intervals)."""
    both, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            both.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return both


def total(intervals: list[tuple]) -> float:
    return sum(end - start for start, end in intervals)


def profile_table(results: dict) -> list:
    """A row per variant and rank; a failed variant's row gives its error."""
    rows = []
    for v in results["variants"]:
        if v["status"] != "ok":
            rows.append([v["title"], "", v["error"], "", "", "", "", "", ""])
        for rank in v["ranks"]:
            m = rank["mean"]
            share = m["overlapped_ms"] / m["communication_ms"] if m["communication_ms"] else 0
            calls = "; ".join(f"{kind}: {c['calls']:g} calls, {c['ms']:.1f} ms" for kind, c in m["collectives"].items())
            rows.append([v["title"], rank["rank"], *(f"{m[f'{phase}_ms']:.0f}" for phase in PHASES), calls,
                         f"{m['overlapped_ms']:.1f} of {m['communication_ms']:.1f} ms ({share:.0%})"])
    return table(["variant", "rank", "step", "forward", "backward", "optimizer", "other", "communication per step",
                  "overlapped"], rows)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python benchmarks/trace_analysis.py RUN_FOLDER")
    ranks = summarize(sys.argv[1])["ranks"]
    print(f"{len(ranks[0]['steps'])} profiled optimizer steps, ms per step (mean); traces (ui.perfetto.dev): "
          f"{Path(sys.argv[1], 'profile')}/rank<r>.json.gz")
    print("\n".join(profile_table(dict(variants=[dict(title=Path(sys.argv[1]).name, status="ok", ranks=ranks)]))))
