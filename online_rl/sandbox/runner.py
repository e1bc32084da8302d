"""The program that runs inside the sandbox: one candidate against its test inputs.

Standard library only (nothing else exists in there), and started as `python -I -S -c <this file>`.
Protocol: the job arrives as one JSON object on stdin; JSON lines go back on stdout, which is the only
channel out (the harness reads at most a capped number of bytes of it): `{"attempt": kind}` the first
time each kind of hostile attempt is seen, then one `{"result": {...}}`. Before the candidate's code
runs, stdin, stdout and stderr point to /dev/null, so anything it prints is lost rather than mixed into
the result, and its own resource limits are set.

Nothing here is trusted by the harness: the candidate runs in this same process and could rewrite it.
The expected outputs never come in; the harness re-parses every reported value as a plain literal and
compares outside. What this file adds is honest bookkeeping for the honest case (exact builtin types
only, exceptions by name) and an audit hook that names what a hostile candidate tried, for the
`flywheel_sandbox_contained_total{kind}` metric.
"""

import builtins
import json
import os
import resource
import sys

# Captured before the candidate runs: its later monkeypatching of builtins cannot reach these names.
_type, _repr, _len, _isinstance, _str, _id = type, repr, len, isinstance, str, id
_dumps, _loads, _write = json.dumps, json.loads, os.write
_LITERAL_TYPES = (int, float, complex, str, bytes, bool, type(None))
_CONTAINERS = (list, tuple, set, dict)  # what ast.literal_eval can read back outside
_MAX_REPR = 4096
_MAX_ITEMS = 10_000

