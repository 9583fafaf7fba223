"""Planted two-layer networks and samplers (teacher networks for tests and studies).

Convention: samples are rows; ``Y = relu(X @ V.T) @ U.T``, V of shape (k, d) with unit
rows, U of shape (m, k).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ._validation import check_positive_int, check_random_state
from .activations import GP19_ACTIVATIONS as _GP19_ACTIVATIONS
from .network import Network

__all__ = [
    "PlantedNetwork",
    "two_layer",
    "lemma16_pair",
    "relu_separability_instance",
    "sparse_corruption",
    "gklw19_network",
    "smoothed_perturbation",
    "q_lambda_perturbation",
    "INPUT_DISTRIBUTIONS",
]

#: Input laws accepted by :meth:`PlantedNetwork.sample`. All are symmetric with mean 0;
#: all but "mixture" have identity covariance. "mixture" is GKLW19's two-Gaussian mixture
#: with components at +1 and -1 (the all-ones vector), covariance I + 1 1^T.
INPUT_DISTRIBUTIONS = ("gaussian", "laplace", "uniform", "rademacher", "mixture")


def _draw_inputs(rng, n, d, law):
    if law == "gaussian":
        return rng.standard_normal((n, d))
    if law == "laplace":
        return rng.laplace(scale=1.0 / np.sqrt(2.0), size=(n, d))
    if law == "uniform":
        return rng.uniform(-np.sqrt(3.0), np.sqrt(3.0), size=(n, d))
    if law == "rademacher":
        return rng.choice(np.array([-1.0, 1.0]), size=(n, d))
    if law == "mixture":
        return rng.choice(np.array([-1.0, 1.0]), size=(n, 1)) + rng.standard_normal((n, d))
    raise ValueError(f"input must be one of {INPUT_DISTRIBUTIONS}; got {law!r}")


@dataclass(frozen=True)
class PlantedNetwork(Network):
    """A teacher network ``y = U f(V x + b) + c`` with a sampler (f = ReLU by default).

    Attributes
    ----------
    U : ndarray of shape (n_outputs, n_hidden)
    V : ndarray of shape (n_hidden, n_features), unit-norm rows unless ``row_norms``
    b : ndarray of shape (n_hidden,)
        Hidden biases (zeros for the bias-free models of BJW19 and GKLW19).
    c : ndarray of shape (n_outputs,)
        Output offset (zeros unless planted).
    activation : Activation or None
    """

    def sample(self, n, *, random_state=None, noise=0.0, input="gaussian", symmetrize=False):
        """Draw n samples.

        Parameters
        ----------
        n : int
        random_state : None, int or numpy Generator
        noise : float, default=0.0
            Standard deviation of i.i.d. Gaussian noise added to the outputs.
        input : {"gaussian", "laplace", "uniform", "rademacher", "mixture"}, default="gaussian"
            Law of the inputs (see :data:`INPUT_DISTRIBUTIONS`).
        symmetrize : bool, default=False
            Return 2n samples: the n drawn and their negations (then every odd empirical
            moment of X vanishes exactly, as GKLW19's identities need).

        Returns
        -------
        X : ndarray of shape (n, n_features)
        Y : ndarray of shape (n, n_outputs)
        """
        n = check_positive_int(n, "n")
        if not (np.isfinite(noise) and noise >= 0):
            raise ValueError(f"noise must be a finite number >= 0; got {noise!r}")
        rng = check_random_state(random_state)
        X = _draw_inputs(rng, n, self.n_features, input)
        if symmetrize:
            X = np.vstack([X, -X])
        Y = self(X)
        if noise > 0:
            Y += noise * rng.standard_normal(Y.shape)
        return X, Y


def _draw_param(spec, size, scale, rng, name):
    """Biases/offsets: None (zeros), a number (repeated), "random" (N(0, scale^2)) or values."""
    if spec is None:
        return None
    if isinstance(spec, str):
        if spec != "random":
            raise ValueError(f"{name} must be None, a number, 'random' or an array; got {spec!r}")
        return scale * rng.standard_normal(size)
    a = np.asarray(spec, dtype=np.float64)
    if a.ndim == 0:
        a = np.full(size, float(a))
    if a.shape != (size,) or not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite with shape ({size},); got {a.shape}")
    return a


def _condition(A):
    s = np.linalg.svd(A, compute_uv=False)
    return float(s[0] / s[-1]) if s[-1] > 0 else float(np.inf)


def two_layer(
    d,
    k,
    m,
    *,
    random_state=None,
    condition=None,
    max_condition=None,
    max_cos=None,
    max_output_condition=None,
    orthonormal_U=False,
    orthonormal_V=False,
    activation=None,
    row_norms=None,
    bias=None,
    offset=None,
    max_tries=10000,
):
    """Plant a random two-layer network ``y = U relu(V x + b) + c`` with unit-norm hidden rows.

    Parameters
    ----------
    d, k, m : int
        Input dimension, hidden units, outputs.
    random_state : None, int or numpy Generator
    condition : float, optional
        Make V of condition number about ``condition`` (singular values spaced
        geometrically from 1 to 1/condition, then rows normalised). Without it, rows are
        i.i.d. uniform on the sphere.
    max_condition : float, optional
        Reject-and-redraw until kappa(V) <= max_condition.
    max_cos : float, optional
        Reject-and-redraw until every pair of rows has |cos| <= max_cos.
    max_output_condition : float, optional
        Reject-and-redraw until kappa(U) <= max_output_condition (needs m >= k).
    activation : str, float or Activation, optional
        Rectified activation of the teacher (default ReLU), see :mod:`relufast.activations`.
    row_norms : array-like of shape (k,), optional
        Norms of the rows of V (default 1). Only non-homogeneous activations can tell them
        from a rescaling of U.
    orthonormal_V : bool, default=False
        V with orthonormal rows (BJW19 Thm 4); overrides ``condition``.
    orthonormal_U : bool, default=False
        U with orthonormal columns (needs m >= k), as in BJW19 Thm 14.
    bias : None, float, "random" or array-like of shape (k,), optional
        Hidden biases b: None for none (b = 0), a float for the same bias on every unit,
        "random" for i.i.d. N(0, 1/4) (mostly within the range ATV21 recovers), or the
        values.
    offset : None, "random" or array-like of shape (m,), optional
        Output offset c: None for none, "random" for i.i.d. N(0, 1), or the values.
    max_tries : int, default=10000

    Returns
    -------
    PlantedNetwork
    """
    d = check_positive_int(d, "d")
    k = check_positive_int(k, "k")
    m = check_positive_int(m, "m")
    if k > d:
        raise ValueError(f"k must be at most d for rank(V) = k; got k = {k}, d = {d}")
    if condition is not None and not condition >= 1:
        raise ValueError(f"condition must be >= 1; got {condition!r}")
    rng = check_random_state(random_state)
    for _ in range(max_tries):
        if condition is None:
            V = rng.standard_normal((k, d))
        else:
            Q1 = np.linalg.qr(rng.standard_normal((k, k)))[0]
            Q2 = np.linalg.qr(rng.standard_normal((d, k)))[0]
            V = Q1 @ np.diag(np.geomspace(1.0, 1.0 / condition, k)) @ Q2.T
        if orthonormal_V:
            V = np.linalg.qr(rng.standard_normal((d, k)))[0].T
        V /= np.linalg.norm(V, axis=1, keepdims=True)
        if max_condition is not None and _condition(V) > max_condition:
            continue
        if max_cos is not None and k > 1:
            C = np.abs(V @ V.T) - np.eye(k)
            if C.max() > max_cos:
                continue
        U = rng.standard_normal((m, k))
        if orthonormal_U:
            if m < k:
                raise ValueError(f"orthonormal_U needs m >= k; got m = {m}, k = {k}")
            U = np.linalg.qr(U)[0]
        if max_output_condition is not None and (m < k or _condition(U) > max_output_condition):
            continue
        if row_norms is not None:
            V = V * np.asarray(row_norms, dtype=np.float64).reshape(k, 1)
        act = None
        if activation is not None:
            from .activations import get_activation

            act = get_activation(activation)
        return PlantedNetwork(
            U=U,
            V=V,
            b=_draw_param(bias, k, 0.5, rng, "bias"),
            c=_draw_param(offset, m, 1.0, rng, "offset"),
            activation=act,
        )
    raise ValueError(
        f"no network met the constraints (max_condition={max_condition}, max_cos={max_cos}, "
        f"max_output_condition={max_output_condition}) in {max_tries} draws; relax them"
    )


def sparse_corruption(Y, fraction=0.05, *, scale=10.0, random_state=None):
    """Corrupt a random ``fraction`` of the entries of Y by adding U(-scale, scale) values.

    BJW19 Def. 12 (sparse noise: random support, arbitrary values).

    Returns
    -------
    Y_corrupted : ndarray, same shape as Y
    support : ndarray of bool, same shape as Y
    """
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1]; got {fraction!r}")
    rng = check_random_state(random_state)
    Y = np.array(Y, dtype=np.float64)
    support = rng.random(Y.shape) < fraction
    Y[support] += rng.uniform(-scale, scale, size=int(support.sum()))
    return Y, support


def lemma16_pair(a=1e-3, *, m=1, random_state=None):
    """The two networks of BJW19 Lemma 16 (exact recovery needs n = Omega(kappa(V))).

    ``V1`` has rows ``(1, +-a) / sqrt(1 + a^2)`` and ``V2`` rows ``(1, +-2a) / sqrt(1 + 4a^2)``
    (the paper's V2 has a typo, docs/bjw19.md, erratum 10), both with kappa(V) about 1/a. For m = 1,
    ``U = [s/2, s/2]`` with s the row norm, so both networks output
    ``(relu(x1 + a_i x2) + relu(x1 - a_i x2)) / 2``; on a sample they agree whenever
    ``|x1| > 2a |x2|``, i.e. with probability ``1 - Theta(a)``. For m > 1 both networks
    share a random output direction matrix (m, 2), scaled the same way.

    Returns
    -------
    (PlantedNetwork, PlantedNetwork)
    """
    if not (np.isfinite(a) and 0 < a):
        raise ValueError(f"a must be a positive number; got {a!r}")
    m = check_positive_int(m, "m")
    rng = check_random_state(random_state)
    base = np.full((1, 2), 0.5) if m == 1 else rng.standard_normal((m, 2))
    nets = []
    for ai in (a, 2 * a):
        s = np.sqrt(1 + ai * ai)
        V = np.array([[1.0, ai], [1.0, -ai]]) / s
        nets.append(PlantedNetwork(U=base * s, V=V))
    return nets[0], nets[1]


def relu_separability_instance(clauses, n_vars):
    """The reduction of BJW19 Section 3 (Thm 2): a 6-SAT formula -> (X, Y) with alpha = [1, 1].

    A network ``y = relu(x . v1) + relu(x . v2)`` fits (X, Y) exactly iff the sets P, Q
    built from the formula are ReLU-separable (Def. 5), which holds iff the (reversible)
    formula is satisfiable. Outputs have rank 1 < k = 2, the NP-hard regime.

    Parameters
    ----------
    clauses : sequence of sequences of nonzero ints
        Literals in DIMACS style: ``3`` is u_3, ``-3`` is not u_3 (variables 1..n_vars).
    n_vars : int

    Returns
    -------
    X : ndarray of shape (|P| + |Q|, n_vars + 2)
        Rows: one point p per clause (output 0), then the points of Q (output 1).
    Y : ndarray of shape (|P| + |Q|, 1)
    """
    n = check_positive_int(n_vars, "n_vars")
    d = n + 2
    P = []
    for clause in clauses:
        lits = list(clause)
        if not lits or any((not isinstance(l, (int, np.integer))) or l == 0 or abs(l) > n for l in lits):
            raise ValueError(f"each clause must be a nonempty list of literals in +-1..{n}; got {clause!r}")
        p = np.zeros(d)
        for l in lits:
            p[abs(l) - 1] = -1.0 if l > 0 else 1.0
        # x_{n+1} + x_{n+2} = 1/2 makes the last two coordinates contribute -(L - 1):
        # p . x <= 0  <=>  sum of literal values >= -(L - 1)  <=>  some literal is true.
        p[n] = p[n + 1] = -2.0 * (len(lits) - 1)
        P.append(p)
    E = np.eye(d)
    Q = [E[i] for i in range(n)] + [-E[i] for i in range(n)]
    Q += [E[n], E[n + 1], -2 * E[n], -2 * E[n + 1], E[n] + E[n + 1]]
    X = np.vstack(P + Q) if P else np.vstack(Q)
    Y = np.concatenate([np.zeros(len(P)), np.ones(len(Q))])[:, None]
    return X, Y


def _conditioned(rng, rows, cols, kappa):
    """rows x cols with singular values lambda^-i (i = 1..r), kappa = lambda^(r-1) (GKLW19 Sec. 4.3)."""
    r = min(rows, cols)
    lam = kappa ** (1.0 / (r - 1)) if r > 1 and kappa > 1 else 1.0
    Q1 = np.linalg.qr(rng.standard_normal((rows, r)))[0]
    Q2 = np.linalg.qr(rng.standard_normal((cols, r)))[0]
    return Q1 @ np.diag(lam ** -np.arange(1, r + 1)) @ Q2.T


def gklw19_network(d, k=None, m=None, *, condition_A=None, condition_W=None, random_state=None):
    """GKLW19's instances (Sec. 4): random orthonormal A (m, k) and W (k, d), or conditioned.

    ``condition_A`` / ``condition_W`` give singular values lambda^-i with kappa = lambda^(k-1)
    (Figure 4); rows of W are then not unit norm. Defaults: k = d, m = k.
    """
    d = check_positive_int(d, "d")
    k = d if k is None else check_positive_int(k, "k")
    m = k if m is None else check_positive_int(m, "m")
    if k > d or m < k:
        raise ValueError(f"need k <= d and m >= k; got d = {d}, k = {k}, m = {m}")
    rng = check_random_state(random_state)
    W = (
        np.linalg.qr(rng.standard_normal((d, k)))[0].T
        if condition_W is None
        else _conditioned(rng, k, d, float(condition_W))
    )
    A = (
        np.linalg.qr(rng.standard_normal((m, k)))[0]
        if condition_A is None
        else _conditioned(rng, m, k, float(condition_A))
    )
    return PlantedNetwork(U=A, V=W)


def smoothed_perturbation(net, rho, *, random_state=None):
    """GKLW19 Thm 9: W + rho E and A + rho E' with i.i.d. N(0, 1) entries."""
    if not (np.isfinite(rho) and rho >= 0):
        raise ValueError(f"rho must be a number >= 0; got {rho!r}")
    rng = check_random_state(random_state)
    return PlantedNetwork(
        U=net.U + rho * rng.standard_normal(net.U.shape),
        V=net.V + rho * rng.standard_normal(net.V.shape),
        activation=net.activation,
    )


def q_lambda_perturbation(X, lam, *, Q=None, random_state=None):
    """GKLW19 Thm 10: replace each sample, with probability lam, by Q g (g ~ N(0, I)).

    The result is again symmetric and within lam of the original law in total variation.
    Returns (X_perturbed, Q).
    """
    if not 0 <= lam <= 1:
        raise ValueError(f"lam must be in [0, 1]; got {lam!r}")
    rng = check_random_state(random_state)
    X = np.array(X, dtype=np.float64)
    n, d = X.shape
    Q = rng.standard_normal((d, d)) if Q is None else np.asarray(Q, dtype=np.float64)
    swap = rng.random(n) < lam
    X[swap] = rng.standard_normal((int(swap.sum()), d)) @ Q.T
    return X, Q


# ----------------------------------------------------------------------------------------------
# MR19 (Mazumdar & Rawat): single-layer ReLU codes with sparse outliers, and ReLU dictionaries.
# Kept as one block. The paper writes vectors as columns (A is d x k, y = relu(A c + b)); a
# batch of codes or samples is stacked as rows here, as everywhere in relufast.
# ----------------------------------------------------------------------------------------------

__all__ += ["PlantedCodes", "relu_codes", "PlantedDictionary", "relu_dictionary"]


def _draw_bias(rng, bias, shape):
    """A constant bias (a real number) or i.i.d. draws from a scipy.stats frozen law."""
    if hasattr(bias, "rvs"):
        return np.asarray(bias.rvs(size=shape, random_state=rng), dtype=np.float64)
    b = float(bias)
    if not np.isfinite(b):
        raise ValueError(f"bias must be a finite number or a scipy.stats frozen distribution; got {bias!r}")
    return np.full(shape, b)


@dataclass(frozen=True)
class PlantedCodes:
    """``v = relu(A c + b) + e + w`` (MR19 eq. (46)/(48)); batches stack codes as rows.

    Attributes
    ----------
    A : ndarray of shape (d, k), i.i.d. N(0, 1)
    v : ndarray of shape (d,) or (n_codes, d)
    c : ndarray of shape (k,) or (n_codes, k), unit norm (Theorem 4 assumes ||c*|| = 1)
    e : ndarray like v, s-sparse outliers
    w : ndarray like v, dense noise with |w_i| <= delta
    b : ndarray like v, the bias of each coordinate
    support : ndarray of shape (s,) or (n_codes, s), sorted outlier positions
    """

    A: np.ndarray
    v: np.ndarray
    c: np.ndarray
    e: np.ndarray
    w: np.ndarray
    b: np.ndarray
    support: np.ndarray


def relu_codes(d, k, s=0, *, n_codes=None, bias=0.0, outlier_size=10.0, delta=0.01, random_state=None):
    """Planted data for MR19 Section 4: Gaussian A, unit c*, s outliers of size +-outlier_size
    at random positions (oblivious), noise U[-delta, delta].

    Parameters
    ----------
    d, k : int
        Observations and code length (d > k).
    s : int, default=0
        Number of outliers per code.
    n_codes : int, optional
        Draw this many codes sharing A (arrays gain a leading axis); default one code.
    bias : float or scipy.stats frozen distribution, default=0.0
        A constant bias, or the law of the i.i.d. bias coordinates.
    outlier_size : float, default=10.0
        Magnitude of each outlier; signs are random.
    delta : float, default=0.01
        Bound of the dense noise.
    random_state : None, int or numpy Generator

    Returns
    -------
    PlantedCodes
    """
    d = check_positive_int(d, "d", minimum=2)
    k = check_positive_int(k, "k")
    s = check_positive_int(s, "s", minimum=0)
    if k >= d or s > d:
        raise ValueError(f"need k < d and s <= d; got d={d}, k={k}, s={s}")
    rng = check_random_state(random_state)
    N = 1 if n_codes is None else check_positive_int(n_codes, "n_codes")
    A = rng.standard_normal((d, k))
    C = rng.standard_normal((N, k))
    C /= np.linalg.norm(C, axis=1, keepdims=True)
    E = np.zeros((N, d))
    S = np.zeros((N, s), dtype=np.int64)
    for j in range(N):
        S[j] = np.sort(rng.choice(d, size=s, replace=False))
        E[j, S[j]] = outlier_size * rng.choice(np.array([-1.0, 1.0]), size=s)
    W = rng.uniform(-delta, delta, size=(N, d))
    B = _draw_bias(rng, bias, (N, d))
    Vobs = np.maximum(C @ A.T + B, 0.0) + E + W
    if n_codes is None:
        Vobs, C, E, W, B, S = Vobs[0], C[0], E[0], W[0], B[0], S[0]
    return PlantedCodes(A=A, v=Vobs, c=C, e=E, w=W, b=B, support=S)


@dataclass(frozen=True)
class PlantedDictionary:
    """``Y = relu(C A^T + 1 b^T)`` (MR19 eq. (15) with samples as rows; the paper's Y is our Y^T).

    Attributes
    ----------
    Y : ndarray of shape (n, d)
    A : ndarray of shape (d, k), the dictionary (only its column space is identifiable)
    C : ndarray of shape (n, k), the codes
    b : ndarray of shape (d,), one bias per coordinate, fixed across samples
    M : ndarray of shape (n, d), ``C A^T`` (the paper's M^T)
    """

    Y: np.ndarray
    A: np.ndarray
    C: np.ndarray
    b: np.ndarray
    M: np.ndarray


def relu_dictionary(n, d, k, *, bias=None, max_abs=None, random_state=None):
    """Planted data for MR19 Section 3: A (d, k) Gaussian, codes C (n, k) Gaussian / sqrt(k),
    bias b (d,) i.i.d. from ``bias`` (default N(0, 0.3^2)).

    Parameters
    ----------
    n, d, k : int
    bias : float or scipy.stats frozen distribution, optional
    max_abs : float, optional
        Rescale M = C A^T so that max |M| equals this value (the paper's ||M||_inf <= gamma).
    random_state : None, int or numpy Generator

    Returns
    -------
    PlantedDictionary
    """
    n = check_positive_int(n, "n")
    d = check_positive_int(d, "d")
    k = check_positive_int(k, "k")
    rng = check_random_state(random_state)
    if bias is None:
        from scipy import stats

        bias = stats.norm(0.0, 0.3)
    A = rng.standard_normal((d, k))
    C = rng.standard_normal((n, k)) / np.sqrt(k)
    if max_abs is not None:
        C *= float(max_abs) / np.abs(C @ A.T).max()
    M = C @ A.T
    b = _draw_bias(rng, bias, (d,))
    return PlantedDictionary(Y=np.maximum(M + b, 0.0), A=A, C=C, b=b, M=M)


# ---- GP19: deep teachers f(x) = P(u(W x - t)) (Goel and Panigrahy 2019) ------------------


#: Activations u of GP19's model (defined in :mod:`relufast.activations`).
GP19_ACTIVATIONS = _GP19_ACTIVATIONS


@dataclass(frozen=True)
class DeepTeacher:
    """A deep teacher ``f(x) = P(u(W x - t))`` with a multilinear polynomial P (GP19, Sec. 1).

    ``P(X) = c_0 + sum_i linear[i] X_i + sum_{i<j} pairs[i, j] X_i X_j + sum_S terms[S] prod_{j in S} X_j``,
    or, with ``polynomial="or"``, ``P(X) = 1 - prod_i (1 - X_i)`` (an OR of 0/1 units: a
    union of halfspaces for the step activation).

    Attributes
    ----------
    W : ndarray of shape (n_hidden, n_features)
        Hidden weights (unit rows unless built with ``normalize=False``).
    t : float
        The common threshold.
    activation : str
        A key of :data:`GP19_ACTIVATIONS`.
    linear, pairs : ndarray or None
        Coefficients of P's degree-1 and degree-2 terms; None means P has none.
    """

    W: np.ndarray
    t: float
    activation: str = "relu"
    constant: float = 0.0
    linear: np.ndarray | None = None
    pairs: np.ndarray | None = None
    terms: tuple = ()
    polynomial: str = "multilinear"
    rho: float = 1.0

    @property
    def n_features(self):
        return self.W.shape[1]

    @property
    def n_hidden(self):
        return self.W.shape[0]

    @property
    def V(self):
        """Unit-norm rows of W (relufast's convention for hidden weights)."""
        return self.W / np.linalg.norm(self.W, axis=1, keepdims=True)

    def hidden(self, X):
        """Hidden units ``u(X W^T - t)`` of shape (n_samples, n_hidden)."""
        Z = np.asarray(X, dtype=np.float64) @ self.W.T - self.t
        return GP19_ACTIVATIONS[self.activation](Z, self.rho)

    def __call__(self, X):
        """Outputs f(X) of shape (n_samples,)."""
        H = self.hidden(X)
        if self.polynomial == "or":
            return 1.0 - np.prod(1.0 - H, axis=1)
        out = self.constant + (H @ self.linear if self.linear is not None else np.zeros(H.shape[0]))
        if self.pairs is not None:
            out += 0.5 * np.einsum("ij,ij->i", H, H @ (self.pairs + self.pairs.T))
        for S, c in self.terms:
            out += c * np.prod(H[:, list(S)], axis=1)
        return out

    def sample(self, n, *, random_state=None, noise=0.0):
        """Draw n Gaussian inputs X (n, n_features) and outputs y = f(X) (+ noise), shape (n,)."""
        n = check_positive_int(n, "n")
        rng = check_random_state(random_state)
        X = rng.standard_normal((n, self.n_features))
        y = self(X)
        if noise:
            y = y + noise * rng.standard_normal(n)
        return X, y

    def coefficient(self, S):
        """The coefficient c_S of the monomial prod_{j in S} X_j (multilinear P only)."""
        if self.polynomial == "or":
            return (-1.0) ** (len(S) + 1) if S else 0.0
        S = tuple(sorted(S))
        if len(S) == 0:
            return self.constant
        if len(S) == 1:
            return float(self.linear[S[0]]) if self.linear is not None else 0.0
        c = float(self.pairs[S[0], S[1]]) if (len(S) == 2 and self.pairs is not None) else 0.0
        return c + sum(v for T, v in self.terms if tuple(sorted(T)) == S)

    def implicit_coefficient(self, S, mu):
        """``C(S, mu) = sum_{S' >= S} c_{S'} mu^{|S'|}`` (GP19 Cor. 1, Thm 8), by enumerating supersets."""
        from itertools import combinations

        S = set(S)
        rest = [j for j in range(self.n_hidden) if j not in S]
        max_extra = self.n_hidden if self.polynomial == "or" else max([2] + [len(T) for T, _ in self.terms])
        total = 0.0
        for r in range(0, max(0, max_extra - len(S)) + 1):
            for extra in combinations(rest, r):
                T = tuple(sorted(S | set(extra)))
                total += self.coefficient(T) * mu ** len(T)
        return total


def deep_teacher(
    n_features=None,
    n_hidden=None,
    *,
    W=None,
    threshold=2.0,
    activation="relu",
    linear=1.0,
    pair=0.0,
    terms=None,
    constant=0.0,
    polynomial="multilinear",
    condition=None,
    rho=1.0,
    normalize=True,
    random_state=None,
):
    """A GP19 deep teacher ``f(x) = P(u(W x - t))`` with multilinear P.

    Parameters
    ----------
    n_features, n_hidden : int, optional
        Input dimension n and hidden width d (GP19's notation); not needed when W is given.
    W : array-like of shape (n_hidden, n_features), optional
        Hidden weights. Default: orthonormal rows (``condition=None``) or rows of a matrix
        with singular values from 1 to ``condition``, rows then normalised.
    threshold : float, default=2.0
        The common threshold t.
    activation : {"relu", "step", "sigmoid", "abs", "square", "exp"}, default="relu"
    linear : float or array-like of shape (n_hidden,), default=1.0
        Linear coefficients c_i.
    pair : float or array-like of shape (n_hidden, n_hidden), default=0.0
        Pair coefficients c_ij (a scalar: the same for every pair i < j; an array: its
        strict upper triangle).
    terms : dict, optional
        Higher monomials ``{(i, j, k, ...): c_S}``.
    constant : float, default=0.0
        c_0.
    polynomial : {"multilinear", "or"}, default="multilinear"
        "or": ``P = 1 - prod(1 - X_i)`` (ignores linear, pair, terms, constant).
    condition : float, optional
        Target condition number of W (default W: orthonormal rows).
    rho : float, default=1.0
        Slope of the "exp" activation ``e^{rho a}`` (GP19 Thm 8).
    normalize : bool, default=True
        Scale the rows of W to unit norm.
    random_state : None, int or numpy Generator

    Returns
    -------
    DeepTeacher
    """
    if activation not in GP19_ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(GP19_ACTIVATIONS)}; got {activation!r}")
    if polynomial not in ("multilinear", "or"):
        raise ValueError(f"polynomial must be 'multilinear' or 'or'; got {polynomial!r}")
    t = float(threshold)
    if not np.isfinite(t):
        raise ValueError(f"threshold must be finite; got {threshold!r}")
    rng = check_random_state(random_state)
    if W is None:
        n = check_positive_int(n_features, "n_features")
        k = check_positive_int(n_hidden, "n_hidden")
        if k > n:
            raise ValueError(f"n_hidden must be <= n_features; got n_hidden={k}, n_features={n}")
        Q1 = np.linalg.qr(rng.standard_normal((n, n)))[0][:k]
        if condition is None:
            W = Q1
        else:
            if not (np.isfinite(condition) and condition >= 1):
                raise ValueError(f"condition must be a number >= 1; got {condition!r}")
            Q0 = np.linalg.qr(rng.standard_normal((k, k)))[0]
            W = Q0 @ np.diag(np.linspace(1.0, float(condition), k)) @ Q1
    W = np.array(W, dtype=np.float64)
    if W.ndim != 2 or not np.isfinite(W).all():
        raise ValueError(f"W must be a finite 2-D array (n_hidden, n_features); got shape {W.shape}")
    if normalize:
        norms = np.linalg.norm(W, axis=1, keepdims=True)
        if np.any(norms == 0):
            raise ValueError("W has a zero row")
        W = W / norms
    k = W.shape[0]
    lin = np.broadcast_to(np.asarray(linear, dtype=np.float64), (k,)).copy()
    P = np.asarray(pair, dtype=np.float64)
    upper = np.triu(np.full((k, k), float(P)) if P.ndim == 0 else np.broadcast_to(P, (k, k)), 1)
    pairs = upper if np.any(upper) else None
    extra = tuple((tuple(int(j) for j in S), float(c)) for S, c in (terms or {}).items())
    for S, _ in extra:
        if len(set(S)) != len(S) or any(not 0 <= j < k for j in S):
            raise ValueError(f"terms keys must be tuples of distinct hidden-unit indices in [0, {k}); got {S}")
    return DeepTeacher(
        W=W,
        t=t,
        activation=activation,
        constant=float(constant),
        linear=lin,
        pairs=pairs,
        terms=extra,
        polynomial=polynomial,
        rho=float(rho),
    )


__all__ += ["GP19_ACTIVATIONS", "DeepTeacher", "deep_teacher"]
# ---- end GP19


def deep_relu(d, widths, m, random_state=None):
    """A random ReLU network with L = len(widths) hidden layers and biases, as layers.

    Rows of every hidden layer are unit Gaussian directions with biases ~ N(0, 1/4); the
    output layer and its offset are standard Gaussian. Returns ``(hidden, out)``: hidden a
    list of ``(W, b)`` with W of shape (k_l, k_{l-1}), out ``(W_out (m, k_L), c (m,))``;
    :func:`relu_function` makes it a callable. (The test networks of chosen-query
    extraction, :mod:`relufast.chosen`.)
    """
    rng = np.random.default_rng(random_state)
    dims, hidden = [d, *widths], []
    for i, k in enumerate(widths):
        W = rng.standard_normal((k, dims[i]))
        hidden.append((W / np.linalg.norm(W, axis=1, keepdims=True), 0.5 * rng.standard_normal(k)))
    return hidden, (rng.standard_normal((m, widths[-1])), rng.standard_normal(m))


def relu_function(hidden, out, dtype=np.float64, activation=None):
    """The network ``(hidden, out)`` of :func:`deep_relu` as a callable on (n, d) arrays,
    computed in ``dtype`` (float32 models a deployed network); ``activation`` replaces the
    ReLU (out-of-class models)."""
    act = activation or (lambda z: np.maximum(z, 0))
    hs = [(W.astype(dtype), b.astype(dtype)) for W, b in hidden]
    Wo, c = out[0].astype(dtype), out[1].astype(dtype)

    def f(X):
        H = np.asarray(X).astype(dtype)
        # OpenBLAS's float32 kernels can raise the invalid flag on finite data ("invalid value
        # encountered in matmul", numpy/numpy#24067; seen once on a CI machine, on none here):
        # the flag is ignored and the values checked instead.
        with np.errstate(invalid="ignore"):
            for W, b in hs:
                H = act(H @ W.T + b)
            Y = H @ Wo.T + c
        if np.isnan(Y).any() and not np.isnan(np.asarray(X, dtype=np.float64)).any():
            warnings.warn("invalid value (NaN) in the network's outputs on inputs without NaN", RuntimeWarning, 2)
        return Y

    return f


__all__ += ["deep_relu", "relu_function"]
