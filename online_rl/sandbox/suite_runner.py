"""The program that runs inside the sandbox for a test-suite job: one test module of a repository, run with unittest.

Standard library only, started as `python -I -S -B -c <this file>` (as online_rl.sandbox.runner is). Protocol: the
job arrives as one JSON object on stdin: the repository's files (relative path -> text) to write into the work dir,
the folders to put first on sys.path, the test module to import, the test ids to keep (all when null), the modules to
import afresh from the work dir (a stdlib module whose copy there has a body deleted), and how many times to run the
tests in this one process. JSON lines go back on stdout, the only channel out: `{"tests": [ids]}` once collected, then
`{"repeat": i, "outcomes": {id: [outcome, seconds]}}` after each repeat (so a run killed at the wall-clock limit
still reports the repeats it finished), or one `{"error": text}` if the module does not import. Each repeat runs
fresh test instances in the same process, as pytest-flakefinder reruns tests: a test whose outcome depends on what an
earlier run of it left behind is seen as flaky.

Tests are unittest's (TestCase classes, with their class and module fixtures) and pytest-style plain `test*`
functions and `Test*` classes whose test methods take no argument (no fixtures: pytest is not in the sandbox).
An outcome is pass, fail, error or skip; an expected failure counts as pass, an unexpected success as fail. A test
passes only when unittest reports its success (addSuccess): one that started and stopped with no outcome is an error.
The code under test runs in this process, so it could rebind the machinery that runs and records tests (a
`TestCase.run` that only starts and stops each test): the runner keeps what that machinery is bound to before it
imports anything of the work dir, and checks it again after the imports and after each repeat; any change is reported
as one `{"error": "tampered: ..."}` and no outcomes.
"""

import importlib
import inspect
import json
import os
import resource
import sys
import time
import unittest  # before the work dir goes on sys.path: the runner's own unittest is the stdlib's, never a copy


def _plain_tests(module):
    """pytest-style tests: module-level `test*` functions and `Test*` classes (not TestCase) that take no argument."""

    class Plain(unittest.FunctionTestCase):
        def __init__(self, fn, test_id):
            super().__init__(fn)
            self._test_id = test_id

        def id(self):
            return self._test_id

        def __str__(self):
            return self._test_id

    def takes_nothing(fn, skip=0):
        try:
            params = list(inspect.signature(fn).parameters.values())[skip:]
        except (TypeError, ValueError):
            return False
        return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)

    def method_test(cls, name):
        def call():
            obj = cls()
            if hasattr(obj, "setup_method"):
                obj.setup_method(getattr(obj, name))
            try:
                getattr(obj, name)()
            finally:
                if hasattr(obj, "teardown_method"):
                    obj.teardown_method(getattr(obj, name))

        return call

    out = []
    for name, obj in list(vars(module).items()):
        if name.startswith("test") and inspect.isfunction(obj) and obj.__module__ == module.__name__:
            if takes_nothing(obj) and not inspect.iscoroutinefunction(obj):
                out.append(Plain(obj, f"{module.__name__}.{name}"))
        elif (
            name.startswith("Test")
            and inspect.isclass(obj)
            and not issubclass(obj, unittest.TestCase)
            and obj.__module__ == module.__name__
            and takes_nothing(obj.__init__, 1)
        ):
            for m in sorted(vars(obj)):
                fn = getattr(obj, m)
                if m.startswith("test") and inspect.isfunction(fn) and takes_nothing(fn, 1):
                    out.append(Plain(method_test(obj, m), f"{module.__name__}.{name}.{m}"))
    return out


def _flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _flatten(t)
        else:
            yield t


# What runs and records tests, and what reports them: rebinding any of these from the code under test is tampering.
_GUARDED_MODULES = ("unittest", "unittest.case", "unittest.suite", "unittest.result", "unittest.loader", "json")
_UNBOUND = object()


def _guarded(extra):
    """The runner's own modules (kept as objects: a `fresh` module imported again from the work dir is another one)
    and classes whose bindings are guarded."""
    mods = [sys.modules[name] for name in _GUARDED_MODULES] + [sys.modules["json.encoder"]]
    return mods, list(extra)


def _bindings(guarded):
    """Name -> the object it is bound to now, for the guarded modules' globals, their classes' attributes and the
    extra classes' attributes (compared by identity: a rebinding shows, a list appended to does not)."""
    mods, classes = guarded[0], list(guarded[1])
    seen = {}
    for mod in mods:
        for attr, value in list(vars(mod).items()):
            if attr != "__warningregistry__":  # a warning issued from the module's code adds it
                seen[f"{mod.__name__}:{attr}"] = value
            if inspect.isclass(value) and value.__module__ == mod.__name__:
                classes.append(value)
    for cls in classes:
        for attr, value in list(vars(cls).items()):
            seen[f"{cls.__module__}.{cls.__qualname__}.{attr}"] = value
    return seen