_KIND_BY_EVENT = {
    "socket.__new__": "network",
    "socket.connect": "network",
    "socket.bind": "network",
    "socket.sendto": "network",
    "socket.getaddrinfo": "network",
    "socket.gethostbyname": "network",
    "os.fork": "process",
    "os.forkpty": "process",
    "os.system": "process",
    "os.exec": "process",
    "os.posix_spawn": "process",
    "os.spawn": "process",
    "subprocess.Popen": "process",
    "pty.spawn": "process",
    "os.kill": "signal",
    "os.killpg": "signal",
    "signal.pthread_kill": "signal",
    "ctypes.dlopen": "ctypes",
    "ctypes.dlsym": "ctypes",
    "ctypes.cdata": "ctypes",
    "ctypes.addressof": "ctypes",
    "ctypes.string_at": "ctypes",
    "ctypes.call_function": "ctypes",
    "sys.addaudithook": "tamper",
}
# The standard library itself walks frames (enum, namedtuple) and sets type attributes: these count only
# when the candidate's own code makes the call.
_OWN_KIND_BY_EVENT = {
    "sys._getframe": "introspection",
    "sys._current_frames": "introspection",
    "gc.get_objects": "introspection",
    "gc.get_referrers": "introspection",
    "gc.get_referents": "introspection",
    "sys.settrace": "introspection",
    "sys.setprofile": "introspection",
    "object.__getattr__": "introspection",
    "object.__setattr__": "tamper",
    "object.__delattr__": "tamper",
}
_PATH_EVENTS = {
    "open",
    "os.listdir",
    "os.scandir",
    "os.remove",
    "os.rename",
    "os.mkdir",
    "os.rmdir",
    "os.chmod",
    "os.chown",
    "os.symlink",
    "os.link",
    "os.truncate",
    "os.utime",
    "shutil.rmtree",
    "os.chdir",
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _checked_repr(value, budget):
    """repr() of a value made only of exact builtin literal types, else None. Subclasses (whose __eq__ or
    __repr__ could say anything) and other objects are refused."""
    stack = [value]
    while stack:
        v = stack.pop()
        budget[0] -= 1
        if budget[0] < 0:
            return None
        t = _type(v)
        if t in _LITERAL_TYPES:
            continue
        if t not in _CONTAINERS:
            return None
        stack.extend(v.keys() if t is dict else v)
        if t is dict:
            stack.extend(v.values())
    return _repr(value)


def main():
    job = json.loads(sys.stdin.buffer.read())
    channel = os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    lim = job["limits"]
    work = job["work_dir"]
    os.chdir(work)
    for which, value in (
        (resource.RLIMIT_CPU, (lim["cpu_seconds"], lim["cpu_seconds"] + 1)),
        (resource.RLIMIT_AS, (lim["memory_mb"] << 20,) * 2),
        (resource.RLIMIT_FSIZE, (lim["file_bytes"],) * 2),
        (resource.RLIMIT_NOFILE, (lim["open_files"],) * 2),
        (resource.RLIMIT_NPROC, (lim["processes"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(which, value)

    seen = set()

    def send(message):
        data = (_dumps(message) + "\n").encode()
        while data:
            data = data[_write(channel, data) :]

    def attempt(kind):
        # Reported the moment it is first seen: a run that ends in a kill still names what it tried.
        if kind not in seen:
            seen.add(kind)
            send({"attempt": kind})

    readable = tuple(p.rstrip("/") + "/" for p in job["readable"]) + ("/dev/",)
    writable = (work.rstrip("/") + "/", "/tmp/", "/dev/null")
    abspath, startswith, exists, parent = os.path.abspath, str.startswith, os.path.lexists, os.path.dirname
    getframe, busy = sys._getframe, [False]

    def audit(event, args):
        if busy[0]:
            return
        busy[0] = True  # what the hook itself calls (getframe, write) raises audit events of its own
        try:
            kind = _KIND_BY_EVENT.get(event)
            if kind is None and event in _OWN_KIND_BY_EVENT:
                if getframe(1).f_code.co_filename == "<candidate>" and not (
                    event == "object.__setattr__" and getattr(args[0], "__module__", None) == "candidate"
                ):
                    kind = _OWN_KIND_BY_EVENT[event]
            elif (
                kind is None
                and event in _PATH_EVENTS
                and args
                and _isinstance(args[0], (str, bytes))
                and (os.fsdecode(args[0]) != "<candidate>")
            ):  # the compiler looks for the source of an error
                path = abspath(os.fsdecode(args[0]))
                if event == "open":
                    mode, flags = args[1], args[2] if _len(args) > 2 else 0
                    write = (_isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                        _isinstance(flags, int) and flags & _WRITE_FLAGS
                    )
                else:
                    write = event not in ("os.listdir", "os.scandir", "os.chdir")
                inside = any(startswith(path, p) or path + "/" == p for p in writable)
                # Its own files (work dir, /tmp) it may use, and make new ones in its own folders; reaching for
                # one that is not there, or writing into a folder that is not, is looking for something outside
                # (a key, the repo) by its outside path, which may itself lie under /tmp (a checkout there).
                if not (inside and exists(path if not write else parent(path))) and not (
                    not write and any(startswith(path, p) for p in readable)
                ):
                    kind = "filesystem"
            if kind is not None:
                attempt(kind)
        finally:
            busy[0] = False

    sys.addaudithook(audit)
    watched = {name: _id(getattr(builtins, name)) for name in dir(builtins)}
    modules = {name: _id(m) for name, m in sys.modules.items()}
    used = [
        (m, name, _id(getattr(m, name)))
        for m in (json, os)
        for name in ("dumps", "loads", "write", "dup2")
        if hasattr(m, name)
    ]

    result: dict[str, object] = {}
    ns: dict = {"__name__": "candidate", "__builtins__": builtins}
    try:
        exec(compile(job["code"], "<candidate>", "exec"), ns)
        fn = ns[job["fn"]]
    except SystemExit:
        attempt("early_exit")
        result["error"] = "does not load: exits while loading"
    except MemoryError:
        attempt("memory")
        result["error"] = "does not load: MemoryError"
    except BaseException as e:  # noqa: BLE001 - any failure to load is the candidate's
        result["error"] = "does not load: " + _type(e).__name__ + ": " + _str(e)[:200]
    else:
        outputs = []
        for x in _loads(job["inputs"]):  # a fresh copy per run, from JSON
            try:
                y = fn(x)
            except SystemExit:
                attempt("early_exit")
                outputs.append({"raises": "SystemExit"})
                continue
            except MemoryError:
                attempt("memory")
                outputs.append({"raises": "MemoryError"})
                continue
            except BaseException as e:  # noqa: BLE001
                outputs.append({"raises": _type(e).__name__})
                continue
            try:
                text = _checked_repr(y, [_MAX_ITEMS])
            except BaseException:  # noqa: BLE001 - an int past repr's digit limit, a structure too deep
                text = None
            if text is None:
                attempt("bad_output")
                outputs.append({"bad": _type(y).__name__})
            elif _len(text) > _MAX_REPR:
                outputs.append({"bad": "too long"})
            else:
                outputs.append({"repr": text})
        result["outputs"] = outputs
    if (
        any(_id(getattr(builtins, n, None)) != i for n, i in watched.items())
        or any(_id(sys.modules.get(n)) != i for n, i in modules.items())
        or any(_id(getattr(m, n, None)) != i for m, n, i in used)
    ):
        attempt("tamper")
    send({"result": result})


main()
