"""MR19 and scale-out: not a reduction, so comm= and dask arrays are refused
with the reason; memmaps are accepted and give the in-memory result."""

import warnings

import numpy as np
import pytest
from scipy import stats

import relufast as rf
from relufast import mr19
from relufast.planted import relu_codes, relu_dictionary


class _AnyComm:
    def Get_rank(self):
        return 0

    def Get_size(self):
        return 2

    def allgather(self, value):  # never reached: MR19 refuses before communicating
        raise AssertionError("MR19 must refuse comm= before any collective")


def test_comm_is_refused_with_the_reason():
    P = relu_codes(60, 3, 2, random_state=0)
    D = relu_dictionary(20, 30, 2, random_state=0)
    with pytest.raises(ValueError, match="does not take comm=.*not a pass over samples that reduces"):
        mr19.robust_recover(P.A, P.v, comm=_AnyComm())
    with pytest.raises(ValueError, match="does not take comm=.*n x d matrix"):
        mr19.column_space(D.Y, 2, method="centered", comm=_AnyComm())
    with pytest.raises(ValueError, match="mr19.ml_estimate does not take comm="):
        mr19.ml_estimate(D.Y, bias=stats.norm(0, 0.3), comm=_AnyComm())


def test_dask_is_refused_with_the_reason():
    da = pytest.importorskip("dask.array")
    P = relu_codes(60, 3, 2, random_state=0)
    D = relu_dictionary(20, 30, 2, random_state=0)
    with pytest.raises(TypeError, match="needs A in memory.*not a dask array"):
        mr19.robust_recover(da.from_array(P.A, chunks=20), P.v)
    with pytest.raises(TypeError, match="needs v in memory"):
        mr19.robust_recover(P.A, da.from_array(P.v, chunks=20))
    with pytest.raises(TypeError, match=r"needs Y in memory.*compute\(\)"):
        mr19.column_space(da.from_array(D.Y, chunks=10), 2, method="centered")


def test_memmaps_give_the_in_memory_result(tmp_path):
    P = relu_codes(400, 8, 6, n_codes=3, random_state=3)
    D = relu_dictionary(100, 200, 3, bias=stats.norm(0, 0.3), random_state=0)
    for name, a in (("A", P.A), ("v", P.v), ("Y", D.Y)):
        np.save(tmp_path / f"{name}.npy", a)
    A, v, Y = (np.load(tmp_path / f"{n}.npy", mmap_mode="r") for n in ("A", "v", "Y"))
    ref, got = mr19.robust_recover(P.A, P.v), mr19.robust_recover(A, v)
    np.testing.assert_array_equal(got.c, ref.c)
    np.testing.assert_array_equal(got.outliers, ref.outliers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        for method in ("ml", "centered"):
            a = mr19.column_space(D.Y, 3, method=method, bias=stats.norm(0, 0.3))
            b = mr19.column_space(Y, 3, method=method, bias=stats.norm(0, 0.3))
            np.testing.assert_array_equal(a.basis, b.basis)
