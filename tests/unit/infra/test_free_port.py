"""free_port: servers launched side by side bind only once loaded, so a port handed out is not handed out
again soon, though the kernel, asked while nothing holds it, could give it twice."""

from __future__ import annotations

import socket

import pytest

from infra import procs


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


def test_a_reserved_port_is_refused_to_others_until_its_server_listens(monkeypatch):
    """reserve_port: while a replica loads, a plain bind of its port (a server without SO_REUSEADDR) is
    refused, and so is this process's free_port; the server's own bind, with SO_REUSEADDR as uvicorn and
    SGLang's port check do, gets it. (Another process binding with SO_REUSEADDR would too: the hold narrows
    the race, it cannot close it.)"""
    monkeypatch.setattr(procs, "_GIVEN", {})
    hold = procs.reserve_port()
    port = hold.getsockname()[1]
    try:
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # a server binding without SO_REUSEADDR
        assert procs.free_port() != port
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()
            hold.close()  # the server listens: the hold goes, the port stays taken
            with socket.socket() as other, pytest.raises(OSError):
                other.bind(("127.0.0.1", port))
    finally:
        hold.close()
