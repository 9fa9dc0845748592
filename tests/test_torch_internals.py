"""common/torch_internals.py: every private name of torch that the steps use still does what they use it for in the
installed torch. A torch release that moves one fails here, by name, rather than as a wrong estimate."""
import torch

from common.torch_internals import FakeTensorMode, storage_key


def test_fake_tensors_have_shapes_and_run_kernels_but_hold_no_memory():
    with FakeTensorMode():
        x = torch.empty(2**15, 2**15)  # 4 GiB, were it real
        y = torch.nn.functional.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None])
        assert y.shape == (1, 1, 2**15, 2**15) and y.dtype == torch.float32
        assert type(y).__name__ == "FakeTensor"


def test_storage_key_is_one_per_storage_on_real_and_fake_tensors():
    for mode in (FakeTensorMode(), torch.device("cpu")):
        with mode:
            a, b = torch.empty(8, 8), torch.empty(8, 8)
            assert storage_key(a) == storage_key(a[2:].t()) != storage_key(b)
