"""Pooling: max or average over whole windows, without padding."""

from __future__ import annotations

import numpy as np

from mnngpu.errors import ModelFormatError
from mnngpu.ops.common import ALWAYS, OpType, evaluated


def pooling(node, inputs):
    """Max or average pooling of [n, c, h, w] (a 3-D [n, c, h] input is [n, c, h, 1] and its
    output keeps three axes), over whole windows without padding."""
    p, x = node.param, inputs[0]
    if p.isGlobal or p.padType != "CAFFE" or p.padX or p.padY or any(p.pads or ()):
        raise ModelFormatError("an unpadded, non-global Pooling (padType CAFFE); padded and global pooling are "
                               "not implemented", field=f"{node.name}.pads")
    shaped = x.reshape(*x.shape, 1) if x.ndim == 3 else x
    h, w = shaped.shape[2:]
    oh, ow = (h - p.kernelY) // p.strideY + 1, (w - p.kernelX) // p.strideX + 1
    if p.ceilModel and ((h - p.kernelY) % p.strideY or (w - p.kernelX) % p.strideX):
        raise ModelFormatError("a Pooling whose windows tile its input (ceilModel with a partial last window is "
                               "not implemented)", field=f"{node.name}.ceilModel")
    windows = np.stack([shaped[:, :, ky: ky + p.strideY * (oh - 1) + 1: p.strideY,
                               kx: kx + p.strideX * (ow - 1) + 1: p.strideX]
                        for ky in range(p.kernelY) for kx in range(p.kernelX)])
    pooled = windows.max(axis=0) if p.type == "MAXPOOL" else windows.mean(axis=0, dtype=np.float32)
    return pooled.astype(x.dtype, copy=False).reshape(pooled.shape[:3] if x.ndim == 3 else pooled.shape)


ROWS = {
    "Pooling": OpType(evaluated(pooling), pooling, param="Pool", param_required=ALWAYS),
}
