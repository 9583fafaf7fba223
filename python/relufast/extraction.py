"""Query mode: extract a two-layer ReLU network from a model you can only call.

``relufast.extract(model, n_features)`` draws standard Gaussian queries, calls the model,
and recovers ``y = U relu(V x + b) + c`` with a certificate, doubling the number of queries
until the certificate holds. Methods: BJW19 Thm 7 (``bjw19-gaussian``) for bias-free
networks with m >= k; ATV21 with activation-region refinement (``atv21``) otherwise.

References
----------
.. [1] A. Bakshi, R. Jayaram, D. P. Woodruff, "Learning Two Layer Rectified Neural
   Networks in Polynomial Time", COLT 2019.
.. [2] A. Awasthi, A. Tang, A. Vijayaraghavan, "Efficient Algorithms for Learning Depth-2
   Neural Networks with General ReLU Activations", NeurIPS 2021.
.. [3] N. Carlini, M. Jagielski, I. Mironov, "Cryptanalytic Extraction of Neural Network
   Models", CRYPTO 2020.
.. [4] I. A. Canales-Martinez, J. Chavez-Saab, A. Hambitzer, F. Rodriguez-Henriquez,
   N. Satpute, A. Shamir, "Polynomial Time Cryptanalytic Extraction of Neural Network
   Models", EUROCRYPT 2024 (arXiv 2310.08708, 2023).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import sys
from typing import Any

import numpy as np

from . import _deadline
from ._blas import thread_budget
from ._deadline import check_time_limit
from ._progress import Progress
from ._result import RecoveryResult, Status, warn
from ._validation import NonFiniteOutputs, check_positive_int, check_random_state, resolve_n_jobs
from .stages.precision import resolve_precision
from .units import invisible_message, merged_result, near_duplicate_message, near_duplicates, visible_units

__all__ = [
    "extract",
    "as_query_function",
    "check_outputs",
    "checked_query_function",
    "cryptanalytic_queries",
    "NonFiniteOutputs",
]


def cryptanalytic_queries(n_features: int, n_hidden: int) -> int:
    """relufast's own order-of-magnitude estimate of the queries of differential
    (cryptanalytic) extraction [3, 4] of a d-k-1 network; not a formula from [3] or [4].

    Assumptions (relufast's, chosen to match the shape of the attacks, not their code or
    their measured counts): for every hidden unit, about 4 critical points (where the unit
    switches) are found by binary search along random lines, about 64 queries each (float64
    resolution), and the unit's weight row is read at a critical point from second
    differences along the d coordinates and the bias, about 2 (d + 1) queries. This gives
    ``Q = 4 k (2 (d + 1) + 64)``. It ignores the sign-recovery step (the costly part in [4]),
    repeated searches when a critical point is ambiguous, and deeper layers. For calibration,
    the abstract of [3] reports 2^18.5 queries for a model with 4,000 parameters and 2^21.5
    for an MNIST model with 100,000 parameters; read as one-hidden-layer networks on d = 784
    inputs (k = 5 and k = 128: an assumption, the abstract does not give the shapes), this
    estimate gives 2^15.0 and 2^19.7, 3-11x below the reported counts. Use it only to put
    relufast's query count beside the literature's, as an order of magnitude.
    """
    return int(4 * n_hidden * (2 * (n_features + 1) + 64))


def _torch_function(model):
    import torch

    params = list(model.parameters())
    dtype = params[0].dtype if params else torch.float32
    device = params[0].device if params else torch.device("cpu")

    def f(X):
        with torch.no_grad():
            out = model(torch.from_numpy(np.ascontiguousarray(X)).to(device=device, dtype=dtype))
        return out.detach().cpu().numpy()

    return f, str(dtype).replace("torch.", "")


def _sklearn_function(mlp):
    """The outputs before the output activation: the logits of a classifier
    (:func:`relufast.bridges.logit_function`: logit of ``predict_proba`` for binary, centred
    log-probabilities for multiclass, a linear image of the logits and so still a ReLU
    network), ``predict`` of a regressor."""
    from .bridges import logit_function

    out = getattr(mlp, "out_activation_", "identity")
    if out == "identity":
        return (lambda X: np.asarray(mlp.predict(X), dtype=np.float64)), "float64"
    if out in ("logistic", "softmax"):
        return logit_function(mlp), "float64"
    raise ValueError(f"unsupported output activation of the sklearn model: {out!r}")


def check_outputs(out: Any, X: np.ndarray, n_outputs: int | None = None, *, hint: str = "") -> np.ndarray:
    """The model's answer to the queries X, checked: an array of shape (n, m), in its own dtype.

    One check for both query modes. Accepts shape (n, m), (n,) (one output) or (n, ...)
    (flattened per query); raises ``ValueError`` naming the expected and received shapes for
    None, a scalar, a wrong number of rows, a transposed answer (m, n), a number of outputs
    that differs from ``n_outputs`` (earlier calls), non-numeric values, and non-finite
    outputs (naming the norms of the inputs where they occurred).

    Parameters
    ----------
    out : object
        What the model returned for X.
    X : ndarray of shape (n, d)
        The queries.
    n_outputs : int or None
        Outputs per query of earlier calls (None: first call).
    hint : str
        Appended to the message of non-finite outputs (what the query mode needs).
    """
    n, d = X.shape
    expected = f"({n}, m) or ({n},) (one row per query)" if n_outputs is None else f"({n}, {n_outputs})"
    called = f"called on {n} queries of shape ({n}, {d})"
    if out is None:
        raise ValueError(f"the model must return an array of shape {expected}; {called}, it returned None")
    arr = np.asarray(out)
    if arr.dtype.kind not in "biuf":
        raise ValueError(
            f"the model must return real numbers, an array of shape {expected}; {called}, it returned "
            f"{type(out).__name__} of dtype {arr.dtype}"
        )
    if arr.ndim == 0:
        raise ValueError(f"the model must return an array of shape {expected}; {called}, it returned a scalar")
    if arr.shape[0] != n:
        if arr.ndim == 2 and arr.shape[1] == n:
            raise ValueError(
                f"the model must return one row per query, shape ({n}, m); {called}, it returned shape {arr.shape}, "
                "the transpose (return Y.T)"
            )
        raise ValueError(f"the model must return an array of shape {expected}; {called}, it returned shape {arr.shape}")
    Y = arr.reshape(n, -1)
    if Y.shape[1] == 0 or (n_outputs is not None and Y.shape[1] != n_outputs):
        what = "no output" if Y.shape[1] == 0 else f"{Y.shape[1]} outputs per query"
        raise ValueError(
            f"the model must return an array of shape {expected}; {called}, it returned shape {arr.shape} ({what}"
            + (f"; earlier calls returned {n_outputs})" if n_outputs is not None else ")")
        )
    bad = ~np.isfinite(Y).all(axis=1) if Y.dtype.kind == "f" else np.zeros(n, dtype=bool)
    if bad.any():
        norms = np.linalg.norm(X, axis=1)
        fine = norms[~bad]
        kinds = " and ".join(k for k, t in (("NaN", np.isnan(Y).any()), ("inf", np.isinf(Y).any())) if t)
        raise NonFiniteOutputs(
            f"the model returned non-finite outputs ({kinds}) for {int(bad.sum())} of {n} queries, at input norms "
            f"{norms[bad].min():.3g} to {norms[bad].max():.3g}"
            + (f" (finite answers up to norm {fine.max():.3g})" if fine.size else "")
            + "; relufast needs a finite answer at every query"
            + (f": {hint}" if hint else "")
        )
    return Y


def checked_query_function(f, n_features: int, hint: str = ""):
    """``f`` wrapped by :func:`check_outputs`; remembers the number of outputs of its first call."""
    state: dict = {"m": None}

    def g(X):
        Y = check_outputs(f(X), np.asarray(X).reshape(-1, n_features), state["m"], hint=hint)
        state["m"] = Y.shape[1]
        return Y

    return g


#: Rows of Y summing to at most this (relative to |Y|) are centred outputs (softmax logits).
CENTRED_TOL = 1e-12


def _drop_centred_column(Y):
    """(Y without its last column, True) when every row of Y sums to zero, as the centred
    log-probabilities of a softmax classifier do: the last column is then minus the sum of
    the others, and dropping it leaves outputs of full rank min(m - 1, k) for the methods
    and the count of visible units. Else (Y, False)."""
    if Y.shape[1] < 2:
        return Y, False
    scale = float(np.abs(Y).max()) if Y.size else 0.0
    if scale > 0 and float(np.abs(Y.sum(axis=1)).max()) <= CENTRED_TOL * scale * Y.shape[1]:
        return np.ascontiguousarray(Y[:, :-1]), True
    return Y, False


def as_query_function(model: Any) -> tuple:
    """(function on float64 arrays (n, d) -> (n, m), output dtype name) for a model."""
    # A torch module exists only once torch was imported: a plain callable never pays the
    # seconds of importing torch.
    torch = sys.modules.get("torch")
    is_torch = torch is not None and isinstance(model, torch.nn.Module)
    if is_torch:
        return _torch_function(model)
    if hasattr(model, "coefs_") and hasattr(model, "predict"):
        return _sklearn_function(model)
    if callable(model):

        def f(X):
            out = model(X)
            if hasattr(out, "detach"):
                out = out.detach().cpu().numpy()
            return out  # checked by check_outputs

        return f, None
    raise TypeError(
        "model must be a torch.nn.Module, a fitted sklearn MLPRegressor/MLPClassifier or a "
        f"callable on arrays of shape (n, n_features); got {type(model).__name__}"
    )


def _units_note(vis, k_given, k, m, d):
    """The message's opening when fewer units were recovered than given, or none was given."""
    if k_given is not None and m < k_given:
        # With fewer outputs than units the count is a lower bound, not evidence of dead units.
        return (
            f"n_hidden = {k_given} was fitted first and not certified; with m = {m} < n_hidden "
            f"outputs the count of units visible in the outputs ({vis.count}) is only a lower "
            f"bound, so a network with {k} units was fitted too. "
        )
    if k_given is not None:
        return invisible_message(vis.count, k_given) + ". " if vis.count < k_given else ""
    moment = (
        ""
        if vis.output_rank < m
        else f", {vis.moment_count} singular value(s) of the stacked moments above their floor"
    )
    seen = f"at least {k}" if math.isinf(vis.count) else str(vis.count)
    return (
        f"n_hidden not given: {seen} hidden unit(s) visible in the outputs (rank of the centred "
        f"outputs {vis.output_rank}{moment}), recovered with n_hidden={k} (units that are never "
        "active on Gaussian queries or have a zero output column cannot be counted). "
    )


