"""Checks step 04's will_it_fit.py against real runs: 2 gloo ranks on CPU, 2 optimizer steps on synthetic images, for
DDP, FSDP1 and FSDP2 (with and without bf16, CPU offload and autocast) on several presets; writes predicted against
measured.

    python benchmarks/check_will_it_fit.py                 # benchmarks/published/will-it-fit/

Measured on every rank: parameters, gradients and AdamW state, the bytes of the tensors it holds (a DTensor's local
shard) after the second step; the peak over both steps twice, by two tools that work apart: the bytes torch's CPU
allocator had handed out at their highest (torch.profiler's memory events, every allocation and free since before
the model was built, added up), and torch's MemTracker (torch.distributed._tools.mem_tracker: the bytes of live
tensors it sees, the model and optimizer registered with it; it cannot follow FSDP1's flat parameters); the bytes
handed to each collective in the second step, counted by wrapping torch.distributed's (DDP's all-reduce through a
comm hook).
"""
import argparse
import contextlib
import json
import os
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from benchmarks.ranks import spawned_ranks
from benchmarks.record import ROOT, describe_commit, describe_machine, made_by
from common.meter import state_bytes
from common.model import TRANSFORMER_BLOCK, build_model
from common.training import make_optimizer
from common.rendezvous import free_port

WORLD_SIZE = 2
TIMEOUT_S = 300  # the collectives' deadline, and each run's
# (name, strategy, FSDP2's bf16, FSDP2's CPU offload)
CONFIGS = [("ddp", "ddp", False, False), ("fsdp1", "fsdp1", False, False), ("fsdp2", "fsdp2", False, False),
           ("fsdp2_bf16", "fsdp2", True, False), ("fsdp2_offload", "fsdp2", False, True),
           ("fsdp2_bf16_offload", "fsdp2", True, True)]
AUTOCAST = ("ddp", "fsdp1", "fsdp2")  # these again under autocast
# state: to the byte. peak: what the estimate leaves out (the kernels' short-lived temporaries) is 3.9% at most in
# the published run (hybrid, FSDP2 with bf16), 3.9% too with ATEN_CPU_CAPABILITY=default (AMD EPYC Zen 4): another
# processor's kernels may save other tensors, which the fake tensors' forward follows, as it runs the same kernels'
# choices. Each term left out is over 10% on some row (activations 86%, the optimizer state 35%, DDP's bucket copy
# 16%, the gathered weights 12%).
# allocated: the allocator's peak adds what no count of tensors sees, and the estimate leaves out: each kernel's own
# scratch (the processor's kernels choose it: bf16 matmuls on a CPU convert through fp32) and the timing of FSDP's
# prefetch (hybrid FSDP2 bf16's rank 0: 31.8 to 34.2 MB in 3 runs here, 14.3% over the estimate in the published
# run, made while other work shared the 2 cores). Measured in three runs of all rows: up to 14.6% over MemTracker's
# peak, the estimate up to 14.3% under it. 15% is issue #72's bar, not a derived bound: a row past it fails, by name,
# and says which it is. The autocast rows: MemTracker's within 3.3%, the allocator's within 7.6%.
TOLERANCE = dict(state=0.0, peak=0.10, allocated=0.15, communication=0.05)
CPU = torch.device("cpu")


def load_step04(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "04-ray-train-fsdp2" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wrap(model, strategy: str, flags, sent: Counter, device=CPU):
    """The model as steps 02, 03 and 04 wrap it (prepare_model's DDP, step 03's FSDP1, step 04's FSDP2)."""
    if strategy == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)

        def counted_allreduce(state, bucket):
            sent["all_reduce", "count"] += 1
            sent["all_reduce", "bytes"] += bucket.buffer().nbytes
            return allreduce_hook(state, bucket)
        model.register_comm_hook(dist.group.WORLD, counted_allreduce)
        return model
    if strategy == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return FullyShardedDataParallel(model, device_id=device,
                                        auto_wrap_policy=ModuleWrapPolicy({TRANSFORMER_BLOCK}),
                                        use_orig_params=True)
    load_step04("train_ray_fsdp2").shard_model(model, flags, device)
    return model


