"""Lab 06, solved: the callable class of 06-ray-data-inference/batch_inference.py (its Classifier), run by a pool
of Ray Data actors.

    python -m labs.check 06 --file labs/solutions/06_predictor.py
"""
import ray
import ray.data
import torch

from common.model import build_model
from common.training import predict


def classify(dataset: ray.data.Dataset, preset: str, weights_ref: ray.ObjectRef) -> ray.data.Dataset:
    """Rows {id, label, image (3, 32, 32) uint8} in, the same rows with the predicted class out."""
    return dataset.map_batches(Classifier, fn_constructor_args=(preset, weights_ref, "cpu"),
                               compute=ray.data.ActorPoolStrategy(size=2), batch_size=64, num_cpus=1)


class Classifier:
    """One per actor: builds the model and loads the weights once, then classifies batch after batch."""

    def __init__(self, preset: str, weights_ref: ray.ObjectRef, device: str):
        self.device = torch.device(device)
        self.model = build_model(preset)
        self.model.load_state_dict(ray.get(weights_ref))
        self.model.to(self.device).eval()

    @torch.inference_mode()
    def __call__(self, batch: dict) -> dict:
        # A copy: Ray's batch is read-only.
        images = torch.tensor(batch.pop("image"), device=self.device)
        probability, predicted = predict(self.model, images).max(1)
        # Every other column (id and label) goes through untouched.
        return dict(batch, predicted=predicted.cpu().numpy(), probability=probability.cpu().numpy())
