"""The labs (labs/README.md): on its untouched starting file, every check of a lab fails, for the reason the lab
teaches; on its solution, every check passes; and what a solution adds to its starting file is the step script's
code for that lesson."""
import argparse
import ast
import re
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule

from common import build_model
from labs.check import LABS

from conftest import RAY_DDP, RAY_FSDP2, ROOT, load_script

pytestmark = pytest.mark.labs

# What each check reports on the untouched starting file, in the order the check prints them: a substring, or a
# pattern where the failure names a measured number.
STARTING_FAILURES = {
    "01": ["the 2 processes trained in process groups of [1] (each alone), not one group of 2",
           "in epoch 1, rank 0 and rank 1 both trained 64 of the same images",
           re.compile(r"rank 0 reported (\S+) \(its own 128 test images give \1\)")],
    "02": ["the run reported no metrics (nor a checkpoint)",
           "the run started again for 2 epochs trained epoch(s) [1, 2] (the first run kept no checkpoint)"],
    "02-hang": ["The following ranks have not joined the collective operation: [1]",
                "rank 0 called ray.train.report 1 time(s), rank 1 0, in 2 epochs"],
    "04": ["rank 0 holds 832,682 of the 832,682 parameter values (832,682 of them whole, not sharded)",
           re.compile(r"step 2: 2 ranks' train loss \S+, 1 process's"),
           "0 all-gathers per step; 6 blocks and the root make 13"],
    "04-accumulate": ["14 reduce-scatters per optimizer step of 2 micro-batches; the model's 7 units need 7"],
    "05": ["the trials asked load_data for ['cifar10'] (scored on the test set)",
           "Tune saw no result of any of the 3 trials"],
    "06": [re.compile(r"the model was built 4 times, in \d process\(es\), for 4 batches"),
           "the output rows have columns ['predicted', 'probability']: no id says which image"],
}
# The step script whose lesson each lab is.
STEP_SCRIPTS = {
    "01": "01-vanilla-pytorch-ddp/train_ddp.py",
    "02": RAY_DDP,
    "02-hang": RAY_DDP,
    "04-accumulate": RAY_FSDP2,
}
# What a solution adds that its step script writes otherwise, and why.
UNLIKE_THE_SCRIPT = {
    "02": {"ray.train.report(history[-1], checkpoint=checkpoint)"},  # the script's metrics add its run's summary
}
STEP_05 = "05-ray-tune/tune_ray_ddp.py"
STEP_06 = "06-ray-data-inference/batch_inference.py"
# The checks' budget is 60 s on 2 cores; the tests leave room for a machine shared with other work.
CHECK_TIMEOUT_S = 280  # within pytest-timeout's 300 s per test


def check(request, lab: str, *flags: str) -> subprocess.CompletedProcess:
    """python -m labs.check LAB; a Ray lab's on the shared test cluster, which is started once for every Ray test."""
    if LABS[lab].ray:
        flags = (*flags, "--address", request.getfixturevalue("ray_cluster"))
    return subprocess.run([sys.executable, "-m", "labs.check", lab, *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=CHECK_TIMEOUT_S)


def verdicts(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(("PASS", "FAIL"))]


def shows(line: str, failure) -> bool:
    return bool(failure.search(line)) if isinstance(failure, re.Pattern) else failure in line


def lab_file(lab: str, folder: str = "labs"):
    return ROOT / folder / LABS[lab].file


@pytest.mark.parametrize("lab", LABS)
def test_every_check_fails_on_the_untouched_lab_for_its_lesson(request, lab):
    result = check(request, lab)
    lines = verdicts(result.stdout)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert len(lines) == len(STARTING_FAILURES[lab]), result.stdout
    for line, failure in zip(lines, STARTING_FAILURES[lab], strict=True):
        assert line.startswith("FAIL") and shows(line, failure), (line, failure)


@pytest.mark.parametrize("lab", LABS)
def test_every_check_passes_on_the_solution(request, lab):
    result = check(request, lab, "--file", str(lab_file(lab, "labs/solutions")))
    lines = verdicts(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert len(lines) == len(STARTING_FAILURES[lab]) and all(line.startswith("PASS") for line in lines), result.stdout


def test_lab01_tells_a_missing_set_epoch_and_ddp_wrap_apart(request, tmp_path):
    """The untouched file fails before these checks get to them: the solution without the two lines does."""
    solution = lab_file("01", "labs/solutions").read_text()
    for line in ("        sampler.set_epoch(epoch)\n", "    model = DistributedDataParallel(model)\n"):
        assert line in solution
        solution = solution.replace(line, "")
    (tmp_path / "lab.py").write_text(solution)
    lines = verdicts(check(request, "01", "--file", str(tmp_path / "lab.py")).stdout)
    assert "rank 0 and rank 1 ended with different weights" in lines[0]
    assert "every epoch repeated epoch 1's order" in lines[1] and lines[2].startswith("PASS")


@pytest.mark.parametrize("lab", STEP_SCRIPTS)
def test_what_a_solution_adds_is_the_step_scripts_code(lab):
    added = statements(lab_file(lab, "labs/solutions")) - statements(lab_file(lab))
    assert added, "the solution adds nothing to the starting file"
    assert sorted(added - statements(ROOT / STEP_SCRIPTS[lab])) == sorted(UNLIKE_THE_SCRIPT.get(lab, ()))


def statements(path) -> set[str]:
    """A file's simple statements, one line each however they are wrapped, comments left out; not its docstrings,
    nor its imports (a lab imports from common/ what a script may hold itself)."""
    nodes = ast.walk(ast.parse(path.read_text()))
    return {ast.unparse(node) for node in nodes if isinstance(node, ast.stmt) and not hasattr(node, "body")
            and not isinstance(node, ast.Import | ast.ImportFrom)
            and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))}