def count_collectives(sent: Counter) -> None:
    """The bytes handed to FSDP's collectives: all-gather's output, reduce-scatter's input (as
    tests/test_communication.py counts them)."""
    gather, gather_list, scatter = dist.all_gather_single, dist.all_gather, dist.reduce_scatter_single

    def all_gather_single(output, input, *args, **kwargs):
        sent["all_gather", "count"] += 1
        sent["all_gather", "bytes"] += output.nbytes
        return gather(output, input, *args, **kwargs)

    def all_gather(outputs, input, *args, **kwargs):  # FSDP1's on gloo
        sent["all_gather", "count"] += 1
        sent["all_gather", "bytes"] += sum(t.nbytes for t in outputs)
        return gather_list(outputs, input, *args, **kwargs)

    def reduce_scatter_single(output, input, *args, **kwargs):
        sent["reduce_scatter", "count"] += 1
        sent["reduce_scatter", "bytes"] += input.nbytes
        return scatter(output, input, *args, **kwargs)
    dist.all_gather_single, dist.all_gather, dist.reduce_scatter_single = all_gather_single, all_gather, \
        reduce_scatter_single


def allocated_peak(profiler, window: str) -> int:
    """The most bytes torch's CPU allocator had handed out during the record_function named window: its memory
    events (+ an allocation, - a free) added up in time from the profiler's start."""
    events = profiler.profiler.kineto_results.events()
    marked = next(e for e in events if e.name() == window)
    memory = sorted((e for e in events if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
                     and e.start_ns() <= marked.end_ns()), key=lambda e: e.start_ns())
    live = peak = sum(e.nbytes() for e in memory if e.start_ns() < marked.start_ns())
    for event in (e for e in memory if e.start_ns() >= marked.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def measure(rank: int, port: int, config: dict) -> dict:
    """A rank of the pair: 2 optimizer steps, the second counted."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.profiler import ProfilerActivity, profile, record_function

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # the profiler's own log lines off
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE,
                            timeout=timedelta(seconds=TIMEOUT_S))
    flags = SimpleNamespace(mixed_precision=config["mixed_precision"], cpu_offload=config["cpu_offload"],
                            reshard_after_forward=config.get("reshard_after_forward", True),
                            activation_checkpointing=False, weight_decay=0.05, lr=1e-3)
    sent, counting = Counter(), Counter()
    profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    profiler.start()  # before the model exists: every byte it and the steps hold is counted from here
    torch.manual_seed(0)
    model = wrap(build_model(config["model"]), config["strategy"], flags, counting)
    count_collectives(counting)
    optimizer = make_optimizer(model, flags, torch.device("cpu"))
    # MemTracker cannot follow FSDP1's parameters (views of a flat vector, not leaves): no peak there.
    tracker = MemTracker() if config["strategy"] != "fsdp1" else None
    if tracker:
        tracker.track_external(model, optimizer)
    k, micro = config["grad_accum_steps"], config["batch_size"] // WORLD_SIZE // config["grad_accum_steps"]
    with tracker or contextlib.nullcontext(), record_function("steps"):
        for _ in range(2):
            counting.clear()
            optimizer.zero_grad(set_to_none=True)
            for i in range(k):
                images, labels = torch.randn(micro, 3, 32, 32), torch.randint(0, 10, (micro,))
                with sync(model, config["strategy"], i == k - 1):
                    with torch.autocast("cpu", torch.bfloat16, enabled=config["autocast"]):
                        loss = torch.nn.functional.cross_entropy(model(images), labels) / k
                    loss.backward()
                if tracker:  # it follows one forward per module, then must be reset
                    tracker.reset_mod_stats()
            optimizer.step()
    profiler.stop()
    sent.update(counting)
    dist.destroy_process_group()
    return dict(
        **state_bytes(optimizer), peak=tracker.get_tracker_snapshot("peak")[CPU]["Total"] if tracker else None,
        allocated_peak=allocated_peak(profiler, "steps"),
        collectives={name: [sent[name, "count"], sent[name, "bytes"]] for name, _ in sent if _ == "count"})


def sync(model, strategy: str, last_micro_batch: bool):
    """The gradient sync in the last micro-batch only, as the steps do (no_sync; FSDP2's
    set_requires_gradient_sync)."""
    if strategy == "fsdp2":
        model.set_requires_gradient_sync(last_micro_batch)
        return contextlib.nullcontext()
    return contextlib.nullcontext() if last_micro_batch else model.no_sync()


def measured(config: dict) -> list:
    try:
        return spawned_ranks(measure, WORLD_SIZE, free_port(), config, timeout_s=TIMEOUT_S)
    except TimeoutError:
        raise SystemExit(f"error: {config} did not finish in {TIMEOUT_S} s") from None


def predicted(config: dict, fit) -> list:
    args = fit.parse_args(["--model", config["model"], "--num-workers", str(WORLD_SIZE), "--strategy",
                           config["strategy"], "--batch-size", str(config["batch_size"]), "--grad-accum-steps",
                           str(config["grad_accum_steps"]), "--device", "cpu"]
                          + ["--mixed-precision"] * config["mixed_precision"]
                          + ["--cpu-offload"] * config["cpu_offload"]
                          + ["--no-reshard-after-forward"] * (not config.get("reshard_after_forward", True))
                          + ["--autocast"] * config["autocast"])
    model = fit.build_fake(args)
    activations = fit.activation_bytes(args)
    rows = []
    for rank in range(WORLD_SIZE):
        e = fit.estimate(model, config["strategy"], args, activations, rank)
        # On a CPU the device is the host: offloaded state and the device's peak are one memory.
        rows.append(dict(params=e.params, grads=e.grads, optimizer=e.optimizer, activations=e.activations,
                         peak=e.peak + e.host, collectives=e.collectives))
    return rows


def disagreements(predicted: list, measured: list) -> list:
    """Where a prediction misses a rank's measurement by more than TOLERANCE, one line each."""
    problems = []
    for rank, (p, m) in enumerate(zip(predicted, measured, strict=True)):
        problems += [f"rank {rank} {k}: predicted {p[k]:,} bytes, measured {m[k]:,}"
                     for k in ("params", "grads", "optimizer") if p[k] != m[k]]
        if m["peak"] is not None and abs(p["peak"] - m["peak"]) > TOLERANCE["peak"] * m["peak"]:
            problems.append(f"rank {rank} peak: predicted {p['peak']:,} bytes, MemTracker {m['peak']:,}")
        if abs(p["peak"] - m["allocated_peak"]) > TOLERANCE["allocated"] * m["allocated_peak"]:
            problems.append(f"rank {rank} peak: predicted {p['peak']:,} bytes, the allocator's {m['allocated_peak']:,}")
        for name in sorted(set(p["collectives"]) | set(m["collectives"])):
            (_, sent), (_, counted) = p["collectives"].get(name, (0, 0)), m["collectives"].get(name, (0, 0))
            if abs(sent - counted) > TOLERANCE["communication"] * counted:
                problems.append(f"rank {rank} {name}: predicted {sent:,} bytes per step, counted {counted:,}")
    return problems


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["tiny", "hybrid", "small"])
    p.add_argument("--batch-size", type=int, default=32, help="global: 2 ranks of 16")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "published" / "will-it-fit"))
    args = p.parse_args()
    fit = load_step04("will_it_fit")
    out = Path(args.out)
    commit = describe_commit(("common", "04-ray-train-fsdp2", "benchmarks/check_will_it_fit.py"), "the estimator")
    rows = []
    configs = [dict(model=m, name=name, strategy=s, mixed_precision=mp_, cpu_offload=off, batch_size=args.batch_size,
                    grad_accum_steps=1, autocast=False) for m in args.models for name, s, mp_, off in CONFIGS]
    # autocast to bf16, as the steps run DDP, FSDP1 and FSDP2 on GPUs, with the CPU's autocast
    configs += [dict(c, name=f"{c['name']}_autocast", autocast=True) for c in configs if c["name"] in AUTOCAST]
    configs.sort(key=lambda c: args.models.index(c["model"]))  # each model's rows together
    configs.append(dict(configs[0], name="ddp_accum2", grad_accum_steps=2))
    configs.append(dict(configs[2], name="fsdp2_accum2", grad_accum_steps=2))
    configs.append(dict(configs[2], name="fsdp2_no_reshard", reshard_after_forward=False))
    for config in configs:
        started = time.perf_counter()
        rows.append(dict(config, predicted=predicted(config, fit), measured=measured(config)))
        print(f"{config['model']} {config['name']}: {time.perf_counter() - started:.0f} s", flush=True)
    results = dict(machine=describe_machine(), **made_by(commit), world_size=WORLD_SIZE, tolerance=TOLERANCE,
                   peak="over 2 optimizer steps: the bytes of live tensors at their highest (torch's MemTracker; it "
                        "cannot follow FSDP1's flat parameters), and the most bytes torch's CPU allocator had handed "
                        "out (torch.profiler's memory events)",
                   rows=rows, archived=archived_giant(fit))
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(markdown(results))
    print(f"table: {out / 'results.md'}")


