"""The approximate index of a large library's RetrievalIndex (retrieval.py says why this one, and how it is
used): `IvfIndex` proposes candidates, which the RetrievalIndex re-scores exactly. It is trained here,
serialised (index_files.py keeps it on disk) and loaded back; faiss is imported only then.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# faiss warns (and k-means degrades) with fewer than 39 training points per list.
_MIN_POINTS_PER_LIST = 39
# 64 points per list train centroids as well as faiss's default 256 here (recall 1.000 either way at
# 100k) at a quarter of the k-means time; 10 iterations instead of 25 likewise.
_TRAIN_POINTS_PER_LIST = 64
_KMEANS_ITERATIONS = 10


class IvfIndex:
    """A candidate generator: faiss IndexIVFScalarQuantizer (8 bits per dimension) over unit vectors,
    row number = faiss id (rows are added in order). Its scores are approximate; the caller re-scores
    candidates exactly from the float32 matrix, which is why 8-bit codes suffice (a quarter of the
    memory of IVFFlat's float copy, and of the file that start-up loads)."""

    def __init__(self, index: Any, quantizer: Any = None) -> None:
        self._index = index
        self._quantizer = quantizer  # a trained index only references its quantizer: keep it alive
        self.size = int(index.ntotal)
        self.nlist = int(index.nlist)

    @classmethod
    def train(cls, vectors: np.ndarray, *, seed: int) -> IvfIndex:
        import faiss  # imported only when a library is large enough to need it

        n, dim = vectors.shape
        nlist = max(1, min(round(4 * math.sqrt(n)), n // _MIN_POINTS_PER_LIST))
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFScalarQuantizer(
            quantizer, dim, nlist, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
        )
        index.cp.seed = seed
        index.cp.spherical = True  # unit-norm centroids: assigning by inner product is assigning by cosine
        index.cp.niter = _KMEANS_ITERATIONS
        index.cp.max_points_per_centroid = _TRAIN_POINTS_PER_LIST
        index.train(vectors)
        index.add(vectors)
        return cls(index, quantizer)

    @classmethod
    def deserialize(cls, data: np.ndarray) -> IvfIndex:
        import faiss

        return cls(faiss.deserialize_index(data))

    def candidates(self, query: np.ndarray, k: int, nprobe: int) -> np.ndarray:
        """Rows of up to k approximately best matches among the nprobe lists nearest the query."""
        import faiss

        # Parameters are per call, not set on the index: concurrent searches must not share them.
        params = faiss.SearchParametersIVF(nprobe=min(nprobe, self.nlist))
        _scores, rows = self._index.search(query.reshape(1, -1), k, params=params)
        return rows[0][rows[0] >= 0]  # -1 marks "fewer than k found in the probed lists"

    def serialize(self) -> bytes:
        import faiss

        return bytes(faiss.serialize_index(self._index))
