"""The replica boundary, attacked as an outsider on the serving network would (DESIGN, Trust boundaries):
the session's replica runs with its inference and admin keys (tests/conftest.py), and SGLang itself
refuses every caller without the right one. Before, a replica had no key: anyone who reached it could
generate without being logged, load any checkpoint path under the current version label, or send
/update_weights_from_tensor a pickled payload (code execution as the replica)."""

from __future__ import annotations

import base64
import os
import pickle
from pathlib import Path

import psutil
import pytest

from contracts import replica_keys
from tests.helpers import post

pytestmark = pytest.mark.timeout(300)

GENERATE = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2, "temperature": 0.0}}


class Boom:
    """A payload whose unpickling would run code: the file appears if the replica ever unpickles it."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _get(url: str, key: str | None = None) -> int:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers=replica_keys.bearer(key))
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_replica_refuses_callers_without_the_key_of_their_role(replica, test_model, tmp_path):
    inference, admin = replica_keys.inference_key(), replica_keys.admin_key()
    assert inference and admin and replica.api_key == inference and replica.admin_api_key == admin
    # Generating: the inference key only (the admin key is not accepted there either: one credential per role).
    assert post(f"{replica.url}/generate", GENERATE)[0] == 401
    assert post(f"{replica.url}/generate", GENERATE, key="fw-replica-inference-guessed")[0] == 401
    assert post(f"{replica.url}/generate", GENERATE, key=admin)[0] == 401
    assert post(f"{replica.url}/generate", GENERATE, key=inference)[0] == 200
    assert _get(f"{replica.url}/model_info") == 401 and _get(f"{replica.url}/model_info", inference) == 200

    # Switching weights: the admin key only. Any checkpoint path under the current label, refused unread.
    load = {"model_path": str(test_model), "weight_version": "0", "flush_cache": True}
    for key in (None, inference):
        assert post(f"{replica.url}/update_weights_from_disk", load, key=key)[0] == 401
        assert post(f"{replica.url}/flush_cache", {}, key=key)[0] == 401
        assert post(f"{replica.url}/abort_request", {"rid": "x", "abort_all": True}, key=key)[0] == 401
        assert post(f"{replica.url}/pause_generation", {"mode": "abort"}, key=key)[0] == 401

    # A pickled payload (what /update_weights_from_tensor unpickles): refused before it is read.
    marker = tmp_path / "unpickled"
    payload = base64.b64encode(pickle.dumps(Boom(str(marker)))).decode()
    tensor = {"serialized_named_tensors": [payload], "load_format": None, "flush_cache": False}
    for key in (None, inference):
        assert post(f"{replica.url}/update_weights_from_tensor", tensor, key=key)[0] == 401
    assert not marker.exists()

    # Probes and Prometheus stay open: they carry no secret and change nothing.
    assert _get(f"{replica.url}/health_generate") == 200 and _get(f"{replica.url}/metrics") == 200


def test_no_key_is_on_any_command_line_of_the_replica_or_its_children(replica):
    procs = [psutil.Process(replica.pid), *psutil.Process(replica.pid).children(recursive=True)]
    assert len(procs) >= 2  # the launcher and SGLang's scheduler at least
    for p in procs:
        cmdline = " ".join(p.cmdline())
        assert replica.api_key not in cmdline and replica.admin_api_key not in cmdline, p.pid
    assert "serving.replica.launch" in " ".join(procs[0].cmdline())
    # Nor in the replica's log.
    log = Path(replica.log_file).read_text(errors="replace")
    assert replica.api_key not in log and replica.admin_api_key not in log


def test_the_inference_key_does_not_read_the_admin_key_back(replica):
    """/server_info answers inference-key holders with the server's arguments: the admin key must not be
    among them, or the gateway's key would unlock the weights."""
    import json
    import urllib.request

    req = urllib.request.Request(f"{replica.url}/server_info", headers=replica_keys.inference_headers())
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    info = json.loads(text)
    assert info  # it answered
    assert replica.admin_api_key not in text and replica.api_key not in text
    assert os.environ[replica_keys.ADMIN_ENV] not in text
