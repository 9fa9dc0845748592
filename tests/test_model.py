"""The presets: torchvision's VisionTransformer, with the stem each preset names."""
import torch
from torchvision.models.vision_transformer import VisionTransformer

from common.model import build_model, count_params
from checks import checkpoint_weights, final_json
from conftest import SMOKE
from processes import python


def stem_strides(model) -> list[int]:
    return [block[0].stride[0] for block in model.conv_proj[:-1]]  # the last is the 1x1 projection to hidden_dim


def test_tiny_is_the_two_convolution_stem_and_64_tokens():
    model = build_model("tiny")
    assert isinstance(model, VisionTransformer) and stem_strides(model) == [2, 2]
    assert model.seq_length == 8 * 8 + 1 and count_params(model) == 832_682


def test_hybrid_is_a_vision_transformer_with_a_deeper_stem_down_to_16_tokens():
    model = build_model("hybrid")
    assert isinstance(model, VisionTransformer)
    assert stem_strides(model) == [1, 2, 1, 2, 1, 2]  # a stride-1 convolution before each stride-2 one
    assert model.seq_length == 4 * 4 + 1 and model.hidden_dim == 192 and count_params(model) == 2_410_858
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_hybrid_trains_in_a_step_script_and_its_checkpoint_loads(tmp_path):
    # A flag given twice takes its last value: SMOKE with another model and one epoch.
    summary = final_json(python("01-vanilla-pytorch-ddp/train_single_machine.py", *SMOKE, "--model", "hybrid",
                                "--epochs", "1", "--checkpoint-dir", str(tmp_path)))
    assert summary["model"] == "hybrid" and summary["params"] == 2_410_858
    build_model("hybrid").load_state_dict(checkpoint_weights(tmp_path))