def _saturation_note(model):
    """What a classifier's non-finite logits mean (:func:`relufast.bridges.logit_function`)."""
    if getattr(model, "out_activation_", None) not in ("logistic", "softmax") or not hasattr(model, "predict_proba"):
        return ""
    return (
        "; this classifier is queried through predict_proba, whose probabilities round to 0 or 1 where its logits "
        "are large (a logistic logit above about 37, softmax logit differences beyond about 745): "
        "the logits are lost there (relufast.bridges.logit_function)"
    )


def _widths(n_hidden):
    """n_hidden (an int or a tuple of widths) as a tuple of positive ints."""
    widths = (n_hidden,) if isinstance(n_hidden, numbers.Integral) else tuple(n_hidden)
    if len(widths) == 0:
        raise ValueError("n_hidden must name at least one hidden layer; got ()")
    return tuple(check_positive_int(k, "n_hidden") for k in widths)


def _plan(model, d, n_hidden, queries):
    """The query mode and the widths of ``extract``: (mode, widths or None, widths_from, why).

    ``queries=None`` picks chosen queries for a torch ``nn.Sequential`` or a fitted sklearn MLP
    (widths read from the architecture), for several hidden layers, and for one layer wider
    than d (Gaussian queries recover at most d units); random queries otherwise.
    """
    from .bridges import architecture

    if queries not in (None, "random", "chosen"):
        raise ValueError(f"queries must be None, 'random' or 'chosen'; got {queries!r}")
    arch = architecture(model)
    if arch.n_features is not None and arch.n_features != d:
        raise ValueError(f"n_features = {d}, but the model's first layer takes {arch.n_features} features")
    if n_hidden is not None:
        widths, widths_from = _widths(n_hidden), "argument"
    elif arch.widths is not None:
        widths, widths_from = arch.widths, "model"
    else:
        widths, widths_from = None, "visible units"
    if queries is not None:
        mode, why = queries, "queries=" + repr(queries)
    elif arch.family is not None:
        mode, why = (
            "chosen",
            f"the default for a {'torch nn.Sequential' if arch.family == 'torch' else 'fitted sklearn MLP'}",
        )
    elif widths is not None and len(widths) > 1:
        mode, why = "chosen", f"the default for {len(widths)} hidden layers"
    elif widths is not None and widths[0] > d:
        mode, why = (
            "chosen",
            f"the default for n_hidden = {widths[0]} > d = {d} (Gaussian queries recover at most d units)",
        )
    else:
        mode, why = "random", "the default for a callable with one hidden layer"
    if arch.problem is not None and mode == "chosen":
        raise ValueError(
            f"chosen queries ({why}) extract ReLU networks; this {arch.family} model has {arch.problem}. "
            "Pass queries='random' with n_hidden to try Gaussian queries anyway"
        )
    if mode == "chosen" and widths is None:
        raise ValueError("queries='chosen' needs n_hidden: an int or a tuple of hidden widths (k1, ..., kL)")
    if mode == "random" and widths is not None and len(widths) > 1:
        source = "read from the model" if widths_from == "model" else "given"
        raise ValueError(
            f"queries='random' extracts one hidden layer from Gaussian queries; n_hidden={widths} ({source}) has "
            f"{len(widths)}. Pass queries='chosen' (or leave queries unset) to extract them with chosen queries"
        )
    return mode, widths, widths_from, why


