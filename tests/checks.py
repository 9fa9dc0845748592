"""What the tests read from a run (its summary, checkpoints, traces, resume lines) and check of it, shared by the
test modules (conftest.py holds the settings and the shared runs)."""
import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from common.meter import summary_of

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: str):
    """A script of this repository as a module (its main() does not run), to test its functions."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def registered_epoch(storage: Path) -> int:
    """The epoch of the newest checkpoint that Ray Train's controller has registered, from its snapshot in the run
    folder: a restarted group resumes from there. A checkpoint reported but not registered yet (the controller polls
    the workers) would be lost with a worker that dies, and its epoch trained again."""
    for snapshot in storage.glob("*/checkpoint_manager_snapshot.json"):
        try:
            latest = json.loads(snapshot.read_text())["latest_checkpoint_result"]
        except (OSError, ValueError, KeyError):  # being written
            return 0
        return latest["metrics"]["epoch"] if latest else 0
    return 0


def resumed_after(stdout: str) -> list[int]:
    """The epoch after which each resume or restart of a run went on, from rank 0's one line for it: "resumed from
    <checkpoint> after epoch N" (a restarted Ray worker's line has Ray's prefix in front)."""
    return [int(epoch) for epoch in re.findall(r"resumed from \S+ after epoch (\d+)$", stdout, re.MULTILINE)]


def final_json(result) -> dict:
    """The whole summary that a step script's last stdout line names (steps 05 and 06: the line itself)."""
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return summary_of(json.loads(result.stdout.strip().splitlines()[-1]))


# What a step's history holds for each epoch, and what ray.train.report carries: the epoch's own fields, nothing else.
EPOCH_FIELDS = {"epoch", "train_loss", "test_accuracy", "epoch_time_s", "world_size", "images_per_s"}
LAST_LINE_MAX = 250


def assert_short_last_line(stdout: str, summary: dict, run_folder: Path):
    """A step's last line: one short JSON object, the headline of the summary it names, in the run's folder."""
    line = stdout.strip().splitlines()[-1]
    headline = json.loads(line)
    assert len(line) <= LAST_LINE_MAX, f"{len(line)} characters: {line}"
    assert Path(headline.pop("summary")) == (Path(run_folder) / "summary.json").resolve()
    assert list(headline) == ["step", "world_size", "model", "train_loss", "test_accuracy", "images_per_s",
                              "wall_time_s"]
    for key, value in headline.items():
        assert value == pytest.approx(summary[key], abs=0.06) if isinstance(value, float) else value == summary[key]


def reported_metrics(run_folder: Path) -> list[dict]:
    """What ray.train.report carried with each checkpoint Ray kept, from its controller's snapshot."""
    snapshot = json.loads((Path(run_folder) / "checkpoint_manager_snapshot.json").read_text())
    return [result["metrics"] for result in snapshot["checkpoint_results"]]


def profile_summary(folder) -> dict:
    """What benchmarks/trace_analysis.py reads from the --profile-steps traces of a run: step 01's --checkpoint-dir,
    or a Ray run's folder in its storage (the traces are the run's; the reading is the benchmarks')."""
    found = sorted({trace.parents[1] for trace in Path(folder).glob("**/profile/rank*.json.gz")})
    assert len(found) == 1, found
    return load_script("benchmarks/trace_analysis.py").summarize(found[0])


def collectives_per_step(summary: dict) -> list[dict]:
    """Each rank's collectives per optimizer step, as {kind: calls}."""
    return [{kind: c["calls"] for kind, c in rank["mean"]["collectives"].items()} for rank in summary["ranks"]]


def ray_checkpoints(storage) -> list[Path]:
    """The checkpoint folders of the newest Ray run under --checkpoint-dir, oldest first."""
    run = sorted(p for p in Path(storage).iterdir() if p.is_dir())[-1]
    return sorted(p for p in run.glob("checkpoint_*") if p.is_dir())


def latest_ray_checkpoint(storage) -> Path:
    return ray_checkpoints(storage)[-1]


def best_epoch(history: list) -> dict:
    """The epoch whose checkpoint Ray calls best (CheckpointConfig scores test accuracy): the most accurate, and of a
    tie the latest, as Ray orders equal scores by when they were reported (test_runs checks it)."""
    return max(reversed(history), key=lambda epoch: epoch["test_accuracy"])


def checkpoint_weights(checkpoint_dir) -> dict:
    """Model weights from the checkpoint.pt of a step's checkpoint folder (step 01's --checkpoint-dir or a Ray
    checkpoint of steps 02 and 03), read here as plainly as it can be: the tests' own reader, against which step
    06's load_weights (every format) is checked, and which shares no code with it."""
    return torch.load(Path(checkpoint_dir) / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]


def assert_same_weights(a: dict, b: dict, atol=0.0):
    """Bitwise equal by default. With atol (runs that sum gradients in another order), equal up to float
    rounding, except the attention key biases: their true gradient is exactly zero (a bias added to every
    key shifts all attention logits of a query equally, and softmax ignores that), so what they receive
    is rounding noise, which Adam's normalisation turns into full-size steps of any sign."""
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        if atol and name.endswith("in_proj_bias"):
            x, y = drop_key_slice(x), drop_key_slice(y)
        torch.testing.assert_close(x, y, atol=atol, rtol=0 if atol == 0 else 1e-4, msg=name)


def drop_key_slice(in_proj_bias: torch.Tensor) -> torch.Tensor:
    query, _, value = in_proj_bias.chunk(3)
    return torch.cat([query, value])


def assert_sane_summary(summary: dict, step: str, world_size: int, resumed: bool = False):
    assert summary["step"] == step and summary["world_size"] == world_size
    assert summary["model"] == "tiny" and summary["data"] == "synthetic" and summary["epochs"] == 2
    assert summary["params"] > 100_000
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    # The synthetic classes are easy: 6 steps of training must beat chance (10%) clearly.
    assert summary["test_accuracy"] > 0.2
    assert len(summary["history"]) == 2 and summary["history"][1]["train_loss"] < summary["history"][0]["train_loss"]
    assert all(epoch.keys() == EPOCH_FIELDS for epoch in summary["history"])
    assert summary["images_per_s"] > 0 and 0 < summary["startup_s"]["model"] < summary["time_to_first_step_s"]
    # A run resumed by a new process keeps its first attempt's start-up; its wall time is the new process's alone.
    assert resumed or summary["time_to_first_step_s"] < summary["wall_time_s"]
    assert len(summary["peak_memory_mb"]) == world_size and all(m > 0 for m in summary["peak_memory_mb"])


def assert_half_the_state_per_rank(summary: dict):
    """A sharded run on 2 ranks (FSDP1, FSDP2): each rank's parameters, gradients and AdamW state (2 tensors per
    parameter) add up to the whole model's, and no rank holds much more than half."""
    full_mb = summary["params"] * 4 / 2**20
    memory = summary["memory_per_rank"]
    for kind, factor in (("params_mb", 1), ("grads_mb", 1), ("optimizer_mb", 2)):
        assert sum(m[kind] for m in memory) == pytest.approx(factor * full_mb, rel=1e-3), kind
        assert max(m[kind] for m in memory) < 0.52 * factor * full_mb, kind
