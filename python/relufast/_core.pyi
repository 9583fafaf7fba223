"""Type stub for relufast._core (and relufast._core_avx2, the same API built for AVX2/FMA)."""

from typing import Any, TypedDict

import numpy as np
from numpy.typing import NDArray

def hardware_threads() -> int: ...
def cpu_has_avx2_fma() -> bool: ...
def compiled_with_avx2() -> bool: ...
def cpu_has_avx512() -> bool: ...
def compiled_with_avx512() -> bool: ...
def _set_deadline(seconds: float) -> None: ...
def _fault_pipeline(
    n: int,
    block: int,
    n_jobs: int,
    stage: str = "none",
    at: int = 0,
    sleep_us: int = 0,
    slow_until: int = ...,
    time_limit: float = 0.0,
) -> float: ...

class SecondMoment:
    """Mergeable accumulator of sum_s y_s (x) x_s x_s^T (BJW19 Sec. 4.2)."""

    def __init__(self, d: int, m: int) -> None: ...
    def update(
        self,
        X: NDArray[np.float64],
        Y: NDArray[np.float64],
        n_jobs: int = 0,
        block: int = 256,
        Q: NDArray[np.float64] | None = None,
        dgemm: object | None = None,
    ) -> None: ...
    def merge(self, other: SecondMoment) -> None: ...
    def tensor(self) -> NDArray[np.float64]: ...
    def set_state(self, count: float, sum_y: NDArray[np.float64], sum_yxx: NDArray[np.float64]) -> None: ...
    def state(self) -> dict[str, Any]: ...
    @property
    def d(self) -> int: ...
    @property
    def m(self) -> int: ...
    @property
    def count(self) -> float: ...
    @property
    def sum_y(self) -> NDArray[np.float64]: ...
    @property
    def sum_yxx(self) -> NDArray[np.float64]: ...

class DetectorMoment:
    """GKLW19 pure-neuron detector matrix in covariance form (mergeable)."""

    def __init__(self, M: NDArray[np.float64]) -> None: ...
    def update(self, X: NDArray[np.float64], Y: NDArray[np.float64], n_jobs: int = 0, block: int = 256) -> None: ...
    def merge(self, other: DetectorMoment) -> None: ...
    def matrix(self, centred: bool = True) -> NDArray[np.float64]: ...
    def set_state(
        self,
        count: float,
        sum_phipsi: NDArray[np.float64],
        sum_phi: NDArray[np.float64],
        sum_psi: NDArray[np.float64],
    ) -> None: ...
    def state(self) -> dict[str, Any]: ...
    @property
    def count(self) -> float: ...
    @property
    def d(self) -> int: ...
    @property
    def k(self) -> int: ...

class _ReluStats(TypedDict):
    gram: NDArray[np.float64]
    cross: NDArray[np.float64]
    sq_residual: float
    sq_norm: float
    count: float

def relu_stats(
    X: NDArray[np.float64],
    Y: NDArray[np.float64],
    V: NDArray[np.float64],
    U: NDArray[np.float64] | None = None,
    n_jobs: int = 0,
    block: int = 4096,
    power: float = 1.0,
    b: NDArray[np.float64] | None = None,
    intercept: bool = False,
) -> _ReluStats: ...

class _RefineOut(TypedDict):
    rows: NDArray[np.float64]
    certified: NDArray[np.bool_]
    solved: NDArray[np.bool_]
    sign: NDArray[np.int32]
    margin: NDArray[np.float64]
    null_ratio: NDArray[np.float64]
    gap_ratio: NDArray[np.float64]
    other_ratio: NDArray[np.float64]
    verify_residual: NDArray[np.float64]
    n_zero: NDArray[np.int64]
    support: NDArray[np.int64]

class _PatternOut(TypedDict):
    words: NDArray[np.uint64]
    coeffs: NDArray[np.float64]
    systems: int

def pattern_subset_count(n: int, k: int, mode: str) -> int: ...
def enumerate_patterns(
    B: NDArray[np.float64],
    mode: str,
    begin: int,
    end: int,
    tol: float = 1e-9,
    n_jobs: int = 0,
    time_limit: float = 0.0,
) -> _PatternOut: ...
def enumerate_patterns_for(
    B: NDArray[np.float64],
    mode: str,
    subsets: NDArray[np.int64],
    tol: float = 1e-9,
    n_jobs: int = 0,
    time_limit: float = 0.0,
) -> _PatternOut: ...
def refine_rows(
    B: NDArray[np.float64],
    X: NDArray[np.float64],
    Vhat: NDArray[np.float64],
    margins: list[float] = ...,
    tol_null: float = 1e-10,
    tol_gap: float = 1e-6,
    tol_verify: float = 1e-9,
    tol_support: float = 1e-9,
    min_zeros: int = 0,
    n_jobs: int = 0,
    power: float = 1.0,
    approximate: bool = True,
) -> _RefineOut: ...