def _chosen(model, d, widths, max_queries, precision, random_state, time_limit, progress, batch_size, n_jobs=None):
    """``extract(..., queries="chosen")``: :func:`relufast.chosen.driver.extract_chosen` with
    ``n_jobs`` threads (pieces of work run side by side; one model call at a time)."""
    from .chosen.driver import extract_chosen

    resolve_n_jobs(n_jobs)  # a ValueError before any query
    batch_size = check_positive_int(batch_size, "batch_size")
    low = None
    if max_queries is None:
        max_queries, low = chosen_budget(d, widths), chosen_budget(d, widths, low_precision=True)
    max_queries = check_positive_int(max_queries, "max_queries")
    f, dtype_name = as_query_function(model)
    hint = (
        "chosen queries follow lines through the input space and certify at scales 1 and 10 (inputs of norm "
        f"about sqrt(d) = {math.sqrt(d):.3g} to 10 sqrt(d) and beyond)" + _saturation_note(model)
    )
    with thread_budget(n_jobs):
        return extract_chosen(
            checked_query_function(f, d, hint),
            d,
            widths,
            max_queries=max_queries,
            dtype_name=dtype_name,
            precision=precision,
            random_state=check_random_state(random_state),
            time_limit=check_time_limit(time_limit),
            progress=progress,
            batch_size=batch_size,
            readable=getattr(f, "readable", None),
            max_queries_low=low,
        )


