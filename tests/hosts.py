"""Hosts for the cluster recipes' tests, on this machine: each its own network namespace with its own address on a
bridge the test makes (and a name every host resolves, as a cluster's DNS gives), its own hostname, /tmp, home and
processes (UTS, mount and PID namespaces), and no folder shared with the others but those a recipe says must be:
an NFS export or a PersistentVolume, mounted at the same path on each host. The repository and its venv stay where
they are, as an image or a shared install would put them. A recipe that leans on loopback, on a home or a /tmp
that another host wrote, or on a path only one host has, fails here as it would on a cluster. A host is up for
the whole `with`: what a command leaves running (ray start's daemons, munged) runs on after it, as on a node,
until the host goes down at the end or is lost (Host.lose()).

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
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SHARED_UNDER = Path("/mnt")  # where shared folders are mounted (a tmpfs of each host's own first)
HOME = "/home/user"  # each host's own (not /root: this machine's Python may live there)
# The cluster's names are in /etc/hosts, a cluster's DNS stand-in: gRPC (Ray's) reads it through the system's
# resolver, not its own DNS client.
SHELL = "export GRPC_DNS_RESOLVER=native"
UP_S = 30  # for a host's namespaces and mounts to be made
# PATH on a host: this venv first, as an image or a shared install would have it, then the system's
PATH = f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    namespace: str  # its network namespace (ip netns)
    root: Path  # its own folders on this machine: tmp/ (its /tmp), home/ (its $HOME)
    init: int  # the host's first process (its PID 1), which holds its namespaces while the host is up

    def command(self, script: str) -> list[str]:
        """bash -c SCRIPT on this host, as a shell on a node: what it leaves running (ray start's daemons) runs on
        after it, in the host's own processes, until the host goes down."""
        return ["nsenter", f"--target={self.init}", "--net", "--mount", "--uts", "--pid", "--", "bash", "-c",
                f"export HOME={HOME}\n{SHELL}\n{script}"]

    def lose(self) -> None:
        """The host lost, as a node that fails: its PID 1 killed, and with it, at once, every process on it."""
        os.kill(self.init, signal.SIGKILL)


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
    (folder / "etc-resolv.conf").write_text("# no nameserver: the cluster's names are in /etc/hosts\n")
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
            cluster[name] = Host(name, address, namespace, root, boot(namespace, root, prelude(name, root, mounts,
                                                                                                 etc_hosts)))
        yield cluster
    finally:
        for namespace in made:
            stop_everything_in(namespace)
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=30)


def prelude(name: str, root: Path, shared: dict[str, Path], etc_hosts: Path) -> str:
    """What makes a host: its name, the shared folders, the cluster's names and its own home mounted, then its own
    /tmp (last: the others may live in this machine's /tmp)."""
    lines = ["set -e", "mount --make-rprivate /", f"hostname {name}"]
    if shared:
        lines.append(f"mount -t tmpfs {name}-mnt {SHARED_UNDER}")
    for path, source in shared.items():
        lines += [f"mkdir -p {shlex.quote(str(path))}", f"mount --bind {shlex.quote(str(source))} {shlex.quote(path)}"]
    # The cluster's DNS is /etc/hosts; the machine's nameserver is out of reach from the hosts, and a lookup of a
    # name /etc/hosts lacks (an IPv6 address of a host, an address's name) would wait on it for seconds: none.
    lines += [f"mount --bind {etc_hosts} /etc/hosts", f"mount --bind {etc_hosts.with_name('etc-resolv.conf')} "
              "/etc/resolv.conf", f"mount -t tmpfs {name}-home /home", f"mkdir {HOME}",
              f"mount --bind {root / 'home'} {HOME}", f"mount --bind {root / 'tmp'} /tmp"]
    return "\n".join(lines)


# A host's PID 1 reaps what ends on it: the daemons `ray start` leaves are reparented to it when that command ends.
INIT = """import os, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.2)"""


def boot(namespace: str, root: Path, prelude: str) -> int:
    """The host's first process, in its network namespace and its own mount, UTS and PID namespaces, once the
    prelude has made them (it then becomes INIT): its PID here, for nsenter. Killed, it takes every process of the
    host with it."""
    # nsenter, not `ip netns exec`, which mounts a /sys of its own: without the machine's cgroups (slurmd needs them)
    init = subprocess.Popen(["nsenter", f"--net=/run/netns/{namespace}", "unshare", "--mount", "--uts", "--pid",
                             "--fork", "--kill-child", "--mount-proc", "bash", "-c",
                             f"{prelude}\nexec {shlex.quote(sys.executable)} -c {shlex.quote(INIT)}"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # Up once the shell that ran the prelude has become INIT: its arguments exactly, not INIT's text found in them
    # (the shell's own `bash -c` holds it too, while its mounts are still to come).
    argv = [os.fsencode(sys.executable), b"-c", INIT.encode()]
    deadline = time.monotonic() + UP_S
    while True:
        assert init.poll() is None, f"host {root.name} did not boot: {init.stderr.read().strip()}"
        assert time.monotonic() < deadline, f"host {root.name} not up within {UP_S} s"
        with contextlib.suppress(OSError, ValueError):
            [first] = Path(f"/proc/{init.pid}/task/{init.pid}/children").read_text().split()
            if Path(f"/proc/{first}/cmdline").read_bytes().split(b"\0")[:3] == argv:
                return int(first)
        time.sleep(0.05)


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
