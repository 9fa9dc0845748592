"""Hosts for the cluster recipes' tests, on this machine: each its own network namespace with its own address on a
bridge the test makes (and a name every host resolves, as a cluster's DNS gives), its own hostname, /tmp, home and
processes (UTS, mount and PID namespaces), and no folder shared with the others but those a recipe says must be:
an NFS export or a PersistentVolume, mounted at the same path on each host. The repository and its venv stay where
they are, as an image or a shared install would put them. A recipe that leans on loopback, on a home or a /tmp
that another host wrote, or on a path only one host has, fails here as it would on a cluster.

    with hosts(folder, ["head", "worker"], shared={"/mnt/shared": folder / "nfs"}) as cluster:
        process = lane.start(cluster["head"].command("ray start --head --block"), ...)

Needs root (ip netns, unshare): can_make_hosts() says whether this machine allows it."""
import contextlib
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SHARED_UNDER = Path("/mnt")  # where shared folders are mounted (a tmpfs of each host's own first)
HOME = "/home/user"  # each host's own (not /root: this machine's Python may live there)


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    namespace: str  # its network namespace (ip netns)
    root: Path  # its own folders on this machine: tmp/ (its /tmp), home/ (its $HOME)
    prelude: str

    def command(self, script: str) -> list[str]:
        """bash -c SCRIPT on this host, as a process of its own PID namespace: when the command ends or is killed,
        everything it started ends with it (--kill-child), as a node's processes end with the node."""
        return ["ip", "netns", "exec", self.namespace, "unshare", "--mount", "--uts", "--pid", "--fork",
                "--kill-child", "--mount-proc", "bash", "-c", f"{self.prelude}\n{script}"]


def can_make_hosts() -> bool:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        return False
    namespace = f"wscheck{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", namespace], capture_output=True, timeout=30).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
    return made and subprocess.run(["unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "true"],
                                   capture_output=True, timeout=30).returncode == 0


def ip(*words: str) -> None:
    done = subprocess.run(["ip", *words], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"ip {' '.join(words)}: {done.stderr.strip()}"


@contextlib.contextmanager
def hosts(folder: Path, names: list[str], shared: dict[str, Path] | None = None, mounted_by=None):
    """{name: Host} on a bridge of their own, a subnet of 10.0.0.0/8 drawn at random (this machine's other tests
    may make theirs at the same time). This machine is 10.X.Y.1 on the bridge. shared: {path on a host: folder
    here}, mounted by the hosts named in mounted_by (default: all). Every process left on a host is killed at the
    end, and the namespaces and the bridge removed."""
    shared, mounted_by = shared or {}, names if mounted_by is None else mounted_by
    assert all(Path(path).parent == SHARED_UNDER for path in shared), f"shared folders go in {SHARED_UNDER}/"
    tag = secrets.token_hex(3)
    subnet = f"10.{secrets.randbelow(250) + 1}.{secrets.randbelow(250) + 1}"
    bridge, made = f"wsb{tag}", []
    etc_hosts = folder / "etc-hosts"
    etc_hosts.write_text("127.0.0.1 localhost\n" + "".join(f"{subnet}.{i + 2} {name}\n"
                                                            for i, name in enumerate(names)))
    ip("link", "add", bridge, "type", "bridge")
    try:
        ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        ip("link", "set", bridge, "up")
        cluster = {}
        for i, name in enumerate(names):
            namespace, veth, address = f"ws{tag}{name}"[:15], f"wsv{tag}{i}", f"{subnet}.{i + 2}"
            ip("netns", "add", namespace)
            made.append(namespace)
            ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            ip("link", "set", veth, "master", bridge, "up")
            for words in (["addr", "add", f"{address}/24", "dev", "eth0"], ["link", "set", "eth0", "up"],
                          ["link", "set", "lo", "up"], ["route", "add", "default", "via", f"{subnet}.1"]):
                ip("-n", namespace, *words)
            root = folder / "hosts" / name
            for own in ("tmp", "home"):
                (root / own).mkdir(parents=True)
            mounts = shared if name in mounted_by else {}
            cluster[name] = Host(name, address, namespace, root, prelude(name, root, mounts, etc_hosts))
        yield cluster
    finally:
        for namespace in made:
            stop_everything_in(namespace)
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=30)


def prelude(name: str, root: Path, shared: dict[str, Path], etc_hosts: Path) -> str:
    """What makes a shell on this host: its name, the shared folders, the cluster's names and its own home mounted,
    then its own /tmp (last: the others may live in this machine's /tmp)."""
    lines = ["set -e", "mount --make-rprivate /", f"hostname {name}"]
    if shared:
        lines.append(f"mount -t tmpfs {name}-mnt {SHARED_UNDER}")
    for path, source in shared.items():
        lines += [f"mkdir -p {shlex.quote(str(path))}", f"mount --bind {shlex.quote(str(source))} {shlex.quote(path)}"]
    lines += [f"mount --bind {etc_hosts} /etc/hosts", f"mount -t tmpfs {name}-home /home", f"mkdir {HOME}",
              f"mount --bind {root / 'home'} {HOME}", f"mount --bind {root / 'tmp'} /tmp", f"export HOME={HOME}",
              # The cluster's names are in /etc/hosts, a cluster's DNS stand-in: gRPC (Ray's) reads it through
              # the system's resolver, not its own DNS client.
              "export GRPC_DNS_RESOLVER=native", "set +e"]
    return "\n".join(lines)


def stop_everything_in(namespace: str, grace_s: float = 5) -> None:
    """SIGTERM to every process in the namespace, then SIGKILL to what is left after grace_s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True,
                              timeout=30).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), sig)
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline and subprocess.run(
                ["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30).stdout.strip():
            time.sleep(0.2)