def _refuse_random_options(why, n_queries, method):
    """Options of random queries that chosen queries cannot honour: a ``ValueError`` naming each."""
    refused = []
    if n_queries is not None:
        refused.append(
            f"n_queries={n_queries!r} (the first sample of Gaussian queries; chosen queries take what each step "
            "needs: bound them with max_queries)"
        )
    if method != "auto":
        refused.append(f"method={method!r} (a passive method run on Gaussian queries)")
    if refused:
        raise ValueError(
            f"chosen queries ({why}) do not take " + "; ".join(refused) + ". Leave them unset, or pass "
            "queries='random' for one hidden layer"
        )


#: Default query budget of chosen queries: CHOSEN_BUDGET_PER_WEIGHT queries a hidden weight,
#: at least CHOSEN_BUDGET_MIN (the networks of the benchmarks that end exact use 11-60 a
#: weight; a run that cannot succeed ends with a message instead of running for an hour);
#: CHOSEN_BUDGET_PER_WEIGHT_LOW where the outputs are float32 (or coarser), whose searches
#: cost more (the trained float32 784-64-64-10 of bench/test_bench_trained.py is certified
#: in 64 a weight, 63-91 over random states 0-3, 40-60 of them for its first layer).
CHOSEN_BUDGET_PER_WEIGHT, CHOSEN_BUDGET_MIN, CHOSEN_BUDGET_PER_WEIGHT_LOW = 100, 2_000_000, 250


