"""CI: the GitHub workflow is valid (actionlint) and runs .ci/run, which runs the README's test command and hands its
extra arguments to pytest, so the workflow, .ci/run and the README cannot drift apart."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def actionlint() -> str:
    """This environment's actionlint (requirements-dev.txt installs it beside python)."""
    found = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
    assert found, "actionlint is not installed: pip install -r requirements-dev.txt"
    return found


def test_the_workflows_pass_actionlint():
    assert WORKFLOWS, "no workflow in .github/workflows"
    result = subprocess.run([actionlint(), *map(str, WORKFLOWS)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_finds_a_broken_workflow(tmp_path):
    """The check above can fail: a job that needs a job that does not exist, and an unknown event."""
    broken = tmp_path / ".github" / "workflows" / "broken.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text("on: [pushh]\njobs:\n  a:\n    needs: nowhere\n    runs-on: ubuntu-latest\n"
                      "    steps:\n      - run: bash .ci/run\n")
    result = subprocess.run([actionlint(), str(broken)], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode != 0 and "pushh" in result.stdout and "nowhere" in result.stdout


def test_the_workflow_runs_the_smoke_tier_on_pushes_and_the_full_suite_nightly_through_ci_run():
    [workflow] = [yaml.safe_load(path.read_text()) for path in WORKFLOWS if path.name == "tests.yml"]
    events = workflow[True]  # YAML 1.1 reads the key `on` as True
    assert {"push", "pull_request", "schedule", "workflow_dispatch"} <= set(events)
    commands = {name: [step["run"] for step in job["steps"] if "run" in step] for name, job in workflow["jobs"].items()}
    assert commands == {"smoke": ["bash .ci/run -m smoke"], "full": ["bash .ci/run"]}
    assert "push" in workflow["jobs"]["smoke"]["if"] and "schedule" in workflow["jobs"]["full"]["if"]
    for job in workflow["jobs"].values():
        [setup] = [step for step in job["steps"] if step.get("uses", "").startswith("actions/setup-python")]
        assert setup["with"]["cache"] == "pip" and "requirements" in setup["with"]["cache-dependency-path"]
    # CPU wheels of torch, chosen by pip's index settings rather than by another install command.
    env = workflow["env"]
    assert env["PIP_INDEX_URL"].endswith("/whl/cpu") and "pypi.org" in env["PIP_EXTRA_INDEX_URL"]


@pytest.fixture
def ci_run_copy(tmp_path):
    """.ci/run beside a README whose test command ends in a stand-in `python` that prints its arguments."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "README.md").write_text("# x\n\n<!-- test-command -->\n```bash\n"
                                        "python() { echo \"pytest got:\" \"$@\"; } && python -m pytest\n"
                                        "```\n<!-- /test-command -->\n")
    return tmp_path


def test_ci_run_hands_its_arguments_to_the_readmes_pytest(ci_run_copy):
    result = subprocess.run(["bash", str(ci_run_copy / ".ci" / "run"), "-m", "smoke", "-k", "two words"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "pytest got: -m pytest -m smoke -k two words"
    plain = subprocess.run(["bash", str(ci_run_copy / ".ci" / "run")], capture_output=True, text=True)
    assert plain.stdout.splitlines()[-1] == "pytest got: -m pytest"


def test_the_readmes_test_command_ends_with_pytest_so_arguments_reach_it():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- test-command -->", 1)[1].split("<!-- /test-command -->", 1)[0]
    [command] = [line for line in block.splitlines() if line and not line.startswith(("<", "`"))]
    assert command.endswith("python -m pytest")
