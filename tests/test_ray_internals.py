"""common/ray_internals.py: every private name of Ray that the steps use still names what it did in the installed
Ray. A Ray release that moves one fails here, by name, rather than as a console that is suddenly noisy, a traceback
printed whole, or a progress bar drawn twice."""
import importlib
import importlib.util
import inspect
import logging
from pathlib import Path

import pytest
import ray
from ray.experimental import tqdm_ray

from common import ray_internals

RAY = Path(ray.__file__).parent


@pytest.mark.parametrize("name", [ray_internals.PRINT_PATCH, ray_internals.POLL_INTERVAL,
                                  ray_internals.PREEMPTION_WATCHER, ray_internals.WORKER_GROUP_START_TIMEOUT])
def test_each_environment_variable_is_one_ray_train_reads(name):
    assert f'"{name}"' in (RAY / "train/v2/_internal/constants.py").read_text()


@pytest.mark.parametrize("name", [*ray_internals.CONTROLLER_NOISE, ray_internals.TRAINING_ERROR_LOGGER])
def test_each_logger_is_a_module_that_logs_under_its_name(name):
    spec = importlib.util.find_spec(name)
    assert spec is not None, f"Ray has no module {name}"
    assert "logging.getLogger(__name__)" in Path(spec.origin).read_text()


def test_a_failed_training_function_is_logged_with_the_message_the_filter_looks_for():
    from ray.train.v2._internal import util
    assert f'logger.error(f"{ray_internals.TRAINING_ERROR}' in inspect.getsource(util)


def test_reports_are_logged_under_the_path_of_their_source_file():
    source = Path(ray_internals.REPORT_LOGGER)
    assert source.is_file() and "logger = logging.getLogger(__file__)" in source.read_text()
    assert "def report(" in source.read_text()


def test_ray_train_report_is_defined_where_the_labs_watch_it():
    import ray.train

    assert importlib.import_module(ray_internals.REPORT_MODULE).report is ray.train.report


def test_the_console_handler_and_the_worker_log_path_exist():
    assert issubclass(ray_internals.console_handler_class(), logging.Handler)
    assert ray_internals.worker_log_path() is None  # outside a Ray Train worker: no log of its own


def test_a_progress_bar_keyed_by_us_sends_our_key_to_the_driver():
    bar = tqdm_ray.tqdm(total=3, desc="epoch 1", flush_interval_s=3600)
    ray_internals.key_progress_bar(bar, "10.0.0.1", 42, "run epoch 1")
    state = bar._get_state()
    assert (state["ip"], state["pid"], state["uuid"]) == ("10.0.0.1", 42, "run epoch 1")
