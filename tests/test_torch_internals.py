"""common/torch_internals.py: every private name of torch that the steps use still does what they use it for in the
installed torch. A torch release that moves one fails here, by name, rather than as a wrong estimate."""
import pytest
import torch

from common.torch_internals import (FakeTensorMode, autocast_on_fake_tensors, checkpoint_activations,
                                    fused_attention_on_fake_cuda, storage_key)


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


def saved_bytes(run) -> int:
    saved = {}

    def keep(t):
        saved[storage_key(t)] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        run()
    return sum(saved.values())


def test_fake_cuda_attention_saves_no_attention_matrix_once_traced_as_a_gpus_fused_kernel():
    with FakeTensorMode():
        q = torch.empty(1, 1, 1024, 8, device="cuda", requires_grad=True)
        attention = lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)  # noqa: E731
        matrix = 1024 * 1024 * 4
        assert saved_bytes(attention) > matrix, "torch now picks a fused kernel on fake CUDA: drop the substitute"
        with fused_attention_on_fake_cuda():
            assert saved_bytes(attention) < matrix / 10
    assert torch.nn.functional.scaled_dot_product_attention.__name__ == "scaled_dot_product_attention", "put back"


def test_cuda_autocast_runs_on_fake_tensors_with_cudas_own_op_lists():
    with FakeTensorMode():
        x, w = torch.empty(4, 8, device="cuda"), torch.empty(16, 8, device="cuda", requires_grad=True)
        with autocast_on_fake_tensors("cuda", enabled=True):
            y = torch.nn.functional.linear(x, w)
            assert y.dtype == torch.bfloat16, "matmuls in bf16"
            assert torch.nn.functional.layer_norm(y, (16,)).dtype == torch.float32, "CUDA's layer norm in fp32"
        assert not torch.is_autocast_enabled("cuda")
        assert torch.nn.functional.linear(x, w).dtype == torch.float32, "autocast off again"
        if not torch.cuda.is_available():  # the reason for the function: torch's own turns itself off
            with pytest.warns(UserWarning, match="Disabling autocast"), torch.autocast("cuda", torch.bfloat16):
                assert torch.nn.functional.linear(x, w).dtype == torch.float32


def test_checkpointed_activations_keep_the_modules_names_and_recompute_in_backward():
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8))
    names = list(block.state_dict())
    checkpoint_activations(block)
    assert list(block.state_dict()) == names  # a checkpoint taken with it loads without it
    ran = []
    block[0].register_forward_hook(lambda *_: ran.append("forward"))
    block(torch.randn(2, 8, requires_grad=True)).sum().backward()
    assert ran == ["forward", "forward"]  # once in forward, again in backward
