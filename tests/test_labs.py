"""The labs (labs/README.md): on its untouched starting file, every check of a lab fails, for the reason the lab
teaches; on its solution, every check passes; and what a solution adds to its starting file is the step script's
code for that lesson."""
import ast
import re
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.labs

# What each check reports on the untouched starting file, in the order the check prints them: a substring, or a
# pattern where the failure names a measured number.
STARTING_FAILURES = {
    "01": ["the 2 processes trained in process groups of [1] (each alone), not one group of 2",
           "in epoch 1, rank 0 and rank 1 both trained 64 of the same images",
           re.compile(r"rank 0 reported (\S+) \(its own 128 test images give \1\)")],
}
# The step script whose lesson each lab is.
STEP_SCRIPTS = {
    "01": "01-vanilla-pytorch-ddp/train_ddp.py",
}
# The checks' budget is 60 s on 2 cores; the tests leave room for a machine shared with other work.
CHECK_TIMEOUT_S = 180


def check(lab: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labs.check", lab, *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=CHECK_TIMEOUT_S)


def verdicts(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(("PASS", "FAIL"))]


def shows(line: str, failure) -> bool:
    return bool(failure.search(line)) if isinstance(failure, re.Pattern) else failure in line


def lab_file(lab: str, folder: str = "labs"):
    from labs.check import LABS

    return ROOT / folder / LABS[lab].file


@pytest.mark.parametrize("lab", STARTING_FAILURES)
def test_every_check_fails_on_the_untouched_lab_for_its_lesson(lab):
    result = check(lab)
    lines = verdicts(result.stdout)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert len(lines) == len(STARTING_FAILURES[lab]), result.stdout
    for line, failure in zip(lines, STARTING_FAILURES[lab], strict=True):
        assert line.startswith("FAIL") and shows(line, failure), (line, failure)


@pytest.mark.parametrize("lab", STARTING_FAILURES)
def test_every_check_passes_on_the_solution(lab):
    result = check(lab, "--file", str(lab_file(lab, "labs/solutions")))
    lines = verdicts(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert len(lines) == len(STARTING_FAILURES[lab]) and all(line.startswith("PASS") for line in lines), result.stdout


@pytest.mark.parametrize("lab", STEP_SCRIPTS)
def test_what_a_solution_adds_is_the_step_scripts_code(lab):
    added = statements(lab_file(lab, "labs/solutions")) - statements(lab_file(lab))
    assert added, "the solution adds nothing to the starting file"
    assert sorted(added - statements(ROOT / STEP_SCRIPTS[lab])) == []


def statements(path) -> set[str]:
    """A file's simple statements, one line each however they are wrapped, comments left out; not its docstrings,
    nor its imports (a lab imports from common/ what a script may hold itself)."""
    nodes = ast.walk(ast.parse(path.read_text()))
    return {ast.unparse(node) for node in nodes if isinstance(node, ast.stmt) and not hasattr(node, "body")
            and not isinstance(node, ast.Import | ast.ImportFrom)
            and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))}
