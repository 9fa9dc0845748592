"""tests/hosts.py itself: what the cluster recipes' tests take for granted of a host."""
import subprocess

import pytest

import hosts as hosts_module
from hosts import can_make_hosts, hosts

pytestmark = pytest.mark.skipif(not can_make_hosts(), reason="needs root: network, mount and PID namespaces")


def test_a_hosts_first_command_runs_once_the_host_is_made(tmp_path, monkeypatch):
    """A command run as soon as hosts() yields sees the host as made, however long its making takes: its own
    hostname and its own /tmp (a slurmd once found its munged's socket gone: munged had written it to this
    machine's /tmp, before the host's was mounted over it)."""
    made = hosts_module.prelude
    monkeypatch.setattr(hosts_module, "prelude", lambda *args: "sleep 2\n" + made(*args))
    with hosts(tmp_path, ["slow"]) as cluster:
        done = subprocess.run(cluster["slow"].command("hostname; touch /tmp/written-on-slow"), capture_output=True,
                              text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "slow", f"the command ran on {done.stdout.strip()!r}, before the host was made"
    assert (tmp_path / "hosts" / "slow" / "tmp" / "written-on-slow").exists(), "its /tmp was not the host's yet"