def test_lab06_solution_loads_the_model_as_the_step_script_does():
    """The actor's constructor is step 06's Classifier's, statement for statement; map_batches is given the class."""
    solution, script = (ast.parse(path.read_text()) for path in (lab_file("06", "labs/solutions"), ROOT / STEP_06))
    assert constructor(solution) == constructor(script) and len(constructor(script)) == 4
    calls = [node for node in ast.walk(solution) if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(
        "map_batches")]
    assert [ast.unparse(call.args[0]) for call in calls] == ["Classifier"]


def test_lab05_solution_schedules_and_searches_as_the_step_script_does():
    """ASHA with the script's arguments (its --grace-period's default is 1), over some of the script's knobs."""
    solution, script = (ast.parse(path.read_text()) for path in (lab_file("05", "labs/solutions"), ROOT / STEP_05))
    assert keywords(solution, "ASHAScheduler") == dict(keywords(script, "ASHAScheduler"), grace_period="1")
    assert set(load_script("labs/solutions/05_tune.py").SEARCH_SPACE) < set(load_script(STEP_05).SEARCH_SPACE)


def keywords(module: ast.Module, function: str) -> dict[str, str]:
    """The keyword arguments of the one call of function in module."""
    [call] = [n for n in ast.walk(module) if isinstance(n, ast.Call) and ast.unparse(n.func) == function]
    return {keyword.arg: ast.unparse(keyword.value) for keyword in call.keywords}


def constructor(module: ast.Module) -> list[str]:
    """The statements of Classifier.__init__, without its docstring and comments."""
    classifier = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "Classifier")
    init = next(n for n in classifier.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return [ast.unparse(statement) for statement in init.body]


@pytest.fixture
def mesh_of_one():
    """A one-process gloo group, in which fully_shard runs as on many."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def test_lab04_solution_shards_as_the_step_script_does(mesh_of_one):
    """The same units, each freeing or keeping its gathered weights after forward, as step 04's shard_model."""
    solution, script = load_script("labs/solutions/04_fully_shard.py"), load_script(RAY_FSDP2)
    flags = argparse.Namespace(mixed_precision=False, cpu_offload=False, reshard_after_forward=True)
    units = fsdp_units(lambda model: solution.shard_model(model, mesh_of_one))
    assert units == fsdp_units(lambda model: script.shard_model(model, flags, torch.device("cpu")))
    assert len(units) == 7 and [reshards for _, reshards in units] == [False] + [True] * 6


def fsdp_units(shard_model) -> list[tuple[str, bool]]:
    """The units shard_model makes of the tiny model: each one's name, and whether it reshards after forward."""
    model = build_model("tiny")
    shard_model(model)
    return [(name, module._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is not None)
            for name, module in model.named_modules() if isinstance(module, FSDPModule)]


def test_a_rendezvous_port_is_free_and_below_the_ports_that_connections_are_given(monkeypatch):
    """A lab's check once failed with EADDRINUSE: its MASTER_PORT, handed out by bind(0), had been given to another
    connection on the machine before rank 0 listened on it. A port in use is passed over."""
    from labs import harness

    sample = harness.random.sample
    with socket.socket() as held:
        held.bind(("127.0.0.1", harness.free_port()))
        taken = held.getsockname()[1]
        monkeypatch.setattr(harness.random, "sample", lambda ports, k: [taken, *sample(ports, k - 1)])
        port = harness.free_port()
    assert port != taken and 1024 < taken < 32768 and 1024 < port < 32768
