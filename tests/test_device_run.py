"""benchmarks/device_run.py, the prepared run for a GPU machine, checked on CPU so that no device time is spent on a
typo: its dry run parses every planned command with the step's own parser, runs two runs at a tiny size and writes
results.json in the published schema; a planned flag that a step refuses stops it before any run; a run past its
limit is recorded as failed and the others go on."""
import dataclasses
import json
import sys

import pytest

from checks import load_script
from processes import python

device_run = load_script("benchmarks/device_run.py")
# What issue #43 asks for: every step on the GPU, then torchrun and Ray DDP on the CPUs (the ends first).
GPU_RUNS = ["single_machine", "ddp", "ray_ddp", "ray_fsdp", "ray_fsdp2", "ray_fsdp2_mixed_precision",
            "ray_fsdp2_cpu_offload", "inference_1_actor"]
CPU_RUNS = [f"cpu_{launcher}_n{n}" for n in (1, 8, 2, 4) for launcher in ("torchrun_ddp", "ray_ddp")]
DRY_RUN_RUNS = {"single_machine", "cpu_torchrun_ddp_n1"}


def results_of(out) -> tuple:
    results = json.loads((out / "results.json").read_text())
    return results, {r["name"]: r for r in results["runs"]}


@pytest.mark.timeout(240)
def test_the_dry_run_checks_every_planned_command_runs_two_and_writes_the_schema(tmp_path):
    scratch = tmp_path / "tmp"  # the temporary folder of its runs: none of its own left there (torchrun leaves its)
    scratch.mkdir()
    result = python("benchmarks/device_run.py", "--dry-run", "--out", str(tmp_path), timeout=200,
                    env={"TMPDIR": str(scratch)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not list(scratch.glob("bench-*")) and not list(scratch.glob("device-run-*"))
    assert f"table: {tmp_path / 'results.md'}" in result.stdout

    results, runs = results_of(tmp_path)
    assert {"machine", "gpu", "driver", "cuda", "cpu_count", "command", "date", "commit", "steps_per_epoch",
            "threads_per_process", "elapsed_s"} <= set(results)
    assert results["dry_run"] and results["cpu_count"] > 0
    assert list(runs) == GPU_RUNS + CPU_RUNS
    assert all(set(r) == {f.name for f in dataclasses.fields(device_run.Run)} for r in runs.values())
    assert {name for name, r in runs.items() if r["status"] == "ok"} == DRY_RUN_RUNS
    for name in DRY_RUN_RUNS:
        summary = runs[name]["summary"]
        assert summary["images_per_s"] > 0 and summary["peak_memory_mb"][0] > 0, name
        assert runs[name]["launch_to_first_step_s"] > summary["time_to_first_step_s"] > 0, name
    assert all(r["status"] == "skipped" and r["skipped"] for name, r in runs.items() if name not in DRY_RUN_RUNS)
    assert runs["ray_fsdp"]["flags"][-2:] == ["--num-workers", "0"]  # FSDP1 on one GPU: local mode, by hand
    assert runs["cpu_ray_ddp_n8"]["env"] == {"OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": ""}

    table = (tmp_path / "results.md").read_text()
    for n in (1, 2, 4, 8):
        assert f"\n| {n} | {2 * n} | " in table, n
    assert "| single_machine | 1 | " in table


def with_flags_a_step_refuses(plan):
    """plan_runs, with a typo in a Ray run on the GPU and a value that torchrun's step refuses on the CPUs."""
    def planned(args, checkpoints):
        runs = {r.name: r for r in plan(args, checkpoints)}
        mixed = runs["ray_fsdp2_mixed_precision"]
        mixed.flags = [flag.replace("--mixed-precision", "--mixed-precison") for flag in mixed.flags]
        runs["cpu_torchrun_ddp_n8"].flags += ["--eval-images", "5000"]
        return list(runs.values())
    return planned


@pytest.mark.timeout(120)
def test_a_planned_flag_that_a_step_refuses_stops_everything_before_any_run(tmp_path, monkeypatch):
    monkeypatch.setattr(device_run, "plan_runs", with_flags_a_step_refuses(device_run.plan_runs))
    monkeypatch.setattr(sys, "argv", ["device_run.py", "--dry-run", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as stopped:
        device_run.main()
    error = str(stopped.value.code)
    assert error.startswith("error: planned commands refused by their step's parser: "), error
    assert "ray_fsdp2_mixed_precision: error: unrecognized arguments: --mixed-precison" in error
    assert "cpu_torchrun_ddp_n8: error: --eval-images 5000 is more than the 1,024 evaluation images" in error
    assert error.endswith("; fix their flags in benchmarks/device_run.py")
    assert not (tmp_path / "results.json").exists()


@pytest.mark.timeout(120)
def test_a_run_past_its_limit_is_recorded_and_the_others_go_on(tmp_path, monkeypatch):
    """Both runs of the dry run get a second: the first is stopped, recorded, and the second still starts."""
    monkeypatch.setattr(device_run, "own_limit_s", lambda run: 1)
    monkeypatch.setattr(device_run, "check_commands", lambda runs, args: None)  # the test above checks them
    monkeypatch.setattr(sys, "argv", ["device_run.py", "--dry-run", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as stopped:
        device_run.main()
    assert str(stopped.value.code).startswith("error: 2 of 16 runs failed (single_machine, cpu_torchrun_ddp_n1)")
    _, runs = results_of(tmp_path)
    for name in DRY_RUN_RUNS:
        assert runs[name]["status"] == "failed" and runs[name]["error"].startswith("stopped at its 1 s limit"), name
    assert runs["ddp"]["status"] == "skipped"