def chosen_budget(d, widths, low_precision=False):
    """The default ``max_queries`` of chosen queries for hidden widths ``widths`` after d inputs
    (``low_precision``: for float32 outputs, known from the model's first answer)."""
    dims = [int(d), *map(int, widths)]
    weights = sum(dims[i + 1] * (dims[i] + 1) for i in range(len(dims) - 1))
    per = CHOSEN_BUDGET_PER_WEIGHT_LOW if low_precision else CHOSEN_BUDGET_PER_WEIGHT
    return max(CHOSEN_BUDGET_MIN, per * weights)


def _with_plan(res, widths, widths_from, mode, why):
    """The result with where its widths and its query mode came from (diagnostics, message)."""
    diag = dict(res.diagnostics, widths_from=widths_from, queries=mode)
    if widths_from == "model":  # said first: the user did not give them
        message = (
            f"Hidden widths {widths} read from the model's architecture (not its weights); {mode} queries ({why}). "
        )
        message += res.message
    else:
        source = f"hidden widths {widths} from n_hidden" if widths_from == "argument" else "n_hidden from the outputs"
        message = f"{res.message.rstrip('.')}. ({mode.capitalize()} queries: {why}; {source}.)"
    return dataclasses.replace(res, diagnostics=diag, message=message)


def _unsupported_random(k, d):
    """The result of random queries asked for more units than Gaussian queries can see."""
    message = (
        f"n_hidden = {k} > d = {d}: Gaussian queries recover at most d hidden units (the moments of the "
        f"outputs have rank at most d), so none was made. Pass queries='chosen' (n_hidden={k}) or leave "
        "queries unset: chosen queries extract layers of any width"
    )
    warn(message)
    return RecoveryResult(
        U=None, V=None, status=Status.UNSUPPORTED, message=message, method="random queries", counts={"queries": 0}
    )


