"""common/meter.py: what it measures (the start-up through PyTorch's hooks, the first step and the profiler when the
loop steps it), the summary it saves beside the checkpoints and the short last line; and that the step scripts show
their measurement in three lines (made, stepped, saved) and a report that carries the epoch's metrics alone."""
import argparse
import ast
import json
import re
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from common.meter import RunMeter, print_run_summary
from checks import EPOCH_FIELDS, LAST_LINE_MAX, assert_short_last_line
from conftest import ROOT

TRAINING_SCRIPTS = sorted(ROOT.glob("0[1-4]-*/train_*.py"))


def run_args(**changes) -> argparse.Namespace:
    defaults = dict(model="tiny", data="synthetic", epochs=2, batch_size=8, grad_accum_steps=1, checkpoint_dir="here",
                    profile_steps=0, launched=time.time())
    return argparse.Namespace(**{**defaults, **changes})


def epoch(number: int) -> dict:
    return dict(epoch=number, train_loss=2.0 / number, test_accuracy=0.1 * number, epoch_time_s=1.0, world_size=1,
                images_per_s=100.0 * number)


def train_one_step(meter_folder: Path, **changes) -> RunMeter:
    """What a step does between its meter's two lines, reduced to a model of two layers and one AdamW step."""
    meter = RunMeter("test", run_args(**changes), 0, torch.device("cpu"), meter_folder)
    time.sleep(0.01)
    model = nn.Sequential(nn.Linear(256, 512), nn.Linear(512, 4))
    optimizer = torch.optim.AdamW(model.parameters())
    time.sleep(0.01)
    model(torch.randn(2, 256)).sum().backward()
    optimizer.step()
    meter.step(optimizer)
    return meter


