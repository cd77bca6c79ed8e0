"""flashinfer.quantization: packbits and segment_packbits (the masks' bit packing)."""

from kvattn.flashinfer._common import _like, _np


def packbits(x, bitorder: str = "big"):
    """numpy.packbits of a flat bool array (bitorder 'big' or 'little')."""
    import numpy as np

    return _like(np.packbits(_np(x).astype(bool).ravel(), bitorder=bitorder), x)


def segment_packbits(x, indptr, bitorder: str = "big"):
    """Packs each segment x[indptr[i]:indptr[i+1]] on its own (each starts a new byte). Returns
    (packed, new_indptr)."""
    import numpy as np

    flat = _np(x).astype(bool).ravel()
    ind = _np(indptr).astype(np.int64)
    parts = [np.packbits(flat[ind[i]:ind[i + 1]], bitorder=bitorder) for i in range(len(ind) - 1)]
    new = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int32)
    packed = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    return _like(packed, x), _like(new, indptr)
