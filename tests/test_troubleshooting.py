"""TROUBLESHOOTING.md's entries that reproduce on CPUs in seconds, reproduced: the messages it quotes
are the ones Ray and PyTorch print, and the settings it recommends do what it says. Ray's and PyTorch's behaviour,
which no change here can break (marked upstream): each test names the entry whose claim it guards."""
import concurrent.futures
import re

import pytest
import ray.train
import torch
import torch.distributed as dist
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from checks import profile_summary

pytestmark = pytest.mark.upstream


# A fit here takes 10 to 30 s. Once this process's driver was cut off from Ray's actors (a fork of it, now a failure
# of its own: suite_rules.py), Ray Train's controller started but its run never did, and fit() waited in ray.get,
# where pytest-timeout's signal never reached Python, for 15 min. Waited for from another thread, the test fails here.
FIT_DEADLINE_S = 240


def fit(train_func, tmp_path, workers=2, **kwargs):
    trainer = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=workers),
                           run_config=RunConfig(storage_path=str(tmp_path)), **kwargs)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(trainer.fit).result(timeout=FIT_DEADLINE_S)
    except concurrent.futures.TimeoutError:
        pytest.fail(f"Ray Train's fit() did not return in {FIT_DEADLINE_S} s")
    finally:
        pool.shutdown(wait=False)  # a fit that hangs keeps its thread; the test has failed


def test_an_uneven_report_becomes_an_error_with_a_collective_timeout(ray_driver, tmp_path, monkeypatch):
    """"The run hangs at a report or a collective": with RAY_TRAIN_COLLECTIVE_TIMEOUT_S, a report that one rank
    skips becomes Ray's error, which names the ranks that never joined."""
    def rank_0_reports_twice(config):
        ray.train.report({"step": 1})
        if ray.train.get_context().get_world_rank() == 0:
            ray.train.report({"step": 2})  # rank 1 never joins: without a timeout this waits forever

    monkeypatch.setenv("RAY_TRAIN_COLLECTIVE_TIMEOUT_S", "4")  # Ray hands it to the controller and workers
    with pytest.raises(ray.train.TrainingFailedError, match=r"The collective operation timed out after 4\.\d+ "
                       r"seconds\. The following ranks have not joined the collective operation: \[1\]"):
        fit(rank_0_reports_twice, tmp_path)


def test_an_uneven_torch_collective_becomes_an_error_with_the_process_group_timeout(ray_driver, tmp_path):
    """"The run hangs at a report or a collective": with TorchConfig(timeout_s=...), a PyTorch collective that one
    rank skips becomes gloo's timeout error."""
    def rank_0_all_reduces_alone(config):
        if ray.train.get_context().get_world_rank() == 0:
            dist.all_reduce(torch.ones(1))

    with pytest.raises(ray.train.TrainingFailedError, match=r"Timed out waiting 3000ms for recv operation"):
        fit(rank_0_all_reduces_alone, tmp_path, torch_config=TorchConfig(timeout_s=3))


def test_metrics_reported_without_a_checkpoint_do_not_reach_the_result(ray_driver, tmp_path):
    """"Result.metrics is None": metrics reported without a checkpoint do not reach the Result."""
    def report_metrics_only(config):
        ray.train.report({"loss": 1.0})

    result = fit(report_metrics_only, tmp_path, workers=1)  # one worker shows it: one process fewer to start
    assert result.metrics is None and result.checkpoint is None and result.best_checkpoints == []


def test_a_profiled_ray_run_prints_kinetos_thread_line_and_still_profiles_every_rank(fsdp2_run):
    """"An ERROR line when a Ray step profiles": PyTorch's profiler says so when it starts in a thread other than
    torch's importer, as in a Ray Train worker; the run's profile is whole all the same (step 04's, 2 ranks)."""
    _, storage, result = fsdp2_run
    line = r"ERROR: External init callback must run in same thread as registerClient \(-?\d+ != -?\d+\)"
    assert re.search(line, result.stderr), result.stderr[-3000:]
    ranks = profile_summary(storage)["ranks"]  # its traces: test_profiling.py
    assert [rank["rank"] for rank in ranks] == [0, 1] and all(len(rank["steps"]) == 2 for rank in ranks)