def extract(
    model: Any,
    n_features: int,
    n_hidden: Any = None,
    *,
    queries: str | None = None,
    n_queries: int | None = None,
    max_queries: int | None = None,
    precision: Any = None,
    batch_size: int = 16384,
    method: str = "auto",
    progress: bool | None = None,
    random_state: Any = None,
    n_jobs: int | None = None,
    time_limit: float | None = None,
) -> RecoveryResult:
    """Extract a ReLU network from a model you can query: ``y = U relu(V x + b) + c`` by
    Gaussian queries, or a network with one or more hidden layers by chosen queries.

    Parameters
    ----------
    model : torch.nn.Module, sklearn MLPRegressor/MLPClassifier, or callable
        The model to query. A classifier is queried before its output activation
        (:func:`relufast.bridges.logit_function`: the logistic/softmax is undone from
        ``predict_proba``; multiclass gives centred logits). A callable takes an ndarray of
        shape (n, n_features) and returns (n, m) or (n,); any other answer (None, a scalar,
        another number of rows, the transpose (m, n), NaN or inf) stops the extraction with a
        ``ValueError`` naming the expected and received shapes, or the inputs' norms.
    n_features : int
        Input dimension d.
    n_hidden : int or tuple of int, optional
        Hidden widths: an int (one hidden layer) or ``(k1, ..., kL)``. Default: for a torch
        ``nn.Sequential`` or a fitted sklearn MLP, the widths of its hidden layers, read from
        the architecture (:func:`relufast.bridges.hidden_widths`, never the weights); for
        other callables with random queries, the number of units visible in the outputs
        (:func:`relufast.units.visible_units`). ``diagnostics["widths_from"]`` says which
        (``"model"``, ``"argument"`` or ``"visible units"``), and so does the message. When
        fewer units are visible than given (dead or pruned units), random queries recover
        the visible ones and the message says so.
    queries : {None, "random", "chosen"}, default=None
        None: chosen queries for a torch ``nn.Sequential`` or fitted sklearn MLP (a model
        you can query answers any input), for several hidden layers, and for one layer
        wider than d (Gaussian queries recover at most d units); random queries for other
        callables with one hidden layer (given or counted). A torch/sklearn model whose
        activation is not ReLU is refused (``ValueError`` naming what was found) when
        chosen queries would be used.
        "random": standard Gaussian queries, one hidden layer (the methods below; the papers'
        setting). With several hidden layers: ``ValueError`` saying to pass
        ``queries="chosen"``; with ``n_hidden > d``: status ``unsupported`` at once, no query
        made.
        "chosen": the inputs are chosen (critical points on lines, their hyperplanes, layer
        by layer; :mod:`relufast.chosen`, after [3, 4]); the model must accept arbitrary real
        inputs and return outputs at full precision or at the precision of their dtype. One
        hidden layer gives a :class:`RecoveryResult`, several a
        :class:`relufast.chosen.result.DeepResult` (``layers``, ``predict``). ``exact``
        only when the network reproduces the model to the precision of its outputs on the
        certificate's probes: fresh queries at scales 1 to 1e4 (and beyond every extracted
        unit's switching scale), beside every extracted boundary and in the wedges between
        nearly parallel ones (:mod:`relufast.chosen.probes`); the model must answer with the
        same number of outputs and dtype on every call (else ``ValueError``).
    n_queries : int or None
        Random queries: queries of the first attempt (None: 20,000); doubled (new queries
        added) until the certificate holds or ``max_queries`` is reached. Chosen queries
        refuse it (``ValueError``): each step takes what it needs, bounded by ``max_queries``.
    max_queries : int or None
        Budget of queries (None: 2,000,000 for random queries; for chosen ones 100 a hidden weight,
        250 where the model answers in float32, at least 2,000,000: :func:`chosen_budget`). A
        chosen-query run that spends it ends `failed` with a message naming max_queries.
    precision : None, str or float
        Precision of the outputs (default: from the model's output dtype; torch float32
        modules are certified at float32).
    batch_size : int, default=16384
        Most queries in one call of the model (both modes).
    method : {"auto", "bjw19-gaussian", "atv21"}
        Random queries only (chosen queries refuse another value than "auto").
        "auto": atv21 when m < k or when the queries show hidden biases or an output offset
        (:func:`relufast.stages.diagnostics.bias_evidence`: the bias-free method cannot fit
        them, and trying it cost 25 of 45 s at d = 40, k = m = 20); otherwise
        bjw19-gaussian, then atv21 if that is not exact.
    progress : bool or None
        Progress on stderr (None: on a terminal only): the queries spent as a share of
        ``max_queries``; chosen queries add the stage and the seconds so far.
    random_state : None, int or numpy Generator
    n_jobs : int or None
        Threads (None or -1: every core). Random queries: the passive methods' kernels.
        Chosen queries: independent pieces of work side by side (the first layer's rows
        refitted at low precision), NumPy's BLAS at one thread in each and one call of the
        model at a time (the model need not be thread-safe); the result is the same for
        any ``n_jobs`` (unless ``max_queries`` or ``time_limit`` stops the run inside such
        a step, where the rows reached depend on the threads' timing).
    time_limit : float or None
        Seconds the extraction may take (None: no limit). Chosen queries check it before
        every call of the model and every stage, then certify what they completed in time;
        random queries stop doubling and stop the method running at its next check. A run
        it stops ends ``failed`` with ``diagnostics["stopped_by"] = "time_limit"``.

    Returns
    -------
    RecoveryResult or DeepResult
        ``counts["queries"]`` is the number of queries used; ``diagnostics["queries"]`` the
        mode used and ``diagnostics["widths_from"]`` where the widths came from; with random
        queries ``diagnostics["cryptanalytic_queries"]`` is relufast's own order-of-magnitude
        estimate of the query count of differential extraction [3, 4] for the same size
        (:func:`cryptanalytic_queries`).
    """
    d = check_positive_int(n_features, "n_features")
    mode, widths, widths_from, why = _plan(model, d, n_hidden, queries)
    if mode == "chosen":
        _refuse_random_options(why, n_queries, method)
        res = _chosen(model, d, widths, max_queries, precision, random_state, time_limit, progress, batch_size, n_jobs)
        return _with_plan(res, widths, widths_from, mode, why)
    time_limit = check_time_limit(time_limit)
    if widths is not None and widths[0] > d:  # known before any query: Gaussian queries see at most d units
        return _with_plan(_unsupported_random(widths[0], d), widths, widths_from, mode, why)
    with _deadline.limit(time_limit):  # stops the doubling and the method running at its next check
        k = None if widths is None else widths[0]
        res = _random(
            model, d, k, n_queries, max_queries, precision, batch_size, method, progress, random_state, n_jobs
        )
    return _with_plan(res, widths, widths_from, mode, why)