def test_the_meter_times_the_start_up_and_measures_what_a_rank_holds_after_its_first_step(tmp_path):
    meter = train_one_step(tmp_path)
    meter.save_summary([epoch(1)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    startup = summary["startup_s"]
    assert 0 <= startup["launcher"] < startup["data"] < startup["model"] < summary["time_to_first_step_s"]
    values = 256 * 512 + 512 + 512 * 4 + 4
    assert summary["memory_per_rank"][0] == dict(params_mb=pytest.approx(values * 4 / 2**20),
                                                 grads_mb=pytest.approx(values * 4 / 2**20),
                                                 optimizer_mb=pytest.approx(2 * values * 4 / 2**20 + 4 * 4 / 2**20),
                                                 peak_mb=summary["peak_memory_mb"][0])
    assert summary["params"] > 800_000  # tiny's, whatever this rank held: the meter counts the model, not a shard


def test_a_meter_left_by_a_run_that_crashed_early_breaks_no_later_run(tmp_path):
    """A run in this process (local mode, a test) that failed before its first optimizer step leaves its meter's
    hooks registered: the next run's meter, its model and any other module work beside them."""
    RunMeter("crashed", run_args(), 0, torch.device("cpu"), tmp_path / "crashed")
    meter = train_one_step(tmp_path)
    nn.Sequential(nn.Linear(2, 2))(torch.randn(1, 2))
    meter.save_summary([epoch(1)])
    assert json.loads((tmp_path / "summary.json").read_text())["time_to_first_step_s"] > 0


def test_a_step_before_training_is_not_the_first_step(tmp_path):
    """Loading a sharded optimizer state (torch.distributed.checkpoint's set_state_dict, steps 03 and 04) steps the
    optimizer once, before any forward: the meter takes the first step where the loop steps it, not there."""
    meter = RunMeter("test", run_args(), 0, torch.device("cpu"), tmp_path)
    model = nn.Sequential(nn.Linear(256, 4))
    optimizer = torch.optim.AdamW(model.parameters())
    optimizer.step()  # no gradients yet: AdamW skips every parameter
    time.sleep(0.05)
    model(torch.randn(2, 256)).sum().backward()
    optimizer.step()
    meter.step(optimizer)
    meter.save_summary([epoch(1)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["time_to_first_step_s"] > summary["startup_s"]["model"] > 0.05
    assert summary["memory_per_rank"][0]["grads_mb"] > 0


def test_a_later_attempt_keeps_the_start_up_of_the_attempt_that_trained_the_first_epoch(tmp_path):
    """A restart or --resume: the summary already in the folder holds the first attempt's start-up, which the later
    attempt's would not be (it counts the crash and the restart in). A run that trains its first epoch again (a new
    run in the same folder) measures its own."""
    first = dict(startup_s=dict(launcher=1.0, data=2.0, model=3.0), time_to_first_step_s=4.0)
    (tmp_path / "summary.json").write_text(json.dumps(first))
    resumed = train_one_step(tmp_path)
    resumed.save_summary([epoch(1), epoch(2)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["startup_s"], summary["time_to_first_step_s"]) == (first["startup_s"], 4.0)
    assert [h["epoch"] for h in summary["history"]] == [1, 2] and summary["images_per_s"] == 150.0

    fresh = train_one_step(tmp_path)
    fresh.save_summary([epoch(1)])
    assert json.loads((tmp_path / "summary.json").read_text())["time_to_first_step_s"] < 1.0


def test_the_last_line_is_short_and_names_the_whole_summary(tmp_path, capsys):
    args = run_args()
    train_one_step(tmp_path).save_summary([epoch(1), epoch(2)])
    print_run_summary(tmp_path, args.launched)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("memory per rank (MB)") and len(lines[-1]) <= LAST_LINE_MAX
    headline, summary = json.loads(lines[-1]), json.loads((tmp_path / "summary.json").read_text())
    assert headline["summary"] == str(tmp_path.resolve() / "summary.json")
    assert headline["test_accuracy"] == 0.2 and headline["wall_time_s"] == round(summary["wall_time_s"], 1)
    assert summary["history"][1].keys() == EPOCH_FIELDS


def test_a_cloud_folder_keeps_no_summary_and_says_so(tmp_path, capsys):
    meter = train_one_step(tmp_path, checkpoint_dir="s3://bucket/runs")
    meter.save_summary([epoch(1)])
    print_run_summary("s3://bucket/runs/ray_ddp-1", time.time())
    assert not (tmp_path / "summary.json").exists()
    assert capsys.readouterr().out == ("the run's summary is kept in a local or mounted --checkpoint-dir only, not "
                                       "in s3://bucket/runs/ray_ddp-1\n")


def train_function(script: Path) -> ast.FunctionDef:
    return next(node for node in ast.walk(ast.parse(script.read_text()))
                if isinstance(node, ast.FunctionDef) and node.name == "train")


@pytest.mark.parametrize("script", TRAINING_SCRIPTS, ids=lambda p: p.name)
def test_a_training_function_shows_its_meter_in_three_lines_and_reports_the_epochs_metrics_alone(script):
    """Issues #51 and #73: measurement a reader sees. The meter in three lines of train(): made first, stepped right
    after the optimizer (where the profiler starts and steps), saved after each epoch; every ray.train.report passes
    history[-1] and the checkpoint, nothing built for the benchmarks."""
    source = script.read_text().splitlines()
    function = train_function(script)
    lines = [line.split("#")[0].strip() for line in source[function.lineno - 1:function.end_lineno]]
    named = [(i, line) for i, line in enumerate(lines) if re.search(r"\bmeter\b", line)]
    assert [line.split("(")[0] for _, line in named] == ["meter = RunMeter", "meter.step", "meter.save_summary"]
    stepped = named[1][0]
    assert (lines[stepped - 1], lines[stepped]) == ("optimizer.step()", "meter.step(optimizer)")
    reports = [node for node in ast.walk(function) if isinstance(node, ast.Call)
               and ast.unparse(node.func) == "ray.train.report"]
    assert all(ast.unparse(call.args[0]) == "history[-1]" for call in reports), [ast.unparse(c) for c in reports]
    assert ("ray" in script.parent.name) == bool(reports)


@pytest.mark.parametrize("run", ["single_run", "ddp_run", "ray_run", "fsdp2_run"])  # fsdp1_run: test_step03
def test_every_training_steps_last_line_is_a_short_headline_naming_its_summary(run, request):
    """Steps 01-04 as the suite's shared runs ran them (a crash and restart, a resume on more workers included):
    the last line names the summary in the run's folder (step 01's --checkpoint-dir, a Ray run's folder)."""
    summary, folder, result = request.getfixturevalue(run)
    named = Path(json.loads(result.stdout.strip().splitlines()[-1])["summary"])
    assert named.parent in (Path(folder).resolve(), *[p.resolve() for p in Path(folder).iterdir() if p.is_dir()])
    assert_short_last_line(result.stdout, summary, named.parent)
