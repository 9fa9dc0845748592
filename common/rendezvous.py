"""A port for a process group's rendezvous, chosen by any process that starts ranks itself (Ray Train's local mode,
the labs' checks, the tests, the benchmarks)."""
import random
import socket

RENDEZVOUS_PORTS = range(20000, 32768)


def free_port() -> int:
    """A port for a rendezvous (MASTER_PORT), free now, below the range from which Linux (32768-60999) and macOS
    (49152-65535) give connections their own port: one from that range is free now but not reserved, and until rank
    0 listens on it any connection on the machine (another group's gloo pairs, Ray's workers) may be given it
    (EADDRINUSE). torchrun's default, 29500, is below it too."""
    for port in random.sample(RENDEZVOUS_PORTS, 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {RENDEZVOUS_PORTS}: free one, or wait for the runs that hold them")
