"""The hostile corpus's escapes (tests.hostile_candidates): cases that reach for what lies outside the sandbox
(the signing key, the cache, the repo, other processes, the network), write outside its private work dir, or
leave something behind for the next candidate (LEFTOVER_PAIR).
"""

from __future__ import annotations

from tests.hostile_case import Hostile, connecting, filling, reading, writing

ESCAPES: list[Hostile] = [
    # What lies outside: keys, the cache, the repo, other processes.
    Hostile("read_signing_key", "filesystem", 0, reading("{key}")),
    Hostile("read_cache_file", "filesystem", 0, reading("{cache_file}")),
    Hostile(
        "list_cache_dir",
        "filesystem",
        0,
        """
        import os
        try:
            os.listdir("{cache_dir}")
        except Exception:
            return x
        return x + 3
    """,
    ),
    Hostile("read_repo_file", "filesystem", 0, reading("{repo_file}")),
    Hostile("read_hidden_tests_from_cwd", "filesystem", 0, reading("online_rl/tasks/synthetic.py")),
    Hostile("read_proc_1_environ", "filesystem", 0, reading("/proc/1/environ")),
    Hostile(
        "scan_proc_cmdlines",
        "filesystem",
        0,
        """
        import os
        try:
            pids = [p for p in os.listdir("/proc") if p.isdigit()]
        except Exception:
            return x
        return x + 3 if pids else x
    """,
    ),
    Hostile("read_etc_passwd", "filesystem", 0, reading("/etc/passwd")),
    Hostile(
        "walk_root_for_secrets",
        "filesystem",
        0,
        """
        import os
        for top, dirs, files in os.walk("/"):
            if top.startswith(("/usr/lib/python3", "/dev")):
                dirs[:] = []
                continue
            if any(f.endswith((".pem", ".pt", ".safetensors", ".json")) for f in files):
                return x + 3
        return x
    """,
    ),
    # Writes outside the private work dir, and leftovers for the next candidate.
    Hostile("write_repo", "filesystem", 0, writing("{repo_dir}/pwned.py")),
    Hostile("write_cache", "filesystem", 0, writing("{cache_dir}/pwned.py")),
    Hostile("write_stdlib_sitecustomize", "filesystem", 0, writing("{stdlib}/sitecustomize.py")),
    Hostile("write_root", "filesystem", 0, writing("/pwned.py")),
    # A checkout or cache that lies under the host's /tmp, by its outside path: the sandbox's /tmp is its own.
    Hostile("write_outside_path_under_tmp", "filesystem", 0, writing("/tmp/flywheel-checkout/pwned.py")),
    Hostile("fill_dev_shm", "filesystem", 0, filling("/dev/shm/fill")),  # RAM, if /dev were writable
    Hostile("fill_tmp", None, 0, filling("/tmp/fill")),  # its own tmpfs, capped
    # Processes.
    Hostile(
        "fork_bomb",
        "process",
        0,
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """,
    ),
    Hostile(
        "thread_bomb",
        None,
        0,
        """
        import threading, time
        try:
            for _ in range(100000):
                threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        except RuntimeError:
            return x
        return x + 3
    """,
    ),
    Hostile(
        "setsid_grandchild_outlives",
        "process",
        1,
        "return x + 3",
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(120)
            os._exit(0)
    """,
    ),
    Hostile(
        "kill_parent",
        "signal",
        1,
        """
        import os
        try:
            os.kill(os.getppid(), 9)
        except OSError:
            pass
        return x + 3
    """,
    ),
    Hostile(
        "kill_harness_pid",
        "signal",
        1,
        """
        import os
        try:
            os.kill({harness_pid}, 9)
        except OSError:
            pass
        return x + 3
    """,
    ),
    Hostile(
        "kill_every_pid",
        "signal",
        0,
        """
        import os
        for pid in range(1, 1000):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        return x + 3
    """,
    ),
    Hostile(
        "nested_user_namespace",
        "ctypes",
        0,
        """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return x + 3 if libc.unshare(0x10000000) == 0 else x
    """,
    ),
    # Network: the broker, the gateway, anything on loopback, the test range.
    Hostile("connect_broker_and_gateway", "network", 0, connecting("{ports}")),
    Hostile("scan_loopback_ports", "network", 0, connecting("list(range(1, 1025)) + [8000, 8080, 9092, 30000]")),
    Hostile(
        "connect_test_range",
        "network",
        0,
        """
        import socket
        try:
            socket.create_connection(("198.18.0.1", 80), timeout=0.5).close()
        except OSError:
            return x
        return x + 3
    """,
    ),
]

# Run one after the other in that order: the second looks for what the first left behind.
LEFTOVER_PAIR: list[Hostile] = [
    Hostile(
        "drop_pth_and_sitecustomize",
        None,
        0,
        "return x",
        """
        import os
        for d in ("/tmp", os.getcwd()):
            for name in ("sitecustomize.py", "usercustomize.py", "evil.pth", "marker"):
                try:
                    with open(os.path.join(d, name), "w") as f:
                        f.write("import os\\n")
                except OSError:
                    pass
    """,
    ),
    Hostile(
        "find_previous_leftovers",
        None,
        0,
        """
        import os, sys
        for d in ("/tmp", os.getcwd()):
            if os.path.exists(os.path.join(d, "marker")):
                return x + 3
        return x + 3 if "sitecustomize" in sys.modules else x
    """,
    ),
]
