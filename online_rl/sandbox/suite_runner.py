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
An outcome is pass, fail, error or skip; an expected failure counts as pass, an unexpected success as fail.
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

    def send(message):
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(channel, data) :]

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
    send({"tests": [t.id() for t in tests]})

    rank = {"pass": 0, "skip": 1, "fail": 2, "error": 3}

    class Record(unittest.TestResult):
        def __init__(self):
            super().__init__()
            self.outcomes = {}
            self._t0 = 0.0

        def _set(self, test, outcome):
            tid = test.id()
            prev = self.outcomes.get(tid, ["pass", 0.0])
            if rank[outcome] >= rank[prev[0]]:
                self.outcomes[tid] = [outcome, prev[1]]

        def startTest(self, test):
            super().startTest(test)
            self._t0 = time.perf_counter()
            self.outcomes[test.id()] = ["pass", 0.0]

        def stopTest(self, test):
            super().stopTest(test)
            if test.id() in self.outcomes:
                self.outcomes[test.id()][1] = round(time.perf_counter() - self._t0, 4)

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

    for i in range(job["repeats"]):
        suite = unittest.TestSuite(tests if i == 0 else collect())  # fresh test instances each repeat
        result = Record()
        try:
            suite.run(result)
        except BaseException as e:  # noqa: BLE001 - a test that exits the process still gets its repeat reported
            send({"repeat": i, "outcomes": result.outcomes, "aborted": type(e).__name__})
            return
        send({"repeat": i, "outcomes": result.outcomes})


main()
