"""One NVIDIA GPU that is not there, for tests/test_one_gpu_laptop.py: every Python process started with this folder
on PYTHONPATH sees one GPU where the steps' checks ask for it, and none where CUDA_VISIBLE_DEVICES is empty, as on a
laptop with one NVIDIA GPU.

Faked is only what the hardware answers: torch's device count (the CUDA runtime's, which reads CUDA_VISIBLE_DEVICES
itself) and NVML's count, which Ray reads when it starts a node and then caps by CUDA_VISIBLE_DEVICES in its own code
(ray/_private/resource_and_label_spec.py): that code runs unchanged. Each module is patched as it is imported, so a
process that never imports torch or Ray never pays for them."""
import importlib.abc
import importlib.util
import os
import sys


def visible_gpus() -> int:
    """The CUDA runtime's count on a one-GPU machine: CUDA_VISIBLE_DEVICES="" hides the GPU."""
    return 0 if os.environ.get("CUDA_VISIBLE_DEVICES") == "" else 1


def patch_torch_cuda(cuda) -> None:
    cuda.device_count = visible_gpus
    cuda.is_available = lambda: visible_gpus() > 0


def patch_ray_nvidia(module) -> None:
    manager = module.NvidiaGPUAcceleratorManager
    manager.get_current_node_num_accelerators = staticmethod(lambda: 1)
    manager.get_current_node_accelerator_type = staticmethod(lambda: "A100")


PATCHES = {"torch.cuda": patch_torch_cuda, "ray._private.accelerators.nvidia_gpu": patch_ray_nvidia}


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of a module in PATCHES so that its patch runs once it is loaded."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            PATCHES[name](module)
        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, PatchOnImport())
