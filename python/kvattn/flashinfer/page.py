"""flashinfer.page: append_paged_kv_cache and its index helpers."""

import kvattn as _kv
from kvattn.flashinfer._common import _check_layout, _like, _np


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                          kv_indices, kv_indptr, kv_last_page_len, kv_layout: str = "NHD") -> None:
    """Writes row r of append_key / append_value at token positions[r] of request
    batch_indices[r] (the page table already counts the appended tokens)."""
    _kv.append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                              (kv_indptr, kv_indices, kv_last_page_len),
                              kv_layout=_check_layout(kv_layout))


def get_seq_lens(kv_indptr, kv_last_page_len, page_size: int):
    """KV length of each request: page_size * (pages - 1) + last_page_len (0 without pages), in
    the framework of kv_indptr."""
    import numpy as np

    ind = _np(kv_indptr).astype(np.int64)
    last = _np(kv_last_page_len).astype(np.int64)
    pages = ind[1:] - ind[:-1]
    lens = np.where(pages > 0, (pages - 1) * page_size + last, 0).astype(np.int32)
    return _like(lens, kv_indptr)


def get_batch_indices_positions(append_indptr, seq_lens, nnz: int):
    """For each of the nnz appended rows: its request and its position, the appended tokens being
    the last append_len of the request's seq_len (FlashInfer's helper). Returns (batch_indices,
    positions), int32, in the framework of append_indptr."""
    import numpy as np

    ind = _np(append_indptr).astype(np.int64)
    lens = _np(seq_lens).astype(np.int64)
    batch = np.zeros(nnz, np.int32)
    pos = np.zeros(nnz, np.int32)
    for b in range(len(ind) - 1):
        a, e = ind[b], ind[b + 1]
        batch[a:e] = b
        pos[a:e] = np.arange(lens[b] - (e - a), lens[b])
    return _like(batch, append_indptr), _like(pos, append_indptr)
