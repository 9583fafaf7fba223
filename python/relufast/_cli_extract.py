"""The model of ``relufast extract``: read from a torch file, a pickle or an import path, its
input dimension, the widths option, and the ``--out`` archive.

Reading a model runs code: ``torch.load(..., weights_only=False)`` and ``pickle.load``
execute whatever the file says, and ``module:function`` imports the module. Give only files
and modules you trust. Errors are ``ValueError`` with one line that says what was expected and
what was got (the command line prints them, exit code 2).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

#: Suffixes of the model files, by how they are read.
TORCH_SUFFIXES = (".pt", ".pth")
PICKLE_SUFFIXES = (".pkl", ".pickle")
JOBLIB_SUFFIXES = (".joblib",)
MODEL_SUFFIXES = TORCH_SUFFIXES + PICKLE_SUFFIXES + JOBLIB_SUFFIXES

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_EXPECTED = (
    "expected a torch file ("
    + ", ".join(TORCH_SUFFIXES)
    + "), a pickled model ("
    + ", ".join(PICKLE_SUFFIXES + JOBLIB_SUFFIXES)
    + ") or module:function"
)


def widths(text):
    """argparse type of ``--n-hidden``: one width (an int) or comma-separated widths (a tuple)."""
    parts = [part.strip() for part in text.split(",")]
    try:
        values = [int(part) for part in parts]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected a width >= 1 or widths separated by commas, e.g. 20 or 20,10; got {text!r}"
        )
    return values[0] if len(values) == 1 else tuple(values)


def load_model(spec):
    """The model that ``spec`` names: a torch file, a pickle or joblib file, or ``module:function``."""
    suffix = os.path.splitext(spec)[1].lower()
    if os.path.isdir(spec):
        raise ValueError(f"MODEL {spec} is a folder; {_EXPECTED}")
    if not os.path.exists(spec):
        if _IMPORT_PATH.match(spec):
            return _import_object(spec)
        if suffix in MODEL_SUFFIXES:
            raise ValueError(f"no such model file: {spec}")
        raise ValueError(f"MODEL {spec!r} is neither a file nor module:function; {_EXPECTED}")
    if suffix in TORCH_SUFFIXES:
        return _load_torch(spec)
    if suffix in PICKLE_SUFFIXES + JOBLIB_SUFFIXES:
        return _load_pickle(spec, suffix)
    raise ValueError(f"MODEL {spec} has the suffix {suffix or '(none)'!r}; {_EXPECTED}")


def _load_torch(path):
    try:
        import torch
    except ImportError:
        raise ValueError(f"reading {path} needs torch: pip install 'relufast[torch]'") from None
    try:
        model = torch.load(path, map_location="cpu", weights_only=False)  # trusted file: see the module docstring
    except Exception as exc:  # a corrupt file, a class that cannot be imported, ...
        raise ValueError(f"cannot read {path} with torch.load: {_one_line(exc)}") from None
    if not isinstance(model, torch.nn.Module):
        hint = " (a state_dict? save the module itself: torch.save(model, path))" if isinstance(model, dict) else ""
        raise ValueError(f"{path} holds a {type(model).__name__} object{hint}; expected a torch.nn.Module")
    return model.eval()


def _load_pickle(path, suffix):
    try:
        if suffix in JOBLIB_SUFFIXES:
            import joblib

            return joblib.load(path)
        import pickle

        with open(path, "rb") as f:
            return pickle.load(f)  # trusted file: see the module docstring
    except ImportError as exc:
        raise ValueError(f"cannot read {path}: {_one_line(exc)}") from None
    except Exception as exc:
        raise ValueError(f"cannot unpickle {path}: {_one_line(exc)}") from None


def _import_object(spec):
    """``module:name`` (``name`` may be dotted), the current folder first on the import path."""
    import importlib

    module_name, _, attribute = spec.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} of MODEL {spec}: {_one_line(exc)}") from None
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"MODEL {spec}: {module_name} has no attribute {attribute!r}; expected module:function")
        obj = getattr(obj, part)
    return obj


def n_features_of(model):
    """The input dimension a model states (the first torch ``nn.Linear``'s ``in_features``,
    scikit-learn's ``n_features_in_``, or an ``n_features`` attribute), or None."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        for layer in model.modules():
            if isinstance(layer, torch.nn.Linear):
                return int(layer.in_features)
        return None
    for name in ("n_features_in_", "n_features"):
        value = getattr(model, name, None)
        if isinstance(value, int) and value >= 1:
            return value
    return None


def arrays_of(result):
    """The network of a result as named arrays: ``U, V, b, c`` (one hidden layer) or
    ``W1, b1, ..., W{L+1}, b{L+1}`` (every layer of a deep result, the output layer last)."""
    layers = getattr(result, "layers", None)
    if layers is not None:
        arrays = {}
        for i, (W, b) in enumerate(layers, start=1):
            arrays[f"W{i}"], arrays[f"b{i}"] = W, b
        return arrays
    return {name: getattr(result, name) for name in ("U", "V", "b", "c") if getattr(result, name, None) is not None}


def _one_line(exc):
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
