"""Step 04's will_it_fit.py against real runs: the published validation holds its tolerances on every row, the
estimate of `tiny` matches a fresh 2-process gloo run (and a wrong formula does not), AdamW's temporary is what each
implementation allocates, the published GPU run's giant is predicted where the tool claims to, the verdict keeps what
that run measured, and `giant` on 8 ranks answers in seconds without allocating the model."""
import argparse
import json
import re
import sys

import pytest
import torch

from checks import load_script
from conftest import ROOT
from processes import run
from suite_rules import time_limit

SCRIPT = "04-ray-train-fsdp2/will_it_fit.py"
PUBLISHED = ROOT / "benchmarks" / "published" / "will-it-fit" / "results.json"
GPU_PUBLISHED = ROOT / "benchmarks" / "published" / "gpu-memory-nvidia-h200" / "results.json"
# FSDP2 with 2 micro-batches of 2 images per rank: padding (tiny's class token and position embedding, 1 row each,
# on 2 ranks), sharded state, all-gathers in every micro-batch, one reduce-scatter.
TINY = dict(model="tiny", name="fsdp2_accum2", strategy="fsdp2", mixed_precision=False, cpu_offload=False,
            batch_size=8, grad_accum_steps=2, autocast=False)


@pytest.fixture(scope="module")
def validation():
    from benchmarks import check_will_it_fit  # imported by name: its spawned ranks import it again

    return check_will_it_fit


@pytest.fixture(scope="module")
@time_limit(120)  # two spawned processes, 10 to 20 s
def tiny_run(validation):
    return validation.measured(TINY)


def test_every_published_row_holds_its_tolerances(validation):
    results = json.loads(PUBLISHED.read_text())
    assert results["tolerance"] == validation.TOLERANCE
    assert {r["model"] for r in results["rows"]} >= {"tiny", "hybrid", "small"}
    assert {r["name"] for r in results["rows"]} >= {name for name, *_ in validation.CONFIGS} | {"fsdp2_no_reshard"} \
        | {f"{name}_autocast" for name in validation.AUTOCAST}
    fit = load_script(SCRIPT)
    for row in results["rows"]:
        assert validation.disagreements(row["predicted"], row["measured"]) == [], (row["model"], row["name"])
        assert all(m["allocated_peak"] > 0 for m in row["measured"]), f"{row['name']}: every strategy's peak measured"
        config = {k: v for k, v in row.items() if k not in ("predicted", "measured")}
        assert validation.predicted(config, fit) == row["predicted"], \
            f"{row['model']} {row['name']}: published by another will_it_fit.py; run benchmarks/check_will_it_fit.py"
    assert results["archived"]["rows"], "giant on FSDP2, from the archived run"
    for row in results["archived"]["rows"]:
        assert row["predicted_mb"] == pytest.approx(row["measured_mb"], rel=1e-12, abs=0), row["run"]


def test_the_allocators_peak_counts_what_was_alive_when_the_window_opened(validation):
    """check_will_it_fit.allocated_peak: 4 MiB alive before the window, 8 MiB made and freed in it, then 2 MiB: the
    peak is 12 MiB, not the 8 MiB the window's own events add up to, nor what was made after it."""
    from torch.profiler import ProfilerActivity, profile, record_function

    mib = 2**20 // 4  # float32 elements in a MiB
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        before = torch.empty(4 * mib)
        with record_function("window"):
            during = torch.empty(8 * mib)
            del during
            kept = torch.empty(2 * mib)
        after = torch.empty(64 * mib)
    assert validation.allocated_peak(profiler, "window") == 12 * 2**20
    del before, kept, after


def predicted(validation, config):
    return validation.predicted(config, load_script(SCRIPT))


def test_the_estimate_of_tiny_is_what_two_gloo_ranks_hold_and_send(validation, tiny_run):
    estimate = predicted(validation, TINY)
    assert validation.disagreements(estimate, tiny_run) == []
    # Here the collectives are exact, counts included: the 5% tolerance is for what a hook might not see.
    assert [e["collectives"] for e in estimate] == [m["collectives"] for m in tiny_run]


