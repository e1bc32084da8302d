"""free_port: servers launched side by side bind only once loaded, so a port handed out is not handed out
again soon, though the kernel, asked while nothing holds it, could give it twice."""

from __future__ import annotations

import socket

from flywheel.core import procs


def test_ports_handed_out_are_distinct_and_free(monkeypatch):
    monkeypatch.setattr(procs, "_GIVEN", {})
    ports = [procs.free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as s:  # and each was free: one binds
        s.bind(("127.0.0.1", ports[-1]))


def test_a_port_the_kernel_gives_again_is_skipped(monkeypatch):
    """The kernel's answers, replayed: it offers 5000 twice; the second caller gets the next one."""
    offers = iter([5000, 5000, 5001])

    class Sock:
        def __init__(self, *a):
            self.port = next(offers)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            pass

        def bind(self, addr):
            pass

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(procs, "_GIVEN", {})
    monkeypatch.setattr(procs.socket, "socket", Sock)
    assert [procs.free_port(), procs.free_port()] == [5000, 5001]
