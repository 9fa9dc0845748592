"""common/'s functions replaced in a lab's run, in the modules that define them, so that the lab's code gets the
replacement however it imports them: to record its models, optimizers and gradients (watch_training)."""
import importlib

import torch

COMMON_MODULES = ("common.data", "common.flags", "common.model", "common.training")  # replace_in_common


def replace_in_common(**functions) -> None:
    """Replaces functions of common/ in the modules that define them, so that a lab's file gets the replacement
    however it imports them (`from common.training import evaluate as ev`, `import common.training`)."""
    for name, function in functions.items():
        module = next(m for m in map(importlib.import_module, COMMON_MODULES) if hasattr(m, name))
        setattr(module, name, function)


def watch_training(float64: bool = False, gradients_of=None, **functions) -> dict:
    """Replaces build_model and make_optimizer in common/ (and any other of its functions given) so that the lab's
    run records its models, its optimizers and, at every optimizer step, its gradients: gradients_of(model), by
    default each parameter's gradient as this rank holds it (a DTensor's local part, its name in "sharded"). With
    float64, every model is built in double precision (in_float64)."""
    from common.model import build_model
    from common.training import make_optimizer
    from torch.distributed.tensor import DTensor

    watched = dict(models=[], optimizers=[], gradients=[], sharded=set())

    def local_gradients(model) -> dict:
        gradients = {}
        for name, p in model.named_parameters():
            if isinstance(p.grad, DTensor):
                watched["sharded"].add(name)
            if p.grad is not None:
                gradients[name] = (p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
        return gradients

    def record_gradients(*_):
        watched["gradients"].append((gradients_of or local_gradients)(watched["models"][-1]))

    def watched_build_model(*args, **kwargs):
        model = build_model(*args, **kwargs)
        watched["models"].append(in_float64(model) if float64 else model)
        return watched["models"][-1]

    def watched_make_optimizer(*args, **kwargs):
        watched["optimizers"].append(make_optimizer(*args, **kwargs))
        watched["optimizers"][-1].register_step_pre_hook(record_gradients)
        return watched["optimizers"][-1]

    replace_in_common(build_model=watched_build_model, make_optimizer=watched_make_optimizer, **functions)
    return watched


def in_float64(model: torch.nn.Module) -> torch.nn.Module:
    """The model in double precision, casting its floating-point inputs (common.data's images are float32) to it."""
    model.double()
    model.register_forward_pre_hook(lambda _, inputs: tuple(x.double() if x.is_floating_point() else x
                                                             for x in inputs))
    return model