@time_limit(120)  # two spawned processes, 10 to 20 s
def test_autocasts_bf16_copies_are_counted_as_two_gloo_ranks_hold_them(validation):
    # The CPU's autocast, as the steps' CUDA one: the estimate traces the same casts. tiny's DDP peaks 37.1 MiB
    # predicted, 38.4 by MemTracker; the fp32 trace (52.2) is 36% over it.
    config = dict(TINY, name="ddp_autocast", strategy="ddp", batch_size=32, grad_accum_steps=1, autocast=True)
    measured, fit = validation.measured(config), load_script(SCRIPT)
    assert validation.disagreements(validation.predicted(config, fit), measured) == []
    assert validation.disagreements(validation.predicted(dict(config, autocast=False), fit), measured)


def test_forgetting_fsdp2s_padding_is_caught(validation, tiny_run, monkeypatch):
    fit = load_script(SCRIPT)
    monkeypatch.setattr(fit, "fsdp2_padded_numel", lambda p, n: p.numel())  # gathers no padding
    gathered = [e["collectives"]["all_gather"] for e in validation.predicted(TINY, fit)]
    assert gathered != [m["collectives"]["all_gather"] for m in tiny_run]
    monkeypatch.setattr(fit, "fsdp2_local_numel", lambda p, n, rank: p.numel() // n)  # an even split, not dim 0's
    problems = validation.disagreements(validation.predicted(TINY, fit), tiny_run)
    assert any("params" in p for p in problems), problems


def test_an_optimizer_state_not_sharded_is_caught(validation, tiny_run, monkeypatch):
    fit = load_script(SCRIPT)
    state_bytes = fit.state_bytes

    def unsharded_optimizer(model, strategy, n, rank, block):
        params, grads, _ = state_bytes(model, strategy, n, rank, block)
        return params, grads, state_bytes(model, "ddp", n, rank, block)[2]
    monkeypatch.setattr(fit, "state_bytes", unsharded_optimizer)
    problems = validation.disagreements(validation.predicted(TINY, fit), tiny_run)
    assert any("optimizer" in p for p in problems), problems


@pytest.mark.parametrize("adamw", ["fused", "foreach", "single-tensor"])
def test_adamw_temporary_is_what_each_implementation_allocates(adamw):
    # A real tiny on CPU, the steps' AdamW (its two groups), each implementation switched on as a user would (all
    # three run on CPU in torch 2.14). MemTracker counts what the second step allocates beyond the state it keeps.
    # Byte counts of tensors, not float results: the same on every processor. The slack is for the scalars AdamW
    # makes per step (512 bytes seen); a term of the wrong implementation is off by MBs (foreach's: 3.3 MB).
    from torch.distributed._tools.mem_tracker import MemTracker

    from common.model import build_model
    from common.training import make_optimizer

    fit = load_script(SCRIPT)
    args = fit.parse_args(["--model", "tiny", "--num-workers", "1", "--strategy", "ddp", "--adamw", adamw])
    predicted = fit.adamw_temporary(fit.build_fake(args), "ddp", args, rank=0)
    torch.manual_seed(0)
    model = build_model("tiny")
    optimizer = make_optimizer(model, argparse.Namespace(weight_decay=0.05, lr=1e-3), torch.device("cpu"))
    for group in optimizer.param_groups:
        group.update(fused=adamw == "fused", foreach=adamw == "foreach")
    for step in range(2):
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(2, 3, 32, 32)).sum().backward()
        if step == 0:
            optimizer.step()  # makes the state
    state = sum(v.nbytes for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        optimizer.step()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    allocated = next(v for k, v in peak.items() if getattr(k, "name", None) == "OPT") - state
    assert abs(allocated - predicted) <= 4096, f"{adamw}: allocated {allocated:,} bytes, predicted {predicted:,}"


def test_giant_on_a_gpu_is_predicted_where_the_tool_counts_it():
    # The published H200 run (one rank, 16 images): fp32 DDP with the steps' fused AdamW, DDP with foreach, FSDP2
    # with bf16 (whose peak is the end of backward: the whole state and every gradient). Within 5%: the tool leaves
    # out DDP's communication state (1-2% there); a wrong optimizer term is 18% off (3,891.5 MiB of gradients, or of
    # a foreach temporary, on 19,748.3). The DDP row with autocast and fused AdamW: the next test.
    fit = load_script(SCRIPT)
    rows = {r["name"]: r for r in json.loads(GPU_PUBLISHED.read_text())["rows"] if r["model"] == "giant"}
    for name, flags in [("ddp_no_autocast", ["--strategy", "ddp"]),
                        ("ddp_foreach", ["--strategy", "ddp", "--adamw", "foreach"]),
                        ("fsdp2_bf16", ["--strategy", "fsdp2", "--mixed-precision"])]:
        estimate = estimate_of(fit, "--model", "giant", "--num-workers", "1", "--batch-size", "16", *flags)
        measured = rows[name]["measured"]["peak"]
        assert estimate.peak == pytest.approx(measured, rel=0.05), (name, estimate.peak / 2**20, measured / 2**20)


def test_every_gpu_row_is_predicted_within_15_percent_but_the_two_the_table_explains():
    # The published H200 run (one rank; 16 images, 128 for some of hybrid's), the steps' way on CUDA: autocast's
    # copies and what CUDA's autocast keeps in fp32, cuBLAS's workspaces, fused attention. Within issue #72's bar but
    # DDP with fused AdamW and autocast on small and giant, which hold one more copy of the gradients than their
    # foreach twins (the table says so): a new row past it fails until it is explained. Without the workspaces every
    # hybrid row is 50% under; traced without autocast, small's FSDP1 is 15% over, its FSDP2 with offload 25% over,
    # hybrid's FSDP2 bf16 31% under (CUDA's autocast keeps the stem's group norms in fp32).
    from benchmarks import gpu_memory

    rows, fit = json.loads(GPU_PUBLISHED.read_text())["rows"], load_script(SCRIPT)
    peaks = [gpu_memory.predicted(row, fit)["peak"] for row in rows]
    far = {(r["model"], r["name"]) for r in gpu_memory.off_by_more_than(rows, peaks, gpu_memory.FAR)}
    assert far == {("small", "ddp"), ("giant", "ddp")}
    assert gpu_memory.FAR == 0.15


def test_offloaded_shards_and_gradients_are_pinned_each_rounded_up_to_a_power_of_two():
    # The published H200 run's pinned host memory under FSDP2's offload (one rank, so whole parameters): hybrid's to
    # the byte; small's has one 32 KiB block more, not explained. Without the rounding, small's would be 61% under.
    fit = load_script(SCRIPT)
    rows = [r for r in json.loads(GPU_PUBLISHED.read_text())["rows"] if r["name"] == "fsdp2_offload"]
    assert {r["model"] for r in rows} == {"small", "hybrid"}
    for row in rows:
        estimate = estimate_of(fit, "--model", row["model"], "--num-workers", "1", "--strategy", "fsdp2",
                               "--cpu-offload", "--batch-size", str(row["micro_batch"]))
        pinned = estimate.host - estimate.optimizer  # fused AdamW's step allocates nothing
        assert 0 <= row["measured"]["pinned"]["allocated_peak"] - pinned <= 2**16, (row["model"], pinned)


def test_the_verdict_keeps_what_the_published_gpu_run_measured():
    # Its default headroom is the published run's, rounded up: the memory beside torch's allocator at its most,
    # and the allocator's worst reserve over the peak of the runs above 1 GiB (small ones reserve in whole blocks).
    fit = load_script(SCRIPT)
    rows = [r["measured"] for r in json.loads(GPU_PUBLISHED.read_text())["rows"] if "error" not in r["measured"]]
    beside = max(m["used_beside_allocator"]["at_end"] for m in rows)
    assert beside <= fit.CUDA_KEEPS_BYTES < beside + 2**20
    reserve = max(m["reserved"] / m["peak"] - 1 for m in rows if m["peak"] > 2**30)
    assert reserve <= fit.ALLOCATOR_RESERVE < reserve + 0.01
    # hybrid's DDP peak (192.8 MiB) fits 1 GiB as bytes of tensors, not beside what CUDA keeps; said with its source
    estimates = [estimate_of(fit, "--strategy", "ddp")]
    said = fit.verdict(estimates, fit.parse_args(["--memory-per-device", "1GiB"]))
    assert "none fits" in said and "keeping 1,327.0 MiB" in said and "H200" in said, said
    assert "fits DDP" in fit.verdict(estimates, fit.parse_args(["--memory-per-device", "1GiB", "--headroom", "0B"]))
    assert "fits DDP" in fit.verdict(estimates, fit.parse_args(["--memory-per-device", "1GiB", "--device", "cpu"]))


def estimate_of(fit, *flags):
    """The tool's estimate of rank 0, for the one strategy its flags name."""
    args = fit.parse_args(list(flags))
    return fit.estimate(fit.build_fake(args), args.strategy, args, fit.activation_bytes(args))


def test_step_04s_readme_shows_what_its_commands_print(monkeypatch, capsys):
    """The README's "what you'll see" of its two commands is their output to the byte (fake tensors: no machine's
    rounding in it), so its prose may quote that output's numbers (tests/test_prose_numbers.py: OUTPUT_SOURCES)."""
    readme = (ROOT / "04-ray-train-fsdp2/README.md").read_text()
    commands, shown = re.search(r"```bash\n(python 04-ray-train-fsdp2/will_it_fit\.py .*?)```\n.*?"
                                rf"<!-- output: {SCRIPT} -->\n```text\n(.*?)```", readme, re.S).groups()
    for command in commands.splitlines():
        monkeypatch.setattr(sys, "argv", command.split()[1:])
        load_script(SCRIPT).main()
    assert capsys.readouterr().out == shown, "the README's output of will_it_fit.py is stale: run its commands again"


@pytest.mark.smoke  # the script, run once as an attendee runs it
def test_giant_on_8_ranks_answers_in_seconds_without_allocating_it():
    # The script's own process reports its peak resident memory (VmHWM, KiB: its own, where ru_maxrss also holds the
    # parent's, which Linux carries over exec after a vfork) and the CPU seconds it took: its time on an idle machine,
    # which a suite sharing 2 cores would not give as wall time.
    code = ("import re, resource, runpy, sys; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__'); "
            "r = resource.getrusage(resource.RUSAGE_SELF); hwm = re.search(r'VmHWM:\\s+(\\d+)', "
            "open('/proc/self/status').read())[1]; print(hwm, r.ru_utime + r.ru_stime)")
    result = run([sys.executable, "-c", code, str(ROOT / SCRIPT), "--model", "giant", "--num-workers", "8",
                  "--strategy", "fsdp2", "--mixed-precision", "--cpu-offload", "--memory-per-device", "80GiB"],
                 timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert "1,020,129,802 parameters" in lines[0]
    kib, seconds = lines[-1].split()
    assert int(kib) < 2**20, f"{int(kib) / 2**20:.2f} GiB resident"
    assert float(seconds) < 30, f"{float(seconds):.0f} CPU seconds"


@pytest.mark.parametrize("flags, expected", [
    (["--num-workers", "0"], "--num-workers 0 must be 1 or more"),
    (["--batch-size", "7"], "--batch-size 7 must split evenly"),
    (["--module", "nowhere:factory"], "--module nowhere:factory"),
    (["--strategy", "ddp", "--cpu-offload"], "step 04's (FSDP2) flags"),
    (["--memory-per-device", "lots"], "write it as 80GiB"),
    (["--activation-checkpointing"], "is not modelled yet"),
])
def test_bad_input_is_one_line(run_main, flags, expected):
    code, stderr = run_main(SCRIPT, *flags)  # a checked value's error is the exit code, argparse's is printed
    lines = [code] if isinstance(code, str) else stderr
    assert code and len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], (code, stderr)
