"""The presets: torchvision's VisionTransformer, with the stem each preset names."""
import torch
from torchvision.models.vision_transformer import VisionTransformer

from common.model import PRESETS, build_model, count_params, pack_attention, split_attention
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


# Each preset's parameters, as step 01's README states them (its flags table reads them from here).
PRESET_PARAMS = {"tiny": 832_682, "hybrid": 2_410_858, "small": 14_244_490, "base": 85_152_010, "large": 302_439_434,
                 "huge": 629_840_650, "giant": 1_020_129_802}


def test_every_presets_size_is_what_the_documents_say():
    with torch.device("meta"):  # nothing allocated: giant's 1.02B parameters cost nothing
        assert {preset: count_params(build_model(preset)) for preset in PRESETS} == PRESET_PARAMS


def test_hybrid_trains_in_a_step_script_and_its_checkpoint_loads(tmp_path):
    # A flag given twice takes its last value: SMOKE with another model and one epoch.
    summary = final_json(python("01-vanilla-pytorch-ddp/train_single_machine.py", *SMOKE, "--model", "hybrid",
                                "--epochs", "1", "--checkpoint-dir", str(tmp_path)))
    assert summary["model"] == "hybrid" and summary["params"] == 2_410_858
    build_model("hybrid").load_state_dict(checkpoint_weights(tmp_path))


def test_split_attention_computes_what_torchs_packed_attention_computes_and_packs_back():
    """Step 07's q, k and v apart: the same outputs as nn.MultiheadAttention's packed projection, up to rounding (one
    matrix product of 3 x width columns against three of width: a kernel may sum each dot product in another order;
    in float64 that stays near 1e-15 of the outputs), and the weights packed back are build_model's, bit for bit."""
    torch.manual_seed(0)
    whole = build_model("tiny").double()
    torch.manual_seed(0)
    split = split_attention(build_model("tiny").double())
    with torch.no_grad():  # torchvision's head starts at zero, which would make every output 0
        head = torch.randn_like(whole.heads.head.weight)
        whole.heads.head.weight.copy_(head)
        split.heads.head.weight.copy_(head)
    images = torch.randn(4, 3, 32, 32, dtype=torch.float64)
    torch.testing.assert_close(split(images), whole(images), rtol=1e-12, atol=1e-12)
    assert pack_attention(split.state_dict()).keys() == whole.state_dict().keys()
    for name, value in pack_attention(split.state_dict()).items():
        assert torch.equal(value, whole.state_dict()[name]), name
