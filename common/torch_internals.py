"""Every private name of torch (2.14) that the steps use, in one place, each with why no public way does it.
tests/test_torch_internals.py fails when a torch release moves or renames one."""
import torch

# Tensors of shapes and dtypes alone, whose operations run each kernel's own shape rules and save for backward
# what the real kernel would, allocating nothing: what step 04's will_it_fit.py builds a model of. torch's
# public torch.device("meta") allocates nothing too, but runs no CPU kernel's choices (attention's among them).
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: F401


def storage_key(tensor: torch.Tensor) -> int:
    """One number per storage: a view and the tensor it views share it, so bytes are counted once. The public
    data_ptr() is 0 on every fake tensor (with a warning that it is deprecated there), which has no memory; the
    storage's C++ handle tells storages apart on both."""
    return tensor.untyped_storage()._cdata
