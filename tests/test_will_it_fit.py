"""Step 04's will_it_fit.py against real runs: the published validation holds its tolerances on every row, the
estimate of `tiny` matches a fresh 2-process gloo run (and a wrong formula does not), and `giant` on 8 ranks answers
in seconds without allocating the model."""
import json
import sys

import pytest

from checks import load_script
from conftest import ROOT
from processes import run
from suite_rules import time_limit

SCRIPT = "04-ray-train-fsdp2/will_it_fit.py"
PUBLISHED = ROOT / "benchmarks" / "published" / "will-it-fit" / "results.json"
# FSDP2 with 2 micro-batches of 2 images per rank: padding (tiny's class token and position embedding, 1 row each,
# on 2 ranks), sharded state, all-gathers in every micro-batch, one reduce-scatter.
TINY = dict(model="tiny", name="fsdp2_accum2", strategy="fsdp2", mixed_precision=False, cpu_offload=False,
            batch_size=8, grad_accum_steps=2)


@pytest.fixture(scope="module")
def validation():
    from benchmarks import will_it_fit  # imported by name: its spawned ranks import it again

    return will_it_fit


@pytest.fixture(scope="module")
@time_limit(120)  # two spawned processes, 10 to 20 s
def tiny_run(validation):
    return validation.measured(TINY)


def test_every_published_row_holds_its_tolerances(validation):
    results = json.loads(PUBLISHED.read_text())
    assert results["tolerance"] == validation.TOLERANCE
    assert {r["model"] for r in results["rows"]} >= {"tiny", "hybrid", "small"}
    assert {r["name"] for r in results["rows"]} >= {name for name, *_ in validation.CONFIGS}
    for row in results["rows"]:
        assert validation.disagreements(row["predicted"], row["measured"]) == [], (row["model"], row["name"])
    assert results["archived"]["rows"], "giant on FSDP2, from the archived run"
    for row in results["archived"]["rows"]:
        assert row["predicted_mb"] == pytest.approx(row["measured_mb"], rel=1e-12, abs=0), row["run"]


def predicted(validation, config):
    return validation.predicted(config, load_script(SCRIPT))


def test_the_estimate_of_tiny_is_what_two_gloo_ranks_hold_and_send(validation, tiny_run):
    estimate = predicted(validation, TINY)
    assert validation.disagreements(estimate, tiny_run) == []
    # Here the collectives are exact, counts included: the 5% tolerance is for what a hook might not see.
    assert [e["collectives"] for e in estimate] == [m["collectives"] for m in tiny_run]


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
])
def test_bad_input_is_one_line(run_main, flags, expected):
    code, stderr = run_main(SCRIPT, *flags)  # a checked value's error is the exit code, argparse's is printed
    lines = [code] if isinstance(code, str) else stderr
    assert code and len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], (code, stderr)
