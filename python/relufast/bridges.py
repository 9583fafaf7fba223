"""Bridges to PyTorch and scikit-learn: two-layer ReLU networks in and out.

``from_torch`` and ``from_sklearn`` read a trained model into a
:class:`relufast.network.Network` ``y = U relu(V x + b) + c``; ``to_torch`` and
``to_sklearn`` (also ``RecoveryResult.to_torch()`` / ``.to_sklearn()``) build models back.
``layers_of`` reads the layers of a ReLU network of any depth (to compare with
``relufast.extract(..., queries="chosen")``).
torch and scikit-learn are optional (``pip install relufast[torch]``, ``relufast[sklearn]``)
and imported only inside these functions, never at ``import relufast``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .network import Network, as_network

__all__ = ["from_torch", "from_sklearn", "to_torch", "to_sklearn", "layers_of"]


def _require(name, extra):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(f"this needs {name}: pip install 'relufast[{extra}]'") from exc


def _torch_layers(module):
    """The two nn.Linear layers of a one-hidden-layer ReLU module, checked."""
    torch = _require("torch", "torch")
    nn = torch.nn
    if not isinstance(module, nn.Module):
        raise TypeError(f"from_torch expects a torch.nn.Module; got {type(module).__name__}")
    linears = [mod for mod in module.modules() if isinstance(mod, nn.Linear)]
    others = [
        type(mod).__name__
        for mod in module.modules()
        if mod is not module and not isinstance(mod, (nn.Linear, nn.ReLU, nn.Sequential, nn.Identity, nn.Flatten))
    ]
    if len(linears) != 2 or others:
        raise ValueError(
            "from_torch expects a two-layer ReLU network (two nn.Linear layers with a ReLU "
            f"between them); got {len(linears)} nn.Linear layers"
            + (f" and other modules {sorted(set(others))}" if others else "")
        )
    first, second = linears
    if second.in_features != first.out_features:
        raise ValueError(
            f"the second nn.Linear must take the {first.out_features} hidden units; it takes "
            f"{second.in_features} features"
        )
    return first, second


def from_torch(module: Any) -> Network:
    """The network ``y = U relu(V x + b) + c`` of a one-hidden-layer PyTorch module.

    Parameters
    ----------
    module : torch.nn.Module
        Two ``nn.Linear`` layers with a ReLU between them, e.g.
        ``nn.Sequential(nn.Linear(d, k), nn.ReLU(), nn.Linear(k, m))`` (layers without bias
        give zeros). The module's forward is assumed to be ``second(relu(first(x)))``.

    Returns
    -------
    Network
        float64 copies of the weights: V = first.weight (k, d), b = first.bias,
        U = second.weight (m, k), c = second.bias.
    """
    first, second = _torch_layers(module)

    def arr(t, shape):
        return np.zeros(shape) if t is None else t.detach().cpu().double().numpy().copy()

    k, m = first.out_features, second.out_features
    return Network(
        arr(second.weight, (m, k)),
        arr(first.weight, (k, first.in_features)),
        arr(first.bias, (k,)),
        arr(second.bias, (m,)),
    )


def _sklearn_mlp(mlp):
    if not (hasattr(mlp, "coefs_") and hasattr(mlp, "intercepts_") and hasattr(mlp, "activation")):
        raise TypeError(
            "from_sklearn expects a fitted sklearn MLPRegressor or MLPClassifier; got "
            f"{type(mlp).__name__}" + (" (not fitted)" if hasattr(mlp, "hidden_layer_sizes") else "")
        )
    if len(mlp.coefs_) != 2:
        raise ValueError(f"from_sklearn expects one hidden layer; this MLP has {len(mlp.coefs_) - 1}")
    if mlp.activation != "relu":
        raise ValueError(f"from_sklearn expects activation='relu'; got {mlp.activation!r}")
    return mlp


def from_sklearn(mlp: Any) -> Network:
    """The network of a fitted scikit-learn ``MLPRegressor`` / ``MLPClassifier``.

    One hidden layer with ``activation="relu"``. For a classifier the network is the one
    before the output activation (logits); ``predict_proba`` applies the logistic or
    softmax on top.

    Returns
    -------
    Network
        V = coefs_[0].T (k, d), b = intercepts_[0], U = coefs_[1].T (m, k), c = intercepts_[1].
    """
    mlp = _sklearn_mlp(mlp)
    W1, W2 = (np.asarray(w, dtype=np.float64) for w in mlp.coefs_)
    b1, b2 = (np.asarray(v, dtype=np.float64) for v in mlp.intercepts_)
    return Network(W2.T, W1.T, b1, b2)


def to_torch(network: Any, *, dtype: Any = None) -> Any:
    """``nn.Sequential(nn.Linear(d, k), nn.ReLU(), nn.Linear(k, m))`` holding the network.

    Parameters
    ----------
    network : Network, RecoveryResult or (U, V[, b[, c]])
    dtype : torch dtype, default torch.float64
    """
    torch = _require("torch", "torch")
    net = as_network(network)
    if net.activation is not None:
        raise ValueError(f"to_torch supports ReLU networks; this one has activation {net.activation.name!r}")
    dtype = torch.float64 if dtype is None else dtype
    k, d, m = net.n_hidden, net.n_features, net.n_outputs
    model = torch.nn.Sequential(torch.nn.Linear(d, k), torch.nn.ReLU(), torch.nn.Linear(k, m)).to(dtype)
    with torch.no_grad():
        for layer, W, v in ((model[0], net.V, net.b), (model[2], net.U, net.c)):
            layer.weight.copy_(torch.from_numpy(np.array(W)))
            layer.bias.copy_(torch.from_numpy(np.array(v)))
    return model


def to_sklearn(network: Any) -> Any:
    """A fitted-looking ``sklearn.neural_network.MLPRegressor`` whose ``predict`` is the network.

    The estimator is not trained (``fit`` would start over from random weights); its
    learned attributes (``coefs_``, ``intercepts_``, ...) are set from the network.
    """
    nn = _require("sklearn.neural_network", "sklearn")
    net = as_network(network)
    if net.activation is not None:
        raise ValueError(f"to_sklearn supports ReLU networks; this one has activation {net.activation.name!r}")
    k, d, m = net.n_hidden, net.n_features, net.n_outputs
    mlp = nn.MLPRegressor(hidden_layer_sizes=(k,), activation="relu")
    mlp.coefs_ = [np.array(net.V.T), np.array(net.U.T)]
    mlp.intercepts_ = [np.array(net.b), np.array(net.c)]
    mlp.n_features_in_ = d
    mlp.n_layers_ = 3
    mlp.n_outputs_ = m
    mlp.out_activation_ = "identity"
    mlp.n_iter_ = 0
    mlp.t_ = 0
    mlp.loss_ = float("nan")
    return mlp


def layers_of(model: Any) -> list:
    """Every layer ``(W, b)`` (W of shape (out, in), float64) of a ReLU network of any depth.

    Parameters
    ----------
    model : torch.nn.Module or fitted sklearn MLPRegressor / MLPClassifier
        A torch module made of ``nn.Linear`` layers with ``nn.ReLU`` between them (in the
        order of ``module.modules()``; layers without bias give zeros), or an sklearn MLP
        with ``activation="relu"`` (a classifier's last layer gives its logits).

    Returns
    -------
    list of (ndarray, ndarray)
        The output layer last, as in ``DeepResult.layers``.
    """
    if hasattr(model, "coefs_") and hasattr(model, "intercepts_"):
        if getattr(model, "activation", "relu") != "relu":
            raise ValueError(f"layers_of expects activation='relu'; got {model.activation!r}")
        return [
            (np.asarray(W, dtype=np.float64).T.copy(), np.asarray(b, dtype=np.float64).copy())
            for W, b in zip(model.coefs_, model.intercepts_)
        ]
    torch = _require("torch", "torch")
    nn = torch.nn
    if not isinstance(model, nn.Module):
        raise TypeError(f"layers_of expects a torch.nn.Module or a fitted sklearn MLP; got {type(model).__name__}")
    others = [
        type(mod).__name__
        for mod in model.modules()
        if mod is not model and not isinstance(mod, (nn.Linear, nn.ReLU, nn.Sequential, nn.Identity, nn.Flatten))
    ]
    if others:
        raise ValueError(f"layers_of expects nn.Linear and nn.ReLU modules only; got {sorted(set(others))}")
    out = []
    for lin in (mod for mod in model.modules() if isinstance(mod, nn.Linear)):
        W = lin.weight.detach().cpu().double().numpy().copy()
        b = np.zeros(W.shape[0]) if lin.bias is None else lin.bias.detach().cpu().double().numpy().copy()
        out.append((W, b))
    return out
