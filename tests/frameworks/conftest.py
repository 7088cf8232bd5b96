"""Fixtures the framework tests share."""

from __future__ import annotations

import jax
import pytest
import torch


@pytest.fixture(scope="module")
def fp32_pinned():
    """Full-precision float32 matmuls in both frameworks (no TF32) for the module that asks for it, restored
    afterwards: parity to fp32 rounding needs the same rounding on both sides."""
    prev_torch = torch.get_float32_matmul_precision()
    prev_tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with jax.default_matmul_precision("highest"):
        yield
    torch.set_float32_matmul_precision(prev_torch)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev_tf32
