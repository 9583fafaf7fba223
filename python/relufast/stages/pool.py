"""The pool of certified rows: one row per hidden unit, with its certificate from
:func:`relufast.stages.refine.refine_rows` (BJW19 Alg. 5)."""

from __future__ import annotations

import numpy as np

__all__ = ["CERT_FIELDS", "DUPLICATE_COS", "RowPool"]

#: Rows whose |cos| exceeds this are the same hidden unit.
DUPLICATE_COS = 1.0 - 1e-6
#: Fields of :func:`refine_rows`' output kept as a row's certificate.
CERT_FIELDS = ("margin", "null_ratio", "gap_ratio", "other_ratio", "verify_residual", "support")


class RowPool:
    """Certified rows pooled over restarts, one per hidden unit (duplicates dropped).

    Parameters
    ----------
    k : int
        Rows wanted.
    """

    def __init__(self, k):
        self.k = k
        self.rows = []
        self.certificates = []

    def __len__(self):
        return len(self.rows)

    @property
    def full(self):
        return len(self.rows) >= self.k

    def is_new(self, row):
        unit = row / np.linalg.norm(row)
        return all(abs(unit @ c) < DUPLICATE_COS * np.linalg.norm(c) for c in self.rows)

    def add(self, row, certificate=None):
        """Add a certified row unless it duplicates one in the pool; returns whether added."""
        if not self.is_new(row):
            return False
        self.rows.append(np.asarray(row, dtype=np.float64))
        self.certificates.append(certificate or {})
        return True

    def add_certified(self, out, rows=None):
        """Add every certified row of a :func:`refine_rows` output (``rows`` overrides the
        solved rows, e.g. mapped back from whitened coordinates)."""
        rows = out["rows"] if rows is None else rows
        for i in np.flatnonzero(out["certified"]):
            self.add(rows[i], {key: out[key][i] for key in CERT_FIELDS})
        return self
