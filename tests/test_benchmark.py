"""The benchmark runs the steps side by side and writes a table and plots (tiny settings, no timing claims)."""
import json

from conftest import load_script, python

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_benchmark_writes_table_and_plots(ray_cluster, tmp_path):
    result = python("benchmarks/compare_steps.py", "--data", "synthetic", "--epochs", "2", "--steps-per-epoch", "3",
                    "--batch-size", "32", "--memory-model", "tiny", "--memory-workers", "2", "--address", ray_cluster,
                    "--only", "single_machine", "ddp", "ray_fsdp", "memory_fsdp2_n2", "--out", str(tmp_path),
                    timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"table: {tmp_path / 'results.md'}" in result.stdout

    runs = {r["name"]: r for r in json.loads((tmp_path / "results.json").read_text())["runs"]}
    assert list(runs) == ["single_machine", "ddp", "ray_fsdp", "memory_fsdp2_n2"]
    assert runs["ray_fsdp"]["status"] == "skipped" and "needs CUDA" in runs["ray_fsdp"]["skipped"]
    single, ddp, fsdp2 = (runs[n]["summary"] for n in ("single_machine", "ddp", "memory_fsdp2_n2"))
    assert single["test_accuracy"] == ddp["test_accuracy"]  # same global batch and seed: the same training
    assert len(single["history"]) == 2 and all(runs[n]["launch_to_first_step_s"] > 0 for n in ("single_machine", "ddp"))
    # FSDP2 on 2 workers: the ranks' fp32 shards add up to the model (tiny: 811,146 parameters), about half each.
    shards = [round(m["params_mb"] * 2**20 / 4) for m in fsdp2["memory_per_rank"]]
    assert sum(shards) == 811_146 and max(shards) < 0.52 * 811_146

    table = (tmp_path / "results.md").read_text()
    for row in ("| single_machine | 1 |", "| ddp | 2 |", "| ray_fsdp | 2 | skipped:", "| FSDP2 (step 04) | 2 | no |"):
        assert row in table
    assert "Scaling: ddp with 2 processes / single_machine with 1 =" in table
    for plot in ("accuracy.png", "throughput.png", "memory.png"):
        data = (tmp_path / plot).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000, plot


def test_a_failed_runs_reason_is_ray_out_of_memory_kill_not_the_shutdown_noise_after_it(tmp_path):
    compare_steps = load_script("benchmarks/compare_steps.py")
    log = tmp_path / "run.log"
    log.write_text("epoch 1/1 | train loss 2.3026\nTraceback (most recent call last):\n"
                   "ray.exceptions.OutOfMemoryError: 2 worker(s) were killed due to the node running low on memory.\n"
                   "Error: Training failed due to controller error:\n")
    assert compare_steps.last_error_line(log).startswith("ray.exceptions.OutOfMemoryError: 2 worker(s)")
    log.write_text("error: --model huge does not fit\nTraceback (most recent call last):\nRuntimeError: boom\n")
    assert compare_steps.last_error_line(log) == "error: --model huge does not fit"