def _changed(before, guarded):
    now = _bindings(guarded)
    return sorted(k for k in before.keys() | now.keys() if before.get(k, _UNBOUND) is not now.get(k, _UNBOUND))


def main():
    job = json.loads(sys.stdin.buffer.read())
    channel = os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    work = job["work_dir"]
    os.chdir(work)
    for rel, text in job["files"].items():
        path = os.path.join(work, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    lim = job["limits"]
    for which, value in (
        (resource.RLIMIT_CPU, (lim["cpu_seconds"], lim["cpu_seconds"] + 1)),
        (resource.RLIMIT_AS, (lim["memory_mb"] << 20,) * 2),
        (resource.RLIMIT_FSIZE, (lim["file_bytes"],) * 2),
        (resource.RLIMIT_NOFILE, (lim["open_files"],) * 2),
        (resource.RLIMIT_NPROC, (lim["processes"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(which, value)

    def send(message, dumps=json.dumps, write=os.write):  # bound now, before any code of the work dir runs
        data = (dumps(message) + "\n").encode()
        while data:
            data = data[write(channel, data) :]

    rank = {"started": -1, "pass": 0, "skip": 1, "fail": 2, "error": 3}  # started: no outcome yet

    class Record(unittest.TestResult):
        def __init__(self):
            super().__init__()
            self.outcomes = {}
            self._t0 = 0.0

        def _set(self, test, outcome):
            tid = test.id()
            prev = self.outcomes.get(tid, ["started", 0.0])
            if rank[outcome] >= rank[prev[0]]:
                self.outcomes[tid] = [outcome, prev[1]]

        def startTest(self, test):
            super().startTest(test)
            self._t0 = time.perf_counter()
            self.outcomes[test.id()] = ["started", 0.0]

        def stopTest(self, test):
            super().stopTest(test)
            if test.id() in self.outcomes:
                self.outcomes[test.id()][1] = round(time.perf_counter() - self._t0, 4)
                if self.outcomes[test.id()][0] == "started":  # stopped with no outcome: not a pass
                    self.outcomes[test.id()][0] = "error"

        def addSuccess(self, test):
            self._set(test, "pass")

        def addFailure(self, test, err):
            self._set(test, "fail")

        def addError(self, test, err):
            self._set(test, "error")

        def addSkip(self, test, reason):
            self._set(test, "skip")

        def addUnexpectedSuccess(self, test):
            self._set(test, "fail")

        def addExpectedFailure(self, test, err):
            self._set(test, "pass")

        def addSubTest(self, test, subtest, err):
            if err is not None:
                self._set(test, "fail" if issubclass(err[0], test.failureException) else "error")

    guarded = _guarded([Record])
    bound = _bindings(guarded)

    for p in reversed(job["paths"]):
        sys.path.insert(0, os.path.join(work, p) if p else work)
    for name in job["fresh"]:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]

    def collect():
        found = list(_flatten(unittest.defaultTestLoader.loadTestsFromModule(module)))
        found += _plain_tests(module)
        select = job.get("select")
        return found if select is None else [t for t in found if t.id() in set(select)]

    try:
        module = importlib.import_module(job["module"])
        tests = collect()
    except BaseException as e:  # noqa: BLE001 - any failure to import is the job's answer
        send({"error": f"import {job['module']}: {type(e).__name__}: {str(e)[:300]}"})
        return
    tampered = _changed(bound, guarded)
    if tampered:
        send({"error": f"tampered: importing {job['module']} rebound {', '.join(tampered)[:300]}"})
        return
    send({"tests": [t.id() for t in tests]})

    for i in range(job["repeats"]):
        suite = unittest.TestSuite(tests if i == 0 else collect())  # fresh test instances each repeat
        result = Record()
        aborted = None
        try:
            suite.run(result)
        except BaseException as e:  # noqa: BLE001 - a test that exits the process still gets its repeat reported
            aborted = type(e).__name__
        tampered = _changed(bound, guarded)
        if tampered:
            send({"error": f"tampered: repeat {i} rebound {', '.join(tampered)[:300]}"})
            return
        if aborted is not None:
            send({"repeat": i, "outcomes": result.outcomes, "aborted": aborted})
            return
        send({"repeat": i, "outcomes": result.outcomes})


main()
