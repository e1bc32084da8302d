"""The prepared GPU script: refuses clearly where it cannot measure anything (no CUDA); passes on a GPU."""

import torch

from kernels import gpu_check


def test_refuses_without_a_gpu_and_passes_with_one(tmp_path, capsys):
    if torch.cuda.is_available():
        assert gpu_check.main(tmp_path / "r.json") == 0
        return
    assert gpu_check.main(tmp_path / "r.json") == 2
    assert "needs a CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()
