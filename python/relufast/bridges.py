"""Bridges to PyTorch and scikit-learn: two-layer ReLU networks in and out.

``from_torch`` and ``from_sklearn`` read a trained model into a
:class:`relufast.network.Network` ``y = U relu(V x + b) + c``; ``to_torch`` and
``to_sklearn`` (also ``RecoveryResult.to_torch()`` / ``.to_sklearn()``) build models back.
``layers_of`` reads the layers of a ReLU network of any depth (to compare with
``relufast.extract(..., queries="chosen")``). ``hidden_widths`` reads only the architecture
(the hidden widths that ``relufast.extract`` uses by default), and ``logit_function`` turns a
fitted classifier into its logit function from queries of ``predict_proba`` alone.
torch and scikit-learn are optional (``pip install relufast[torch]``, ``relufast[sklearn]``)
and imported only inside these functions, never at ``import relufast``.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from .network import Network, as_network

__all__ = [
    "from_torch",
    "from_sklearn",
    "to_torch",
    "to_sklearn",
    "layers_of",
    "architecture",
    "hidden_widths",
    "logit_function",
]


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


class Architecture(NamedTuple):
    """What :func:`architecture` reads from a model (never its weights).

    Attributes
    ----------
    family : str or None
        ``"torch"`` (an ``nn.Sequential``), ``"sklearn"`` (a fitted MLP) or None (anything else:
        a plain callable, a torch module with its own ``forward``, an unfitted estimator).
    widths : tuple of int or None
        Hidden widths (k1, ..., kL) when the model is a ReLU network; else None.
    n_features : int or None
        Input dimension of the first layer.
    problem : str or None
        Why a torch/sklearn model is not a ReLU network (another activation, two linear layers
        without a ReLU between them, no hidden layer, dropout in training mode); None otherwise.
    """

    family: Optional[str]
    widths: Optional[tuple]
    n_features: Optional[int]
    problem: Optional[str]


def _flat_children(seq, nn):
    for child in seq.children():
        if isinstance(child, nn.Sequential):
            yield from _flat_children(child, nn)
        else:
            yield child


def _torch_architecture(module, torch):
    nn = torch.nn
    if not isinstance(module, nn.Sequential):
        return Architecture(None, None, None, None)  # its forward is its own: nothing to read
    linears, problem, after_linear = [], None, False
    for i, mod in enumerate(_flat_children(module, nn)):
        if isinstance(mod, (nn.Identity, nn.Flatten)):
            continue
        if isinstance(mod, nn.Dropout):
            if mod.training and mod.p > 0:
                problem = problem or f"{type(mod).__name__}(p={mod.p}) in training mode (call model.eval())"
            continue
        if isinstance(mod, nn.Linear):
            if after_linear:
                problem = problem or (
                    f"nn.Linear layers {len(linears)} and {len(linears) + 1} follow each other without a ReLU"
                )
            linears.append(mod)
            after_linear = True
        elif isinstance(mod, nn.ReLU) and after_linear:
            after_linear = False
        else:
            where = f"after nn.Linear layer {len(linears)}" if linears else "before the first nn.Linear"
            problem = problem or f"{type(mod).__name__} (module {i}) {where}; relufast extracts nn.ReLU networks"
    if not linears:
        return Architecture("torch", None, None, problem or "no nn.Linear layer")
    if not after_linear:
        problem = problem or "the last module is not an nn.Linear (the output layer)"
    if len(linears) == 1:
        problem = problem or "a single nn.Linear: a linear model, no hidden layer"
    widths = tuple(int(lin.out_features) for lin in linears[:-1])
    return Architecture("torch", None if problem else widths, int(linears[0].in_features), problem)


def architecture(model: Any) -> Architecture:
    """The architecture of a model as :func:`relufast.extract` reads it: never the weights.

    Parameters
    ----------
    model : object
        A torch ``nn.Sequential`` of ``nn.Linear`` layers with ``nn.ReLU`` between them (nested
        ``nn.Sequential``, ``nn.Identity``, ``nn.Flatten`` and dropout in eval mode are
        allowed), a fitted scikit-learn ``MLPRegressor`` / ``MLPClassifier``, or anything else.

    Returns
    -------
    Architecture
        ``(family, widths, n_features, problem)``; widths is None for anything but a ReLU
        network of one of the two families (``problem`` then says what was found).
    """
    torch = sys.modules.get("torch")  # a torch module exists only once torch was imported
    if torch is not None and isinstance(model, torch.nn.Module):
        return _torch_architecture(model, torch)
    if hasattr(model, "coefs_") and hasattr(model, "hidden_layer_sizes") and hasattr(model, "predict"):
        n_in = getattr(model, "n_features_in_", None)
        n_in = int(n_in) if n_in is not None else int(np.shape(model.coefs_[0])[0])
        activation = getattr(model, "activation", "relu")
        if activation != "relu":
            return Architecture(
                "sklearn", None, n_in, f"activation={activation!r} (relufast extracts activation='relu')"
            )
        return Architecture("sklearn", tuple(int(np.shape(W)[1]) for W in model.coefs_[:-1]), n_in, None)
    return Architecture(None, None, None, None)


def hidden_widths(model: Any) -> Optional[tuple]:
    """The hidden widths ``(k1, ..., kL)`` of a ReLU network model, read from its architecture.

    Parameters
    ----------
    model : object
        A torch ``nn.Sequential`` (its ``nn.Linear`` layers with ``nn.ReLU`` between them) or a
        fitted scikit-learn MLP with ``activation="relu"`` (``hidden_layer_sizes``).

    Returns
    -------
    tuple of int or None
        The widths of the hidden layers (the output layer excluded); None for any other model
        (a plain callable, a torch module with its own ``forward``, another activation).
        Only the architecture is read, never the weights.
    """
    return architecture(model).widths


def logit_function(clf: Any) -> Callable[[np.ndarray], np.ndarray]:
    """The logit function of a fitted classifier, from queries of ``predict_proba`` only.

    A classifier's probabilities are its logits passed through a logistic (binary) or a
    softmax (several classes). The logits of a ReLU network are a ReLU network; this function
    undoes the output activation without reading the weights:

    - binary (one logistic output, ``predict_proba`` of shape (n, 2)): ``log(p / (1 - p))``
      with p the probability of the second class, shape (n, 1): the logit itself;
    - softmax: the logits are known only up to an additive constant per input, so the
      centred log-probabilities ``log p - mean(log p)`` are returned, shape (n, m): the logits
      minus their mean, a linear image of the logits and so still a ReLU network's output
      (its rows sum to zero);
    - independent logistic outputs (multilabel): ``log(p / (1 - p))`` per column.

    Parameters
    ----------
    clf : fitted classifier
        An ``sklearn.neural_network.MLPClassifier`` (or any fitted classifier with
        ``predict_proba`` and ``out_activation_`` ``"logistic"`` or ``"softmax"``).

    Returns
    -------
    callable
        ``f(X)`` for X of shape (n, n_features) returning float64 logits.

    Notes
    -----
    Precision: ``predict_proba`` holds p in float64, so a logit z is known to about
    ``eps (1 + exp(|z|))`` for a logistic output (``1 - p`` loses its digits as p nears 1) and
    to about ``eps |z|`` for a softmax until a probability underflows (logit differences
    beyond about 708; subnormal probabilities lose digits first). Where a probability rounds
    to 0 or 1 the logit is lost: the function returns inf or NaN there. Its attribute
    ``readable`` (logits (n, m) -> bool (n,)) tells where they are not lost; the chosen-query
    certificate of :func:`relufast.extract` keeps its probes at the scales where the extracted
    network's logits are readable (and says so), and other non-finite answers stop the
    extraction with an error naming the inputs' scale.
    """
    if not hasattr(clf, "predict_proba"):
        raise TypeError(f"logit_function expects a fitted classifier with predict_proba; got {type(clf).__name__}")
    if not hasattr(clf, "classes_"):
        raise TypeError(f"logit_function expects a fitted classifier; {type(clf).__name__} is not fitted")
    out = getattr(clf, "out_activation_", None)
    if out not in ("logistic", "softmax"):
        raise ValueError(
            "logit_function expects a classifier whose output activation is 'logistic' or 'softmax' "
            f"(out_activation_ of an sklearn MLPClassifier); got {out!r}"
        )
    binary = out == "logistic" and int(getattr(clf, "n_outputs_", 1)) == 1

    def logits(X):
        P = np.asarray(clf.predict_proba(X), dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            if out == "logistic":
                p = P[:, -1:] if binary else P
                return np.log(p) - np.log1p(-p)
            L = np.log(P)
            return L - L.mean(axis=1, keepdims=True)

    logits.__doc__ = f"Logits of {type(clf).__name__} ({'binary logistic' if binary else out}) from predict_proba."
    logits.readable = _readable_softmax if out == "softmax" else _readable_logistic  # type: ignore[attr-defined]
    return logits


#: Largest logit difference at which no softmax probability underflows (exp(-708) is the
#: smallest normal float64; the margin keeps subnormal probabilities, which lose digits, out).
SOFTMAX_READABLE_GAP = 600.0
#: Largest logistic logit whose probability stays below 1 with digits to spare in float64
#: (p rounds to 1 above about 36.7; ``1 - p`` keeps about ``16 - z / 2.3`` digits).
LOGISTIC_READABLE_LOGIT = 30.0


def _readable_softmax(Z):
    """Rows of (centred) logits Z whose probabilities are all read from predict_proba."""
    return (Z.max(axis=1) - Z.min(axis=1)) <= SOFTMAX_READABLE_GAP


def _readable_logistic(Z):
    """Rows of logistic logits Z whose probabilities do not round to 1."""
    return Z.max(axis=1) <= LOGISTIC_READABLE_LOGIT


# What the logits are read from (the chosen mode's messages name it).
_readable_softmax.reads = "softmax probabilities"  # type: ignore[attr-defined]
_readable_logistic.reads = "logistic probabilities"  # type: ignore[attr-defined]
