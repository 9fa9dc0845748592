"""Plumbing for step 02's tracked variant (02-ray-train-ddp/train_ray_ddp_with_mlflow.py): the --tracking-uri
flag, and the one MLflow run that belongs to a Ray run, found again by a tag after a worker-group restart or
--resume. What a learner copies (set_tracking_uri, start_run, log_params, log_metrics, log_artifact) stays in
the script."""
import argparse
import logging
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from .flags import REPOSITORY, can_create

# MLflow 3's own default store (a SQLite file), under the repository's results/ like every output that is
# not a checkpoint: no server to start before training; `mlflow ui --backend-store-uri URI` reads it.
DEFAULT_TRACKING_URI = f"sqlite:///{REPOSITORY / 'results' / 'mlflow.db'}"
RAY_RUN_TAG = "ray_run_name"  # the tag that ties an MLflow run to its Ray run (RunConfig(name=...))


def add_tracking_flag(parser):
    """--tracking-uri, added to the step's other flags; returns the parser."""
    parser.add_argument("--tracking-uri", type=absolute_uri, default=DEFAULT_TRACKING_URI,
                        help="MLflow's store: sqlite:///FILE.db (no server), or the http://HOST:PORT of an MLflow "
                             "server (on a cluster: rank 0 logs, from whichever node it runs on)")
    return parser


def absolute_uri(uri: str) -> str:
    """A SQLite store as an absolute URI (Ray's workers do not run in the driver's folder); any other URI as it is.
    Checked as it is parsed: an error in a worker would count as a failure and be retried."""
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///")).expanduser().resolve()
        if not can_create(str(path.parent)):
            raise argparse.ArgumentTypeError(f"{path.parent} cannot be created or written; pass a writable folder")
        return f"sqlite:///{path}"
    if "://" not in uri or uri.startswith("file:"):  # MLflow 3.17 refuses its file store unless told otherwise
        raise argparse.ArgumentTypeError(f"{uri} is a folder; pass sqlite:///{uri.removeprefix('file://')}"
                                         f"/mlflow.db, or the http://HOST:PORT of an MLflow server")
    return uri


def find_or_create_run(experiment: str, ray_run: str):
    """The MLflow run (mlflow.entities.Run) of the Ray run named ray_run, in the experiment named experiment
    (created if new), on the tracking URI set before: found by its tag, else created with that tag in the same
    call, so that a crash right after leaves a run that the restarted worker group finds."""
    logging.getLogger("mlflow").setLevel(logging.WARNING)  # "Creating initial MLflow database tables..."
    uri = mlflow.get_tracking_uri()
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    experiment_id = experiment_id_of(experiment, artifact_location(uri))
    runs = mlflow.search_runs([experiment_id], filter_string=f"tags.{RAY_RUN_TAG} = '{ray_run}'",
                              order_by=["attributes.start_time ASC"], output_format="list")
    if runs:
        return runs[0]
    return MlflowClient().create_run(experiment_id, run_name=ray_run, tags={RAY_RUN_TAG: ray_run})


def experiment_id_of(name: str, artifact_location: str | None) -> str:
    found = mlflow.get_experiment_by_name(name)
    if found:
        return found.experiment_id
    try:
        return mlflow.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:  # another run created it meanwhile
        return mlflow.get_experiment_by_name(name).experiment_id


def artifact_location(uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a SQLite store, in mlartifacts/ (MLflow's default,
    ./mlartifacts, would be relative to a Ray worker's folder); a server chooses its own."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return None


def logged_epochs(run, metric: str = "test_accuracy") -> set[int]:
    """The epochs (steps) that the run already holds: log_metrics logs each epoch's metrics in one call."""
    return {m.step for m in MlflowClient().get_metric_history(run.info.run_id, metric)}


def tracker_flags(args) -> dict:
    """The run's flags, as MLflow parameters: every flag but the launch time (not a flag)."""
    return {name: value for name, value in vars(args).items() if name != "launched"}
