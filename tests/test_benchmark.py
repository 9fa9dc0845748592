"""The benchmark runs the steps side by side and writes a table (tiny settings, no timing claims)."""
import argparse
import json
import os
import signal
import sys

import pytest

from checks import load_script
from conftest import ROOT
from processes import python


@pytest.mark.timeout(420)
def test_benchmark_writes_its_table(tmp_path):
    """Two step runs, no Ray: the memory section (a Ray run of its own) is drawn from a recorded run below."""
    result = python("benchmarks/compare_steps.py", "--data", "synthetic", "--model", "tiny", "--epochs", "2",
                    "--steps-per-epoch", "3", "--batch-size", "32", "--eval-images", "64", "--only", "single_machine",
                    "ddp", "--out", str(tmp_path), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"table: {tmp_path / 'results.md'}" in result.stdout

    runs = {r["name"]: r for r in json.loads((tmp_path / "results.json").read_text())["runs"]}
    assert list(runs) == ["single_machine", "ddp"]
    for name in runs:  # --eval-images reached every step
        assert "evaluating on the first 64 only" in (tmp_path / "logs" / f"{name}.log").read_text(), name
    single, ddp = (runs[n]["summary"] for n in runs)
    assert single["test_accuracy"] == ddp["test_accuracy"]  # same global batch and seed: the same training
    assert len(single["history"]) == 2 and all(runs[n]["launch_to_first_step_s"] > 0 for n in ("single_machine", "ddp"))

    table = (tmp_path / "results.md").read_text()
    for row in ("| single_machine | 1 |", "| ddp | 2 |"):
        assert row in table
    assert ("Comparisons (ratios of the runs above):\n\n"
            "- Scaling: ddp with 2 processes / single_machine with 1 =") in table
    # Launch to first step, phase by phase: the phases add up to the whole.
    breakdown = [line for line in table.splitlines() if line.startswith("| ddp | ") and line.count("|") == 8]
    assert len(breakdown) == 1
    *phases, total = (float(cell) for cell in breakdown[0].strip("|").split("|")[1:])
    # Each of the five phases and the total is rounded to 0.1 s, each off by at most 0.05: the sum of the rounded
    # phases and the rounded total differ by at most 6 x 0.05 (4.3 against 4.5 happened, beyond the 0.2 once allowed)
    assert sum(phases) == pytest.approx(total, abs=6 * 0.05 + 1e-9) and all(p >= 0 for p in phases)


def test_the_memory_section_shows_each_ranks_state_from_a_memory_run():
    """A memory run as compare_steps records it (FSDP1 on 2 workers; rank 0 holds half of tiny's 4 MB, rounded up),
    and one that could not fit: the table's rows."""
    compare_steps, tables = load_script("benchmarks/compare_steps.py"), load_script("benchmarks/tables.py")
    memory = [dict(params_mb=2.0, grads_mb=2.0, optimizer_mb=4.0, peak_mb=900.0),
              dict(params_mb=1.9, grads_mb=1.9, optimizer_mb=3.8, peak_mb=880.0)]
    summary = dict(model="tiny", params=1_000_000, global_batch_size=32, memory_per_rank=memory,
                   peak_memory_mb=[900.0, 880.0])
    runs = [compare_steps.Run("memory_fsdp1_n2", "memory", "ray_fsdp", 2, status="ok", summary=summary),
            compare_steps.Run("memory_ddp_n2", "memory", "ray_ddp", 2, skipped="does not fit", status="skipped")]
    lines = tables.memory_markdown(runs)
    assert lines[0] == "## Memory per rank: model tiny (1,000,000 parameters)"
    assert "| FSDP1 (step 03) | 2 | no | 2 | 2 | 4 | 0.01 | 0.9 |" in lines
    assert "| DDP (step 02) | 2 | no | skipped: does not fit | | | | |" in lines


def test_every_step_runs_on_cpus_and_memory_runs_that_cannot_fit_are_skipped(monkeypatch):
    compare_steps = load_script("benchmarks/compare_steps.py")
    monkeypatch.setattr(compare_steps.torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(compare_steps.os, "cpu_count", lambda: 2)
    ram = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 24 * 2**30 // 4096}  # this machine: 2 cores, 24 GiB
    monkeypatch.setattr(compare_steps.os, "sysconf", ram.get)
    args = argparse.Namespace(num_workers=2, memory_model="giant", memory_workers=[1, 2, 4])
    assert not [r.name for r in compare_steps.plan_step_runs(args) if r.skipped]  # FSDP1 (step 03) included
    memory = {r.name: r.skipped for r in compare_steps.plan_memory_runs(args)}
    assert "memory_fsdp1_n1" not in memory and memory["memory_fsdp1_n2"] is None  # step 03 needs 2 workers
    assert memory["memory_ddp_n1"] is None and "does not fit" in memory["memory_ddp_n2"]


def test_a_failed_runs_reason_is_ray_out_of_memory_kill_not_the_shutdown_noise_after_it(tmp_path):
    compare_steps = load_script("benchmarks/compare_steps.py")
    log = tmp_path / "run.log"
    log.write_text("epoch 1/1 | train loss 2.3026\nTraceback (most recent call last):\n"
                   "ray.exceptions.OutOfMemoryError: 2 worker(s) were killed due to the node running low on memory.\n"
                   "Error: Training failed due to controller error:\n")
    assert compare_steps.last_error_line(log).startswith("ray.exceptions.OutOfMemoryError: 2 worker(s)")
    log.write_text("error: --model huge does not fit\nTraceback (most recent call last):\nRuntimeError: boom\n")
    assert compare_steps.last_error_line(log) == "error: --model huge does not fit"


def ignore_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_cpu_share_finds_the_busy_process_and_reads_the_steps_off_its_progress_bar(tmp_path):
    """A stand-in for a step: one process that keeps a core busy while its progress bar advances 10 steps a second
    (for 30 s at most, should stop() fail to end it), here with SIGINT ignored, as in a job started in the
    background: stop()'s Ctrl-C must still reach it."""
    stand_in = ("import sys, time\n"
                "start = time.time()\n"
                "while time.time() - start < 30:\n"
                "    print(f'epoch 1: |#| {int((time.time() - start) * 10)}/1000 [', file=sys.stderr, flush=True)\n"
                "    busy_until = time.time() + 0.05\n"
                "    while time.time() < busy_until:\n"
                "        pass\n")
    result = python("benchmarks/ray_overhead.py", "cpu-share", "--after", "1", "--seconds", "2", "--out",
                    str(tmp_path), "--", sys.executable, "-c", stand_in, timeout=25, preexec_fn=ignore_ctrl_c)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "results.json").read_text())
    # The stand-in used over half a core (as may anything else on the machine: cpu_share sees every process).
    [busy] = [p for p in report["training_processes"] if p["name"].endswith(stand_in.replace("\n", " ").strip())]
    assert busy["cores"] > 0.5 and max(busy["threads"], key=busy["threads"].get) == "main thread"
    # Its one thread is its training thread, which waits for nothing (its output goes to a file): it gives its core
    # up rarely, 20 times a second at most.
    thread = busy["training_thread"]
    assert thread["cores"] == pytest.approx(busy["threads"]["main thread"])
    assert 0 <= thread["voluntary_switches_per_s"] <= 25
    # Switches are counted: per second over the window, each rate is a whole number of them.
    for kind in ("voluntary_switches_per_s", "involuntary_switches_per_s"):
        count = thread[kind] * report["window_s"]
        assert count >= 0 and count == pytest.approx(round(count), abs=1e-6), (kind, count)
    assert report["steps_per_s"] == pytest.approx(10, abs=1.5)
    table = (tmp_path / "results.md").read_text()
    assert "optimizer steps per second" in table and f"Machine: {report['machine']}" in table


