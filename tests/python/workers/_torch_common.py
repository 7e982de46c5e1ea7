"""Helpers for the braid.torch rank programs: tensor comparisons on top of _common's."""

import torch

from _common import fail

# Tolerances per dtype (rtol, atol): references are computed in float64 from the same inputs.
TOL = {
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1e-2, 1e-2),
    torch.float32: (1e-5, 1e-6),
    torch.float64: (1e-12, 1e-12),
}


def check_tensor(got, want, what, tol=None):
    """Same dtype and shape, values equal (integers, bool) or close (floats)."""
    if not isinstance(got, torch.Tensor):
        return fail(f"{what}: expected a torch.Tensor, got {type(got).__name__}")
    if got.dtype != want.dtype:
        return fail(f"{what}: dtype {got.dtype}, expected {want.dtype}")
    if tuple(got.shape) != tuple(want.shape):
        return fail(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if want.is_floating_point():
        rtol, atol = tol or TOL[want.dtype]
        close = torch.isclose(got.double(), want.double(), rtol=rtol, atol=atol)
    else:
        close = got == want
    if not bool(close.all()):
        bad = (~close).nonzero()
        idx = tuple(bad[0].tolist()) if bad.numel() else ()
        return fail(f"{what}: {int((~close).sum())} elements differ, first at {idx}: got "
                    f"{got[idx].item() if got.dim() else got.item()}, expected "
                    f"{want[idx].item() if want.dim() else want.item()}")
    return True