def _random(model, d, n_hidden, n_queries, max_queries, precision, batch_size, method, progress, random_state, n_jobs):
    """``extract`` by Gaussian queries (one hidden layer): doubling until the certificate
    holds, ``max_queries`` is reached or the ``time_limit`` set around it passes."""
    from ._auto import query_plan
    from .methods import run_method

    max_queries = 2_000_000 if max_queries is None else max_queries
    n_queries = 20_000 if n_queries is None else n_queries
    n0 = check_positive_int(n_queries, "n_queries", minimum=2 * (d + 1))
    max_queries = check_positive_int(max_queries, "max_queries", minimum=n0)
    batch = check_positive_int(batch_size, "batch_size")
    if method not in ("auto", "bjw19-gaussian", "atv21"):
        raise ValueError(f"method must be 'auto', 'bjw19-gaussian' or 'atv21'; got {method!r}")
    k_given = None if n_hidden is None else check_positive_int(n_hidden, "n_hidden")
    f, dtype_name = as_query_function(model)
    hint = (
        f"Gaussian queries (queries='random') have norm about sqrt(d) = {math.sqrt(d):.3g}; chosen queries "
        "reach far larger norms" + _saturation_note(model)
    )
    f = checked_query_function(f, d, hint)
    rng = check_random_state(random_state)

    Xs: list[np.ndarray] = []
    Ys: list[np.ndarray] = []
    out_dtype = [dtype_name]

    def draw(n_more, bar):
        done = sum(len(x) for x in Xs)
        for s in range(0, n_more, batch):
            if Xs and _deadline.passed():  # time_limit: fit what was drawn
                return
            Xb = rng.standard_normal((min(batch, n_more - s), d))
            Yb = f(Xb)
            if out_dtype[0] is None:
                out_dtype[0] = np.asarray(Yb).dtype.name
            Yb = np.asarray(Yb, dtype=np.float64)
            Xs.append(Xb)
            Ys.append(Yb)
            bar.update(done + s + len(Xb), "queries")

    n_total, result, history = n0, None, []
    bar = Progress(max_queries, "relufast.extract", progress)
    try:
        while True:
            draw(n_total - sum(len(x) for x in Xs), bar)
            X, Y_all = np.concatenate(Xs), np.concatenate(Ys)
            Y, centred = _drop_centred_column(Y_all)
            prec = resolve_precision(
                np.empty(0, dtype=out_dtype[0] if out_dtype[0] in ("float32", "float16") else np.float64), precision
            )
            vis = visible_units(X, Y, precision=prec)
            visible = vis.count
            # Dead or pruned units leave no trace: recover the visible ones. A unit whose
            # trace is below the statistic's floor may still be recovered: the given
            # n_hidden is tried first, the visible count after it.
            k_visible = min(max(visible, 1) if k_given is None else min(k_given, max(visible, 1)), d)
            for k in dict.fromkeys([min(k_given, d) if k_given is not None else k_visible, k_visible]):
                names = [method] if method != "auto" else query_plan(X, Y, k)
                for name in names:
                    opts = dict(precision=prec, random_state=rng, n_jobs=n_jobs)
                    left = _deadline.remaining()
                    if left is not None:  # extract's time_limit: the method's own, so it ends 'failed', not raised
                        opts["time_limit"] = max(left, 1e-6)
                    res = run_method(name, X, Y, k, opts, quiet=True)
                    if result is None or res.exact or (not result.exact and res.residual < result.residual):
                        result = res
                    if res.exact or _deadline.passed():
                        break
                if result is not None and (result.exact or _deadline.passed()):
                    break
            assert result is not None  # names is never empty
            history.append((len(X), result.status.value, float(result.residual)))
            if result.exact or 2 * n_total > max_queries or _deadline.passed():
                break
            if result.status == Status.UNSUPPORTED:  # more queries change nothing (e.g. the memory it needs)
                break
            n_total *= 2
    finally:
        bar.close()
    merged = merged_result(result, X, Y, n_jobs=n_jobs)  # None unless near-duplicates merge better
    result = result if merged is None else merged
    crypt = cryptanalytic_queries(d, k)
    counts = dict(result.counts, queries=len(X))
    diag = dict(result.diagnostics, cryptanalytic_queries=crypt, query_history=tuple(history), visible_units=visible)
    message = (
        f"{result.message}. Used {len(X)} Gaussian queries ({len(history)} rounds); "
        f"differential extraction [CJM20, CCHRSS23] needs of the order of {crypt} for d = {d}, k = {k} "
        "(relufast's own rough estimate, not the papers' counts: relufast.extraction.cryptanalytic_queries)"
    )
    if k_given is None or (result.n_hidden or 0) < k_given:
        message = _units_note(vis, k_given, k, Y.shape[1], d) + message
    if not result.exact and result.V is not None and merged is None:
        dup = near_duplicate_message(near_duplicates(result.V, d))
        message += f". {dup}" if dup else ""
    if not result.exact and k_given is None:
        message += (
            f". n_hidden was not given and {k} unit(s) were counted in the outputs: if the model has more, pass "
            "n_hidden (random queries), or queries='chosen' with n_hidden (chosen queries see units that Gaussian "
            "queries rarely activate)"
        )
    if not result.exact and _deadline.passed():
        diag["stopped_by"] = "time_limit"
        message += f". The time_limit passed after {len(X)} queries: give it more time (or none)"
    res = dataclasses.replace(result, counts=counts, diagnostics=diag, message=message)
    if centred and res.U is not None:  # the last output is minus the sum of the others
        res = dataclasses.replace(
            res, U=np.vstack([res.U, -res.U.sum(axis=0)]), c=None if res.c is None else np.append(res.c, -res.c.sum())
        )
    if not res.exact:
        warn(message)
    return res