def test_cpu_share_counts_each_threads_cores_and_switches_in_the_window():
    """summarize() on hand-made /proc readings (100 ticks a second): a thread born in the window counts from zero,
    the busiest thread of a process is its training thread, and a process under half a core is not training."""
    ray_overhead = load_script("benchmarks/ray_overhead.py")
    ticks = ray_overhead.TICKS
    before = {("10", "10"): ("train", "python", 0, 5, 7), ("10", "11"): ("train", "omp", 0, 0, 0),
              ("20", "20"): ("idle", "python", 0, 0, 0)}
    after = {("10", "10"): ("train", "python", 3 * ticks, 25, 207), ("10", "11"): ("train", "omp", ticks, 2, 4),
             ("10", "12"): ("train", "new", ticks // 2, 1, 1), ("20", "20"): ("idle", "python", ticks // 10, 2, 0)}
    report = ray_overhead.summarize(before, after, machine_busy=5 * ticks, steps=40, seconds=4.0, command=["x"])
    [training] = report["training_processes"]
    assert training["pid"] == 10 and training["cores"] == pytest.approx(4.5 / 4)
    assert training["training_thread"] == dict(cores=0.75, voluntary_switches_per_s=5.0,
                                               involuntary_switches_per_s=50.0)
    assert training["threads"] == {"main thread": 0.75, "omp": 0.25, "new": 0.125}
    assert report["steps_per_s"] == 10 and report["machine_busy_cores"] == 1.25
    assert [p["pid"] for p in report["other_processes"]] == [20]


def test_a_single_run_gets_no_comparisons_heading():
    results = json.loads((ROOT / "benchmarks/published/archive/hybrid-speed/results.json").read_text())
    table = load_script("benchmarks/tables.py").steps_results_markdown(results)
    assert "| single_machine | 1 | 42.85% |" in table and "Comparisons" not in table


def test_update_redoes_the_runs_it_names_keeps_the_rest_and_the_table_says_which_command_made_which():
    compare_steps, tables = load_script("benchmarks/compare_steps.py"), load_script("benchmarks/tables.py")

    def results(command, commit, seeds, accuracy):
        made = dict(command=command, date="2026-11-26", commit=commit)
        return dict(machine="a machine", **made, runs=[
            vars(compare_steps.Run(f"recipe_seed{s}", "recipe", "single_machine", 1, status="ok", made_by=made,
                                   summary=dict(model="hybrid", epochs=10, train_loss=0.9, test_accuracy=accuracy)))
            for s in seeds])

    first = results("--recipe-seeds 0 1", "aaaaaaa", [0, 1], 0.5)
    first["runs"][0].pop("made_by")  # as in a results.json written before runs recorded it
    first["runs"].insert(1, {**first["runs"][0], "name": "recipe_seed0_exact", "step": "inference",
                             "summary": dict(accuracy=0.5, correct=5, counted=10)})
    first["ray_start_s"] = 2.5  # measured when Ray steps ran; an update of step 01 runs alone keeps it
    merged = compare_steps.updated(first, results("--recipe-seeds 1 2 --update", "bbbbbbb", [1, 2], 0.8))
    assert merged["ray_start_s"] == 2.5 and merged["command"] == "--recipe-seeds 1 2 --update"
    assert [(r["name"], r["summary"].get("test_accuracy"), r["made_by"]["commit"]) for r in merged["runs"]] == [
        ("recipe_seed0", 0.5, "aaaaaaa"), ("recipe_seed0_exact", None, "aaaaaaa"), ("recipe_seed1", 0.8, "bbbbbbb"),
        ("recipe_seed2", 0.8, "bbbbbbb")]
    assert tables.measured_on(merged) == ("a machine; recipe_seed0: 2026-11-26, commit aaaaaaa; "
                                          "recipe_seed1, recipe_seed2: 2026-11-26, commit bbbbbbb")
    assert ("`python benchmarks/--recipe-seeds 0 1` (2026-11-26, code: commit aaaaaaa; runs: recipe_seed0, "
            "recipe_seed0_exact)") in tables.steps_results_markdown(merged)


@pytest.mark.parametrize("published, refusal", [
    (dict(machine="another machine"), "was measured on another machine, not on this machine"),
    (dict(steps_per_epoch=100), "cut its epochs to 100 steps, this command to None; pass --steps-per-epoch 100"),
    (dict(eval_images=64), "scored its runs on 64 test images, this command on all; pass the same --eval-images")])
def test_update_refuses_results_it_could_not_sit_beside_before_running_anything(published, refusal, tmp_path,
                                                                                 main_error, capsys):
    compare_steps = load_script("benchmarks/compare_steps.py")
    this_machine = dict(machine=compare_steps.describe_machine(), steps_per_epoch=None, runs=[])
    (tmp_path / "results.json").write_text(json.dumps({**this_machine, **published}))
    error = main_error("benchmarks/compare_steps.py", "--only", "recipe", "--update", "--out", str(tmp_path))
    assert error.startswith("error: --update:") and refusal in error
    assert "recipe_seed" not in capsys.readouterr().out  # no run started


def test_lab_times_records_each_checks_verdict_time_and_load(monkeypatch):
    """A check's last verdict line, its exit code, the solution's path as --file, and the load before it."""
    lab_times = load_script("benchmarks/lab_times.py")
    calls = []

    def check(command, **kwargs):
        calls.append(command)
        return argparse.Namespace(returncode=1, stdout="FAIL  a: b\n      hint: c\n2 of 3 checks passed in 9 s\n")

    monkeypatch.setattr(lab_times.subprocess, "run", check)
    monkeypatch.setattr(lab_times.os, "getloadavg", lambda: (0.25, 0.5, 1.0))
    run = lab_times.time_check("04", solution=True)
    assert calls[0][1:3] == ["-m", "labs.check"]
    assert calls[0][-3:] == ["04", "--file", "labs/solutions/04_fully_shard.py"]
    assert {k: run[k] for k in ("lab", "file", "exit_code", "passed", "load_before")} == dict(
        lab="04", file="solution", exit_code=1, passed="2 of 3", load_before=0.25)


def test_lab_times_starts_as_an_attendee_does_with_no_reference_run_kept(monkeypatch, tmp_path):
    """The untouched file's check makes the lab's reference runs, as at the workshop's start: the runs kept on this
    machine (LABS_CACHE) are not read."""
    lab_times = load_script("benchmarks/lab_times.py")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "recipe-2-epochs-0123456789abcdef.pt").write_bytes(b"kept")
    monkeypatch.setenv("LABS_CACHE", str(kept))
    caches = []

    def check(lab, solution):
        caches.append((os.environ["LABS_CACHE"], sorted(os.listdir(os.environ["LABS_CACHE"]))))
        return dict(lab=lab, file="solution" if solution else "untouched", seconds=1.0, exit_code=0, passed="1 of 1",
                    load_before=0.0)

    monkeypatch.setattr(lab_times, "time_check", check)
    monkeypatch.setattr(sys, "argv", ["lab_times.py", "--labs", "01", "--out", str(tmp_path / "out")])
    lab_times.main()
    assert len(caches) == 2 and caches[0] == caches[1] and caches[0][0] != str(kept) and caches[0][1] == []


def test_activations_measures_what_checkpointing_and_accumulation_save(tmp_path):
    """benchmarks/activations.py on tiny: each way's activations at its peak, below the step as is for each way that
    cuts them, the smallest with both; the weights of every way compared with the step as is."""
    done = python("benchmarks/activations.py", "--model", "tiny", "--images", "16", "--steps", "1", "--out",
                  str(tmp_path), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    ways = {w["way"]: w for w in json.loads((tmp_path / "results.json").read_text())["ways"]}
    assert list(ways) == ["as is", "checkpointed blocks", "4 micro-batches", "both"]
    held = {name: w["at_peak_bytes"]["activations"] for name, w in ways.items()}
    assert held["both"] < min(held["checkpointed blocks"], held["4 micro-batches"]) and \
        max(held["checkpointed blocks"], held["4 micro-batches"]) < held["as is"], held
    # Recomputing a block repeats its forward's arithmetic, on the same shapes and kernels: the same bits
    differences = {name: w["weights_max_difference_from_as_is"] for name, w in ways.items()}
    assert differences["checkpointed blocks"] == 0, differences
    assert differences["both"] == differences["4 micro-batches"], differences
    assert ways["as is"]["weights_max_difference_from_as_is"] == 0 and \
        all(w["step_s"] > 0 and w["peak_bytes"] > 0 for w in ways.values())


def test_ray_start_reads_each_process_imports_its_role_and_its_cpu_until_the_first_step():
    """benchmarks/ray_start.py's reading of what it saw (its runs are the benchmark's, not the suite's): the driver's
    own import lines, not a worker's that Ray forwarded to it; a worker's role once it left ray::IDLE; a process that
    ran before the launch counted from its CPU then, one that appeared after the first step not at all."""
    ray_start = load_script("benchmarks/ray_start.py")
    driver = ("1.0\timport time:       100 |      1450000 | torch\n"
              "1.1\timport time:        20 |        30000 |   torch._dynamo\n"
              "1.2\timport time:       100 |       920000 |   ray.train\n"
              "2.0\t(RayTrainWorker pid=7) import time:  1 |  9000000 | torchvision\n"
              "3.0\timport time:       100 |      5000000 | torch\n")
    assert ray_start.import_times(driver) == {"torch": 1.45, "ray.train": 0.92}
    assert ray_start.role_of([("ray::IDLE", 5.0), ("ray::RayTrainWorker.__init__", 7.5)]) == ("RayTrainWorker", 7.5)
    assert ray_start.role_of([("raylet", 4.0)]) == ("raylet", None)
    seen = {"10": dict(titles=[("gcs_server", 0.0)], cpu=[(0.5, 3.0), (9.0, 3.4), (11.0, 9.0)]),
            "11": dict(titles=[("ray::IDLE", 2.0), ("ray::TrainController.run", 3.0)], cpu=[(2.0, 0.1), (9.5, 2.5)]),
            "12": dict(titles=[("ray::IDLE", 10.5)], cpu=[(10.5, 1.0)])}
    rows = ray_start.account(seen, before={"10": ("gcs_server", 3.0)}, launched=0.0, first_step=10.0)
    assert rows == [dict(role="TrainController", pid=11, appeared_s=2.0, role_s=3.0, cpu_s=2.5),
                    dict(role="gcs_server", pid=10, appeared_s=None, role_s=None, cpu_s=0.4)]


def test_ray_start_levers_run_fresh_without_the_running_clusters_environment(tmp_path, monkeypatch):
    """ray_start.py --levers: every variant once a round, in one order; the running cluster's runs with --address
    and its drivers' environment (token on), the fresh runs and torchrun without it (a fresh Ray started with
    RAY_AUTH_MODE=token would be another Ray than the room's); medians of each variant's runs."""
    ray_start = load_script("benchmarks/ray_start.py")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)

    class FakeCluster:
        def __init__(self, work):
            pass

        def __enter__(self):
            os.environ["RAY_AUTH_MODE"] = "token"  # as running_cluster does for its drivers
            return "127.0.0.1:7777"

        def __exit__(self, *_):
            os.environ.pop("RAY_AUTH_MODE")
    seen = []

    def fake_run(command, env, work):
        seen.append((command, env.get("RAY_AUTH_MODE")))
        return dict(load_average_before=0.5, first_step_s=float(len(seen)), end_s=1.0)
    monkeypatch.setattr(ray_start, "running_cluster", FakeCluster)
    monkeypatch.setattr(ray_start, "lever_run", fake_run)
    ray_start.measure_levers(3, tmp_path)

    cluster_run = [*ray_start.RAY, "--address", "127.0.0.1:7777"]
    assert seen[0] == (cluster_run, "token")  # the warm-up
    names = ["torchrun", *ray_start.LEVERS, ray_start.RUNNING]
    assert len(seen) == 1 + 3 * len(names)
    for i, (command, auth) in enumerate(seen[1:]):
        name = names[i % len(names)]
        on_cluster = name == ray_start.RUNNING
        assert (command, auth) == ((cluster_run, "token") if on_cluster else
                                   (ray_start.TORCHRUN if name == "torchrun" else ray_start.RAY, None)), name
    levers = {lever["name"]: lever for lever in json.loads((tmp_path / "results.json").read_text())["levers"]}
    assert list(levers) == names
    fresh = levers["Ray, fresh"]
    assert [run["first_step_s"] for run in fresh["runs"]] == [3.0, 8.0, 13.0] and fresh["median_first_step_s"] == 8.0
    assert levers[ray_start.RUNNING]["env"] == {"RAY_AUTH_MODE": "token"}
    assert levers["Ray, fresh, workers preload torch"]["env"] == {"RAY_preload_python_modules": "torch,torchvision"}
