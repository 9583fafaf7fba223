"""Deep ReLU networks as lists of layers: forward pass, activation patterns, local Jacobians.

A network is ``hidden = [(W_1, b_1), ..., (W_L, b_L)]`` (W_l of shape (k_l, k_{l-1})) and an
output layer ``(W_o, c)``: ``h_0 = x``, ``h_l = relu(W_l h_{l-1} + b_l)``, ``y = W_o h_L + c``.
Samples are rows throughout.
"""

from __future__ import annotations

import numpy as np

__all__ = ["forward", "pre_activations", "features", "feature_jacobians"]


def pre_activations(hidden, X):
    """Pre-activations ``[Z_1, ..., Z_L]`` (each (n, k_l)) and the last hidden state h_L."""
    H = np.asarray(X, dtype=np.float64)
    Z = []
    for W, b in hidden:
        z = H @ W.T + b
        Z.append(z)
        H = np.maximum(z, 0.0)
    return Z, H


def forward(hidden, out, X):
    """Outputs ``W_o h_L + c`` of shape (n, m)."""
    _, H = pre_activations(hidden, X)
    W_o, c = out
    return H @ W_o.T + c


def features(known, tentative, X):
    """The features ``phi(x) = [relu(W~ h_l + b~), h_l]`` in which the next layer is affine.

    ``known`` are the final layers 1..l, ``tentative = (W~, b~)`` is layer l+1 with each
    unit's sign still open. Since ``relu(-z) = relu(z) - z``, a unit taken with the wrong
    sign changes the next layer into an affine map of phi (a term linear in h_l): every unit
    of layer l+2 is a hyperplane in phi-space whatever the signs of layer l+1 (relufast's
    formulation of the sign problem of [CJM20, CCHRSS24]). Returns (phi (n, k_{l+1} + k_l),
    list of pre-activations of layers 1..l+1).
    """
    Z, H = pre_activations(known, X)
    Wt, bt = tentative
    zt = H @ Wt.T + bt
    return np.hstack([np.maximum(zt, 0.0), H]), Z + [zt]


def feature_jacobians(known, tentative, X):
    """Jacobians ``d phi / d x`` of shape (n, k_{l+1} + k_l, d), exact within linear regions.

    Built from the first layer's rows (never an (n, d, d) identity): memory n k d."""
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    J = None  # d h_l / d x, (n, k_l, d); None: the identity (h_0 = x)
    H = X
    for W, b in known:
        z = H @ W.T + b
        Jz = np.broadcast_to(W, (n, *W.shape)) if J is None else np.einsum("ij,njk->nik", W, J)
        J = (z > 0)[:, :, None] * Jz
        H = np.maximum(z, 0.0)
    Wt, bt = tentative
    zt = H @ Wt.T + bt
    Jzt = np.broadcast_to(Wt, (n, *Wt.shape)) if J is None else np.einsum("ij,njk->nik", Wt, J)
    Jt = (zt > 0)[:, :, None] * Jzt
    Jh = np.broadcast_to(np.eye(d), (n, d, d)) if J is None else J
    return np.concatenate([Jt, Jh], axis=1)


def preact_jacobians(layers, X):
    """Jacobians ``d z_l / d x`` of the pre-activations of every layer, each (n, k_l, d)
    (from the first layer's rows: no (n, d, d) identity)."""
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    J = None
    H, out = X, []
    for W, b in layers:
        z = H @ W.T + b
        Jz = np.broadcast_to(W, (n, *W.shape)).copy() if J is None else np.einsum("ij,njk->nik", W, J)
        out.append(Jz)
        J = (z > 0)[:, :, None] * Jz
        H = np.maximum(z, 0.0)
    return out


def active_jacobian(layers, X):
    """Jacobian ``d relu(z_L) / d x`` of the last layer's outputs, (n, k_L, d)."""
    Z, _ = pre_activations(layers, X)
    return (Z[-1] > 0)[:, :, None] * preact_jacobians(layers, X)[-1]


def activation_pattern(layers, X):
    """Signs ``z > 0`` of every unit of every layer at the rows of X, (n, sum k_l) bool."""
    Z, _ = pre_activations(layers, X)
    return np.hstack([z > 0 for z in Z])


def pull_back(layers, G, Z):
    """Rows of G (n, k_l): gradients with respect to the outputs of ``layers`` (l of them), as
    gradients in x at points whose pre-activations are Z (:func:`pre_activations`, at least
    the first l): each row pushed back through the units active there (n sum k_l k_(l-1)
    flops, no Jacobian matrices)."""
    for li in range(len(layers) - 1, -1, -1):
        G = (G * (Z[li] > 0)) @ layers[li][0]
    return G


__all__ += ["preact_jacobians", "activation_pattern", "active_jacobian", "pull_back"]