def archived_giant(fit) -> dict:
    """giant on FSDP2 at 2 ranks, with and without offload: the archived run's state per rank (MB, 2**20 bytes)
    against this prediction. Its peak was the process's RSS, not tensor bytes: not compared."""
    path = ROOT / "benchmarks" / "published" / "archive" / "memory-giant" / "results.json"
    runs = {r["name"]: r for r in json.loads(path.read_text())["runs"]}
    args = fit.parse_args(["--model", "giant", "--num-workers", "2", "--strategy", "fsdp2"])
    model = fit.build_fake(args)
    rows = []
    for name in ("memory_fsdp2_n2", "memory_fsdp2_offload_n2"):
        for rank, m in enumerate(runs[name]["summary"]["memory_per_rank"]):
            params, grads, optimizer = fit.state_bytes(model, "fsdp2", 2, rank, args.block)
            rows.append(dict(run=name, rank=rank, predicted_mb=dict(params=params / 2**20, grads=grads / 2**20,
                                                                    optimizer=optimizer / 2**20),
                             measured_mb={k: m[f"{k}_mb"] for k in ("params", "grads", "optimizer")}))
    return dict(source=str(path.relative_to(ROOT)), rows=rows)


def peak_mib(nbytes) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:,.1f}"


def markdown(results: dict) -> str:
    lines = [f"# will_it_fit.py, predicted against measured ({results['world_size']} gloo ranks, CPU)", "",
             f"{results['machine']} | {results['date']} | commit {results['commit']} | `{results['command']}`", "",
             f"peak: {results['peak']}. Tolerances: state to the byte, peak {results['tolerance']['peak']:.0%} of "
             f"MemTracker's and {results['tolerance']['allocated']:.0%} of the allocator's, "
             f"bytes per step {results['tolerance']['communication']:.0%}.", "",
             "model | run | rank | params | grads | optimizer | peak MiB (pred / MemTracker / allocator) | collectives "
             "(count: bytes, pred / meas)", "--- | --- | ---: | --- | --- | --- | --- | ---"]
    for row in results["rows"]:
        for rank, (p, m) in enumerate(zip(row["predicted"], row["measured"], strict=True)):
            state = " | ".join("=" if p[k] == m[k] else f"{p[k]} / {m[k]}" for k in ("params", "grads", "optimizer"))
            calls = ", ".join(f"{name} {p['collectives'].get(name)} / {m['collectives'].get(name)}"
                              for name in sorted(set(p["collectives"]) | set(m["collectives"])))
            lines.append(f"{row['model']} | {row['name']} | {rank} | {state} | "
                         f"{p['peak'] / 2**20:,.1f} / {peak_mib(m['peak'])} / {m['allocated_peak'] / 2**20:,.1f} | "
                         f"{calls}")
    lines += ["", f"giant, FSDP2 at 2 ranks, from {results['archived']['source']} (MB per rank, pred / meas):", ""]
    for row in results["archived"]["rows"]:
        lines.append(f"- {row['run']} rank {row['rank']}: " + ", ".join(
            f"{k} {row['predicted_mb'][k]:,.4f} / {row['measured_mb'][k]:,.4f}" for k in row["measured_mb"]))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
