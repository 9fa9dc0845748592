"""What a Ray lab's run kept, opened as step 06 opens a checkpoint: each of the run's kept checkpoints loaded strictly
into a plain model of the lab's preset and compared with rank 0's weights at its epoch's report (labs.watch records
their digest at every report). Labs 02 and 02-hang check theirs so."""
from pathlib import Path

import torch

from common.model import build_model
from labs import watch
from labs.harness import lab_args

SAVE_HINT = "a checkpoint holds the state dict of the model DDP wraps (its weights by name), which a plain model loads"


def unloadable(kept: list, reports: list[dict], file: str, weights=lambda saved: saved) -> tuple[str, str] | None:
    """The first of the run's kept checkpoints (Result.best_checkpoints) that fails checkpoint_failure: what it showed,
    and the hint; None if none does. file: the checkpoint's file; weights: the model's state dict in what it holds."""
    at_report = {report["metrics"].get("epoch"): report["weights"] for report in reports if report["rank"] == 0}
    for checkpoint, metrics in kept:
        with checkpoint.as_directory() as folder:
            if failed := checkpoint_failure(Path(folder) / file, weights, metrics.get("epoch"), at_report):
                return failed
    return None


def checkpoint_failure(path: Path, weights, epoch, at_report: dict) -> tuple[str, str] | None:
    """What a plain model of the lab's preset shows when it loads the checkpoint's file strictly, as step 06 does, and
    the hint; None if it then holds rank 0's weights at the report of the checkpoint's epoch (at_report: the
    digests)."""
    of, preset = f"the checkpoint of epoch {epoch}", lab_args().model
    if not path.exists():
        files = sorted(file.name for file in path.parent.iterdir())
        return (f"{of} holds {files or 'nothing (an empty folder)'}, no {path.name}",
                f"ray.train.report copies the checkpoint's folder into storage as it is then: write {path.name} into "
                "it before the report")
    try:
        state = weights(torch.load(path, weights_only=True))
    except Exception as error:  # not a file of tensors, or not laid out as the lab saves it
        return f"{of}'s {path.name} does not load: {said(error)}", SAVE_HINT
    if isinstance(state, dict) and any(str(key).startswith("module.") for key in state):
        return (f"{of} holds DDP's wrapper's keys (module.<name>), which a plain {preset} model does not load",
                "DDP's wrapper names each weight after it: save the model it wraps (model.module), which a plain "
                "model (step 06's) loads")
    model = build_model(preset)
    try:
        model.load_state_dict(state, strict=True)
    except Exception as error:  # another model's weights, or not a state dict
        return f"a plain {preset} model does not load {of}: {said(error)}", SAVE_HINT
    held = watch.digest(model.state_dict())
    if held != at_report.get(epoch):
        then = next((f"epoch {e}'s" for e, digest in at_report.items() if digest == held), "no")
        return (f"{of} holds the weights rank 0 held at {then} report, not at that epoch's",
                "a checkpoint holds the weights its epoch ended with: save them after the epoch's training, into the "
                "folder of that epoch's report")
    return None


def said(error: Exception) -> str:
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
