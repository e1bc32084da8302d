"""Float64 references every kernel is checked against (CPU path and Triton alike)."""

from __future__ import annotations

import numpy as np
import torch


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (..., K) @ w (N, K)^T -> (..., N), in float64."""
    return x.double() @ w.double().T


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return weight.double() * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.double(), dim=-1)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x.double(), dim=-1)


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Largest k per row; ties go to the lower index."""
    order = np.lexsort((np.broadcast_to(np.arange(x.shape[-1]), x.shape), -x.double().numpy()), axis=-1)[..., :k]
    ids = torch.from_numpy(np.ascontiguousarray(order))
    return x.gather(-1, ids), ids


def xor_split(new: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, int]:
    """Byte planes of new ^ base, element by element in Python (the slow, obvious definition)."""
    itemsize = new.dtype.itemsize
    n = new.size
    planes = np.zeros(itemsize * n, np.uint8)
    changed = 0
    for i, (a, b) in enumerate(zip(new.tolist(), base.tolist())):
        x = a ^ b
        changed += x != 0
        for k in range(itemsize):
            planes[k * n + i] = (x >> (8 * k)) & 0xFF
    return planes, changed