class Hermite4Contraction:
    """GP19 Sec. 2.1: mergeable sums of ft y^p and ft y^p x (y = Z x, ft = f - offset) over active rows."""

    def __init__(
        self,
        Z: NDArray[np.float64],
        offset: float,
        active_tol: float = 0.0,
        second: bool = False,
        pairs: bool = False,
    ) -> None: ...
    def update(self, X: NDArray[np.float64], f: NDArray[np.float64], n_jobs: int = 0, block: int = 1024) -> None: ...
    def merge(self, other: Hermite4Contraction) -> None: ...
    def state(self) -> dict[str, float | NDArray[np.float64]]: ...
    def set_state(
        self,
        count: float,
        n_active: float,
        s0: float,
        S: NDArray[np.float64],
        G1: NDArray[np.float64],
        G3: NDArray[np.float64],
        M: NDArray[np.float64],
        S11: NDArray[np.float64],
        S22: NDArray[np.float64],
        GP: NDArray[np.float64],
    ) -> None: ...
    @property
    def n(self) -> int: ...
    @property
    def r(self) -> int: ...
    @property
    def count(self) -> float: ...
    @property
    def n_active(self) -> float: ...
    @property
    def s0(self) -> float: ...
    @property
    def S(self) -> NDArray[np.float64]: ...
    @property
    def G1(self) -> NDArray[np.float64]: ...
    @property
    def G3(self) -> NDArray[np.float64]: ...
    @property
    def M(self) -> NDArray[np.float64]: ...
    @property
    def S11(self) -> NDArray[np.float64]: ...
    @property
    def S22(self) -> NDArray[np.float64]: ...
    @property
    def GP(self) -> NDArray[np.float64]: ...

class _Certificate(_ReluStats):
    nonfinite: float

def certify(
    X: NDArray[np.float64],
    Y: NDArray[np.float64],
    V: NDArray[np.float64],
    U: NDArray[np.float64] | None = None,
    n_jobs: int = 0,
    block: int = 4096,
    power: float = 1.0,
    normal_equations: bool = True,
    b: NDArray[np.float64] | None = None,
    intercept: bool = False,
) -> _Certificate: ...
def count_nonfinite(A: NDArray[np.float64], n_jobs: int = 0, block: int = 8192) -> float: ...

# ---- ATV21: projected Hermite sums and activation-region refinement ----

class HermiteSums:
    """Mergeable raw sums sum_s y_si z_s^(x r), r <= order (<= 6), z = P^T x (ATV21 Alg. 4)."""

    def __init__(self, k: int, m: int, order: int) -> None: ...
    def update(
        self,
        X: NDArray[np.float64],
        Y: NDArray[np.float64],
        P: NDArray[np.float64] | None = None,
        n_jobs: int = 0,
        block: int = 256,
    ) -> None: ...
    def merge(self, other: HermiteSums) -> None: ...
    def sums(self, r: int) -> NDArray[np.float64]: ...
    def state(self) -> dict[str, float | NDArray[np.float64]]: ...
    def set_state(self, count: float, **sums: NDArray[np.float64]) -> None: ...
    @property
    def k(self) -> int: ...
    @property
    def m(self) -> int: ...
    @property
    def order(self) -> int: ...
    @property
    def count(self) -> float: ...

class _RegionSystems(TypedDict):
    keys: NDArray[np.uint64]
    counts: NDArray[np.float64]
    gram: NDArray[np.float64]
    cross: NDArray[np.float64]
    sq_res: NDArray[np.float64]
    fgram: NDArray[np.float64]
    fcross: NDArray[np.float64]
    sq_residual: float
    sq_norm: float
    n_certain: float
    count: float

def region_systems(
    X: NDArray[np.float64],
    Y: NDArray[np.float64],
    V: NDArray[np.float64],
    b: NDArray[np.float64],
    U: NDArray[np.float64],
    c: NDArray[np.float64],
    margin: NDArray[np.float64],
    mask: NDArray[np.bool_] | None = None,
    max_regions: int = 65536,
    n_jobs: int = 0,
    block: int = 4096,
) -> _RegionSystems: ...
def region_residuals(
    X: NDArray[np.float64],
    Y: NDArray[np.float64],
    V: NDArray[np.float64],
    b: NDArray[np.float64],
    U: NDArray[np.float64],
    c: NDArray[np.float64],
    margin: NDArray[np.float64],
    dC: NDArray[np.float64],
    dc: NDArray[np.float64],
    n_jobs: int = 0,
    block: int = 4096,
) -> NDArray[np.float64]: ...

# ---- Lattice reduction (the signs of layers wider than their equations) ----

class _LllResult(TypedDict):
    basis: NDArray[np.float64]
    swaps: int
    complete: bool

def lll_reduce(B: NDArray[np.float64], delta: float = 0.99, max_swaps: int = 10000000) -> _LllResult: ...
def slice_products(
    P: NDArray[np.float64],
    k1: int,
    C: NDArray[np.float64],
    W: NDArray[np.float64] | None = None,
    dgemm: object | None = None,
    n_jobs: int = 0,
    out: NDArray[np.float64] | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]: ...
def slice_weighted_sum(S: NDArray[np.float64], A: NDArray[np.float64], n_jobs: int = 0) -> NDArray[np.float64]: ...
