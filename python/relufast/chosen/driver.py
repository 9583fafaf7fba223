"""Chosen-query extraction of a deep ReLU network: the stages in order, and the certificate.

1. First layer: kinks on random lines, their hyperplanes, verified as global hyperplanes
   (:mod:`.first_layer`; [CJM20] Sec. 4, [RK20] Sec. 3).
2. Layers 2..L, peeled one at a time with the earlier layers known: each unit's bent
   boundary is followed across the known boundaries and fitted as a hyperplane in
   ``phi = [relu(z~_l), h_{l-1}]`` (:mod:`.deep`; [CJM20] Sec. 5, [RK20] Sec. 4).
3. Signs of each layer from the linear term of the next one; the output layer by least
   squares (:mod:`.fit`; relufast's own exact route where [CCHRSS24] uses neuron wiggles).
4. Exact polish: Gauss-Newton on all weights on points of known activation pattern.
5. Certificate: fresh queries at scales 1 to 1e4 and beyond every extracted unit's switching
   scale, beside every extracted boundary and in the wedges between nearly parallel ones,
   compared at the precision of the outputs (:mod:`.probes`).

References
----------
.. [CJM20] N. Carlini, M. Jagielski, I. Mironov, "Cryptanalytic Extraction of Neural Network
   Models", CRYPTO 2020.
.. [RK20] D. Rolnick, K. Kording, "Reverse-Engineering Deep ReLU Networks", ICML 2020.
.. [CCHRSS24] I. A. Canales-Martinez, J. Chavez-Saab, A. Hambitzer, F. Rodriguez-Henriquez,
   N. Satpute, A. Shamir, "Polynomial Time Cryptanalytic Extraction of Neural Network
   Models", EUROCRYPT 2024.
"""

from __future__ import annotations

import time

import numpy as np

from .. import _deadline
from .._blas import single_threaded_blas
from .._progress import Progress
from .._result import RecoveryResult, Run, Status, warn
from .._validation import NonFiniteOutputs, check_random_state
from .affine import affine_units, explained
from .deep import next_layer
from .first_layer import LINE_SCALES, KinkPool, first_layer, measure_again
from .fit import cert_tolerance, certify, output_layer, polish, resolve_signs
from .net import forward, pre_activations
from .oracle import BudgetSpent, Oracle
from .outfit import from_outputs
from .probes import certificate_probes
from .refit import refit_layer
from .residual import residual_lines
from .result import DeepResult
from .signs import wiggle_signs

__all__ = ["extract_chosen"]


#: Searches for a deeper layer's units before giving up (each draws new lines and keeps
#: the kinks found so far), and up to LAYER_TRIES_LAST while a layer lacks only its last
#: few units (LAST_UNITS): those, rarely active, switch on few lines, and their rows from
#: few kinks often miss the verification (a trained float32 784-64-64-10 given its first
#: layer found its 64th second-layer unit, active on 3% of Gaussian inputs, after 3.5
#: million queries; three searches ended at 2.1 million without it; a trained float64
#: 10-16-8-8-1 found its 8th third-layer unit, active on 0.5% of Gaussian inputs at scale
#: 3, in its ninth search: diagnostic runs).
LAYER_TRIES, LAYER_TRIES_LAST = 3, 10
#: Share of a layer's units found after LAYER_TRIES searches below which the search ends
#: there (all but one unit count as enough at any width); a float32 784-128-128-10 whose
#: first layer lacked 11 units proposed no second-layer unit in 32 minutes: a diagnostic run.
LAST_UNITS = 0.9


def _normalise(hidden, out):
    """Unit rows in every hidden layer, the scale moved into the next layer."""
    layers = [(W.copy(), b.copy()) for W, b in [*hidden, out]]
    for i in range(len(layers) - 1):
        W, b = layers[i]
        s = np.linalg.norm(W, axis=1)
        s = np.where(s > 0, s, 1.0)
        layers[i] = (W / s[:, None], b / s)
        Wn, bn = layers[i + 1]
        layers[i + 1] = (Wn * s[None, :], bn)
    return layers


def _fit_points(known, tent, n, d, rng):
    """Points for the output layer (and the polish): half at scale 1, half at scale 3 (deep
    networks: a quarter of them and n / 2 more at scale 10, where some combinations of
    active units are only met)."""
    X = np.vstack([rng.standard_normal((n - n // 2, d)), 3.0 * rng.standard_normal((n // 2, d))])
    if len(known):
        X[: n // 4] *= 10.0
        X = np.vstack([X, 10.0 * rng.standard_normal((n // 2, d))])
    return X


def _output_fit(known, tent, X, Y, oriented, affine=False):
    """(hidden layers with the last one's signs settled, output layer, signs ok, relative
    residual on X) from :func:`.fit.output_layer`; with ``affine`` (the units not found are
    affine in the layer below) from :func:`.affine.affine_units`, whose added units carry
    that term whatever the signs of the units found."""
    if affine:
        last, out, _ = affine_units(known, tent, X, Y)
        ok = True
    else:
        last, out, ok = output_layer(known, tent, X, Y, oriented=oriented)
    hidden = known + [last]
    return hidden, out, ok, float(np.linalg.norm(Y - forward(hidden, out, X)) / max(np.linalg.norm(Y), 1e-300))


def _rare_points(known, tent, X, n, d, rng, need):
    """More points at scale 3 (batches of n, FIT_ROUNDS at most) until every unit is active
    on at least ``need(fan_in)`` of X and them (a unit active on fewer is underdetermined
    in the polish)."""
    more = np.zeros((0, d))
    for _ in range(FIT_ROUNDS):
        Z, _ = pre_activations([*known, tent], np.vstack([X, more]))
        if all((z > 0).sum(axis=0).min() >= need(W.shape[1]) for z, (W, _) in zip(Z, [*known, tent])):
            break
        more = np.vstack([more, 3.0 * rng.standard_normal((n, d))])
    return more


def _answered(oracle, X, tries=4):
    """(X, the model's outputs there); where the model does not answer far out (a
    classifier's logits read from saturated probabilities), the points beyond half the
    largest norm are drawn in by half, up to ``tries`` times."""
    for _ in range(tries):
        try:
            return X, oracle(X)
        except NonFiniteOutputs:
            r = np.linalg.norm(X, axis=1)
            X = np.where((r > 0.5 * r.max())[:, None], 0.5 * X, X)
    return X, oracle(X)


def _both_sides(first, X, d, rng, need):
    """Points on both sides of the first-layer hyperplanes that ``X`` leaves on one side
    (``need(d)`` points a side at least): one far from the origin (trained networks have
    them) leaves its unit on one side at every point of :func:`_fit_points`, and the output
    fit cannot see it."""
    W1, b1 = first
    z1 = X @ W1.T + b1
    few = np.nonzero(np.minimum((z1 > 0).sum(axis=0), (z1 < 0).sum(axis=0)) < need(d))[0]
    return np.vstack([np.zeros((0, d)), *(_beside(W1[j], b1[j], 2 * need(d), rng) for j in few)])


def _beside(w, b, n, rng):
    """``n`` points at scale-1 distances from the hyperplane ``w.x + b = 0`` (half on each
    side), around Gaussian points projected on it."""
    u = w / np.linalg.norm(w)
    g = rng.standard_normal((n, len(w)))
    g -= ((g @ w + b) / np.linalg.norm(w))[:, None] * u[None, :]
    side = np.where(np.arange(n) % 2 == 0, 1.0, -1.0) * rng.uniform(0.1, 1.0, n)
    return g + side[:, None] * u[None, :]


#: The fraction of the first layer's units found with which a saturated search goes on at
#: low precision (in float64 it goes on with the units it found).
SATURATED_LOW = 0.75
#: Extra batches of fit points drawn for rarely active units.
FIT_ROUNDS = 3
#: Largest dense Jacobian (bytes) of the Gauss-Newton polish, which runs only when a layer
#: could not be refitted through precise kinks (:mod:`.refit`); above it the certificate
#: judges the network as it is.
POLISH_BYTES = 256 * 2**20
#: Largest array of fit points (bytes of float64 inputs).
FIT_BYTES = 64 * 2**20


def _refit(oracle, known, tent, rng, clock, diag, name, last, anchored=False):
    """The layer refitted through precise kinks (:mod:`.refit`) and oriented where the
    wiggles settle its signs (:mod:`.signs`); returns (layer, every row confirmed by its
    kinks (refitted whole, or in part where a unit before it is never active there), the
    units whose sign the wiggles settled). ``anchored``: the rows were refitted through kinks already
    (:func:`.refit.anchored_rows`, a first layer at low precision), only oriented."""
    # Its own random stream (spawned, no draw taken from rng): the searches for the next
    # layer see the same lines whatever the refit drew.
    sub = _spawn(rng)
    if anchored:
        W, b, n, why = tent[0], tent[1], len(tent[0]), {}
    else:
        with clock.stage("refit"):
            W, b, n, why = refit_layer(oracle, known, tent, sub, last=last)
    note = (" (" + ", ".join(f"{v} {k}" for k, v in why.items()) + ")") if why else ""
    note += " (through kinks around their own)" if anchored else ""
    diag.setdefault("refitted_rows", []).append(f"{name}: {n} of {len(W)}{note}")
    with clock.stage("signs"):
        flip, settled = wiggle_signs(oracle, known, (W, b), sub)
    diag.setdefault("signs_by_wiggle", []).append(f"{name}: {int(settled.sum())} of {len(W)}")
    s = np.where(flip, -1.0, 1.0)
    confirmed = n + why.get("in part", 0)
    if oracle.low_precision:
        # A row no segment could test (too few clean ones, or none reaching its boundary)
        # is no evidence of a wrong unit; at low precision the search again with the signs
        # open that a wrong unit calls for (_stages) groups by null spaces that float32
        # normals at d = 784 do not resolve: a trained float32 784-64-64-10 whose rarely
        # active second-layer unit had too few clean segments was still there 4 minutes on.
        # The row stays as the search found it and the certificate judges it.
        confirmed += sum(why.get(r, 0) for r in UNTESTED)
    return (W * s[:, None], b * s), confirmed == len(W), settled


#: Seed of the points that test whether the last layer's units not found are affine in the
#: layer below (:mod:`.affine`).
AFFINE_SEED = 20260

#: Reasons of :func:`.refit.refit_layer` for a row it could not test.
UNTESTED = ("too few clean segments", "boundary not reached")


def _peel(oracle, known, tent, settled, li, widths, rng, pool, clock, diag, tries):
    """Layer ``li + 1`` found after the final ``known`` layers and the tentative ``tent``
    (:func:`.deep.next_layer`, ``tries`` searches), ``tent``'s signs settled (by the wiggles
    where ``settled`` holds for every unit, else by the new layer's linear term) and the new
    layer refitted. Returns (tent final, new tentative layer, its rows confirmed, the units
    of it whose signs the wiggles settled, signs ok) or None."""
    oriented = bool(np.all(settled))
    found = None
    carry: dict = {}  # kept between the searches (.deep.next_layer), and the affine test
    if li + 1 == len(widths) and not oracle.low_precision:
        # The units no search finds may never switch (.affine); their test has its own points
        # and random stream, so the searches draw what they drew without it.
        points = np.random.default_rng(AFFINE_SEED)
        room = lambda Theta: len(Theta) + 2 * oracle.n_outputs <= widths[li]  # noqa: E731 (the units added)
        carry["affine"] = lambda Theta: room(Theta) and explained(oracle, known, tent, Theta, points, carry)
    with clock.stage(f"layer_{li + 1}"):
        if li == 1 and oracle.low_precision and oriented:  # the pool's first normals, behind layer 1 now
            diag["normals_again"] = measure_again(oracle, pool, [tent], rng)
        last_layer = li + 1 == len(widths)
        nearly = min(LAST_UNITS * widths[li], widths[li] - 1)
        if last_layer and oracle.low_precision:  # its last units from the outputs (.outfit), every round,
            # on their own random stream (spawned: the searches draw the lines they drew without it)
            sub = _spawn(rng)
            carry["outfit"] = lambda Th: from_outputs(oracle, known, tent, Th, widths[li], sub, carry, oriented, nearly)
        for i in range(tries):  # each try draws new lines; the kink pool and units found are kept
            # Where residual lines follow a search that lacks only the last units, its chains
            # are cut short (.deep.NEARLY_CHAIN_ROUNDS).
            found = next_layer(
                oracle,
                known,
                tent,
                widths[li],
                widths,
                rng,
                pool,
                oriented=oriented,
                carry=carry,
                settled=settled,
                nearly=nearly if last_layer and i + 1 < tries else None,
            )
            if found is not None:
                break
            have = len(carry.get("Theta", ()))
            if i + 1 >= LAYER_TRIES and have < nearly:
                break  # tries past LAYER_TRIES are for the last few units only
            if last_layer and have >= nearly and i + 1 < tries:
                # The last units switch on few random lines: lines where the outputs' fit on
                # the units found misses (.residual), for the next search's pool (none after
                # the last search). First the rows the outputs' fit gives (.outfit).
                if "outfit" in carry and len(carry["outfit"](carry["Theta"])) >= widths[li]:
                    kt, Theta = len(tent[0]), carry["Theta"]
                    found = Theta[:, :kt], Theta[:, kt:-1], Theta[:, -1]
                    break
                diag["residual_lines"] = diag.get("residual_lines", 0) + residual_lines(
                    oracle, known, tent, carry["Theta"], rng, pool, oriented, widths[li] - len(carry["Theta"])
                )
    if carry.get("output_rows"):
        diag["output_rows"] = diag.get("output_rows", 0) + carry["output_rows"]
    if found is None:
        return None
    coef, beta, const = found
    if len(coef) < widths[li]:  # the rest affine in the layer below (.affine)
        diag["affine_rest"] = widths[li] - len(coef)
    with clock.stage("signs"):
        W, b, Wn, bn, ok = resolve_signs(tent[0], tent[1], coef, beta, const)
    if oriented:  # the wiggles settled every sign: the linear term must agree
        ok &= bool(np.array_equal(np.sign(W), np.sign(tent[0])))
        W, b, Wn, bn = tent[0], tent[1], coef, const
    s = np.linalg.norm(Wn, axis=1)
    nxt, done, nxt_settled = _refit(
        oracle, known + [(W, b)], (Wn / s[:, None], bn / s), rng, clock, diag, f"layer {li + 1}", li + 1 == len(widths)
    )
    return (W, b), nxt, done, nxt_settled, ok


def _spawn(rng):
    seq = getattr(rng.bit_generator, "seed_seq", None)
    return np.random.default_rng(seq.spawn(1)[0] if seq is not None else rng.integers(2**63))


def _stages(oracle, widths, rng, clock, diag, fit):
    """The extraction proper; returns (hidden, out, ok, note); the output layer's fit
    points and answers go into ``fit`` (``"X"``, ``"Y"``)."""
    d, L = oracle.d, len(widths)
    pool = KinkPool(d)
    with clock.stage("first_layer"):
        W, b, rounds, saturated = first_layer(oracle, widths[0], widths, rng, pool)
    diag["line_rounds"] = rounds
    # Only in float64 is a unit that no line shows one the function does not need: at low
    # precision a stall is kinks whose normals are too coarse to verify (a trained float32
    # 784-64-64-10 saturated with a fraction of its units and went on for minutes without
    # the rest; now it fails at the first layer: bench/test_bench_trained.py).
    # At low precision it goes on only with most of the units (SATURATED_LOW of them): units
    # whose output weights are below the rounding (a float32 784-128-1 with output weights
    # 0.001 and 0.008 of 128 units); the certificate then says how far the rest misses.
    enough = not oracle.low_precision or len(W) >= SATURATED_LOW * widths[0]
    if len(W) < widths[0] and not (saturated and len(W) and enough):
        return None, None, False, f"found {len(W)} of the {widths[0]} first-layer units"
    if len(W) < widths[0]:  # no line shows the others: extract the function, report them
        diag["undetermined_units"] = widths[0] - len(W)
        widths = (len(W), *widths[1:])
    # At low precision the first layer's rows were refitted through kinks as they were found
    # (:func:`.refit.anchored_rows`): to 1e-6-2e-5 at d = 784 in float32, where the float64
    # refit's boundary points fell outside its segments for 10 of 31 rows (ad-hoc runs of a
    # float32 784-32-1: certified at 7.7e-7 without it in 1.1 million queries, 2.6 million
    # with it).
    low = oracle.low_precision
    tent, _, settled = _refit(oracle, [], (W, b), rng, clock, diag, "layer 1", L == 1, anchored=low)
    oriented = bool(settled.all())
    known: list = []
    signs_ok = True
    for li in range(1, L):
        peeled = _peel(oracle, known, tent, settled, li, widths, rng, pool, clock, diag, LAYER_TRIES_LAST)
        if peeled is not None and oriented and not peeled[2]:
            # A unit the clustering of oriented kinks proposed that no segment confirms
            # (its kinks do not fit it): search again with the signs open.
            diag.setdefault("layer_searches_again", []).append(li + 1)
            no_signs = np.zeros(len(tent[0]), dtype=bool)
            peeled = _peel(oracle, known, tent, no_signs, li, widths, rng, pool, clock, diag, 1)
        if peeled is None:
            return None, None, False, f"layer {li + 1}: fewer than {widths[li]} units found"
        layer, tent, _, settled, ok = peeled
        oriented = bool(settled.all())
        signs_ok &= ok
        known = known + [layer]
    m = oracle.n_outputs
    k_prev = widths[-2] if L > 1 else d
    n_par = sum(k * (p + 1) for k, p in zip([*widths, m], [d, *widths]))
    # Every unit active on twice its fan-in (the signs of the last hidden layer come from
    # this fit's linear term unless the wiggles settled them); three equations a weight
    # while that stays small (the polish may use them), else FIT_BYTES of inputs.
    n_fit = int(max(4 * (widths[-1] + k_prev + 1), min(np.ceil(3 * n_par / m), FIT_BYTES // (8 * d)))) + 2 * d
    need = lambda fan_in: 2 * (fan_in + 1)  # noqa: E731
    target = cert_tolerance(oracle.eps, (d, *widths)) / 16
    with clock.stage("output_layer"):
        X = _fit_points(known, tent, n_fit, d, rng)
        X = np.vstack([X, _both_sides([*known, tent][0], X, d, rng, need)])
        X, Y = _answered(oracle, X)
        affine = bool(diag.get("affine_rest"))
        hidden, out, ok, res = _output_fit(known, tent, X, Y, oriented, affine)
        if res > 4 * target or not ok:
            # Rarely active units: more points where they are (the fit, its signs and the
            # polish need each unit active on twice its fan-in).
            X2, Y2 = _answered(oracle, _rare_points(known, tent, X, n_fit, d, rng, need))
            X, Y = np.vstack([X, X2]), np.vstack([Y, Y2])
            hidden, out, ok, res = _output_fit(known, tent, X, Y, oriented, affine)
    signs_ok &= ok
    diag["signs_resolved"] = signs_ok
    diag["fit_residual"] = res
    if res > 4 * target and len(X) * m * n_par * 8 <= POLISH_BYTES:
        with clock.stage("polish"):
            hidden, out, res, used = polish(hidden, out, X, Y, margin=oracle.eps**0.25 / 2, target=target)
        diag["polish_residual"], diag["polish_points"] = res, used
    fit["X"], fit["Y"] = X, Y
    if diag.get("undetermined_units"):
        hidden, out = _pad(hidden, out, 0, diag["undetermined_units"])
    if diag.get("affine_rest"):  # after the units found and those carrying the affine part
        hidden, out = _pad(hidden, out, len(hidden) - 1, widths[-1] - len(hidden[-1][0]))
    return hidden, out, True, ""


def _pad(hidden, out, li, n):
    """Layer ``li`` (0 the first hidden one) with ``n`` units more, never active (zero row,
    bias -1) and read by nothing (zero columns in the layer after): the network keeps the
    requested widths."""
    layers = [*hidden, out]
    W, b = layers[li]
    layers[li] = (np.vstack([W, np.zeros((n, W.shape[1]))]), np.append(b, -np.ones(n)))
    Wn, bn = layers[li + 1]
    layers[li + 1] = (np.hstack([Wn, np.zeros((Wn.shape[0], n))]), bn)
    return layers[:-1], layers[-1]


#: Relative error under which a network that is not exact is "close": wrong only by the
#: accuracy of its weights (in-class models end there when the polish stops early); or
#: CLOSE_TOL times the certificate's tolerance where that is more (float32).
CLOSE, CLOSE_TOL = 1e-6, 100.0


def _close_bar(tol):
    """The error under which a network is close (:data:`CLOSE`), for certificate tolerance ``tol``."""
    return max(CLOSE, CLOSE_TOL * tol)


def _underdetermined_signs(dims, m):
    """Hidden layers whose signs the next layer's linear term cannot fix: k_l unknown signs
    against k_{l-1} k_{l+1} equations (one hidden layer: k > d m)."""
    full = (*dims, m)
    return [li + 1 for li in range(len(dims) - 1) if full[li + 1] > full[li] * full[li + 2]]


def _probed(cert):
    """Where the certificate looked, in words."""
    n = cert["counts"]
    where = f"{cert['queries']} fresh queries at scales 1 to {cert['top_scale']:.3g}"
    if cert["top_scale"] >= cert["readable_scale"]:
        where += (
            " (the largest scale at which the model's outputs can be read: beyond it a classifier's "
            "probabilities round to 0 or 1 and its logits are lost)"
        )
    if n.get("boundaries"):
        where += f", {n['boundaries']} beside the first-layer boundaries"
    if n.get("deep boundaries"):
        where += f", {n['deep boundaries']} beside deeper ones"
    if n.get("co-active"):
        where += f", {n['co-active']} where a deeper unit and one of the layer before it are both active"
    if n.get("wedges"):
        where += f", {n['wedges']} in the wedges between nearly parallel ones"
    return where + f", in {cert['calls']} calls"


#: The certificate's kinds of probes (:mod:`.probes`) in messages.
PLACES = {
    "boundaries": "beside a first-layer boundary",
    "deep boundaries": "beside a deeper boundary",
    "co-active": "where a deeper unit and a unit of the layer before it are both active",
    "wedges": "in a wedge between nearly parallel boundaries",
    "repeats": "on a point asked in every call",
}


def _miss(cert, tol):
    """(where the largest error is, the largest scale up to which every scale agrees or None)."""
    family, scale, _ = cert["worst"]
    where = f"at scale {scale:.3g}" if family == "scales" else f"{PLACES[family]} (scale {scale:.3g})"
    ok = None
    for s, e in sorted(cert["by_scale"].items()):
        if e > tol:
            break
        ok = s
    return where, ok


def _verdict(exact, have, cert, tol, prec, note, dims, oracle, diag):
    """(status, message) of an extraction: exact (saying on which probes), a network that
    misses the model (where, and the causes that fit: in the class or not), or none."""
    widths = tuple(dims[1:])
    shape = "-".join(map(str, (*dims, oracle.n_outputs)))
    if exact:
        n_un = diag.get("undetermined_units", 0)
        return Status.EXACT, (
            f"chosen queries: network {shape} reproduces the model to {cert['error']:.2g} (tolerance {tol:.2g} "
            f"at {prec}) on {_probed(cert)} (exact holds on these probes: a difference confined to a region "
            "none of them visits cannot be seen)"
        ) + (
            f"; {n_un} of the {widths[0]} first-layer units showed on no search line at lengths up to "
            f"{3 * LINE_SCALES[-1]:g}: the function needs only the other {widths[0] - n_un}, and the {n_un} "
            "(dead, or with output weights below the rounding) are returned never active and listed in "
            "undetermined_units: exact means the function, not those units' weights"
            if n_un
            else ""
        ) + (
            f"; {diag['affine_rest']} of the {widths[-1]} last-layer units switched on no search and the "
            "outputs are affine in the layer below wherever they were tested: those units are active "
            "everywhere (their part is affine) or nowhere, so the function needs only the others and that "
            "affine part, which always-active units carry; they are listed in undetermined_units (exact "
            "means the function, not those units' weights)"
            if diag.get("affine_rest")
            else ""
        )
    again = "another random_state may certify it"
    if have and cert is None:
        return Status.FAILED, f"chosen queries: {note}; the network {shape} is not certified"
    if have:
        residual = cert["error"]
        status = Status.APPROXIMATE if np.isfinite(residual) and residual < 1e-2 else Status.FAILED
        where, ok = _miss(cert, tol)
        head = f"chosen queries: the extracted network {shape} misses the model by {residual:.2g} {where} "
        head += f"(tolerance {tol:.2g} at {prec}" + (f"; it agrees at scales 1 to {ok:.3g})" if ok else ")")
        if diag.get("outputs_read_from") == "logistic probabilities":
            return status, head + (
                ": the logit of a binary classifier is read from its probability p, to about eps (1 + e^z) (1 - p "
                "loses its digits as p nears 1): away from its decision boundary it is not known to the rounding "
                "of float64, so the certificate cannot reach it (relufast.bridges.logit_function)"
            )
        if cert["inconsistent"] > tol:
            return status, head + (
                f": the model answered the same queries differently in different calls (by "
                f"{cert['inconsistent']:.2g}): it is not a fixed function (a state, dropout or noise drawn per call)"
            )
        n_un = diag.get("undetermined_units")
        if n_un:
            return status, head + (
                f": {n_un} of the {widths[0]} first-layer units showed on no search line (lengths up to "
                f"{3 * LINE_SCALES[-1]:g}) and the network without them misses the model: units too weak for "
                "the precision of the queries (a kink below the rounding of the outputs where it is measured: "
                "trained units whose output weights decayed towards 0), units that switch farther out, or "
                "fewer units in the model than these widths and a part no ReLU network has"
            )
        if diag.get("affine_rest"):
            return status, head + (
                f": the search stopped with {diag['affine_rest']} of the {widths[-1]} last-layer units not found, "
                "the outputs affine in the layer below at every point tested, and the network with that affine "
                "part misses the model: a unit among them switches where no test point was (rarely, or far out)"
            )
        few = diag.get("signs_underdetermined_layers")
        if few:
            return status, head + (
                f": signs unresolved (layer {', '.join(map(str, few))} has more units than the widths on either "
                "side of it multiply to, so the next layer's linear term has fewer equations than signs): the "
                "flipped units are guesses; a limit of the extraction, which says nothing against the model "
                "being a ReLU network of these widths"
            )
        if diag.get("signs_resolved") is False:
            return status, head + (
                ": signs unresolved (the next layer's linear term is not the one of flipped units): a ReLU "
                f"network of widths {widths} whose signs the extraction could not settle ({again}), or a model "
                "with a part no such network has (a linear skip connection, another activation, wrong widths)"
            )
        if residual <= _close_bar(tol):
            return status, head + (
                ": close, but not to the rounding of the outputs: the weights were not refined to it "
                f"(in-class networks end here, e.g. with outputs far from unit scale; {again}), or the "
                "model differs slightly from a ReLU network (a leaky slope, noise)"
            )
        if ok is not None:
            return status, head + (
                f": it differs only beyond scale {ok:.3g}, so the model is not a ReLU network of widths "
                f"{widths} (clipping, saturation, a unit that switches only far from the origin: more units), "
                f"or the extraction took a wrong unit ({again})"
            )
        if cert["by_family"]["scales"] <= tol:
            return status, head + (
                ": the model has a boundary the network lacks next to one of its own (two nearly parallel "
                f"units taken as one: more units?), or the extraction placed a boundary wrongly ({again})"
            )
        return status, head + (
            f": the model is not a ReLU network of widths {widths} (another activation, clipping, skip "
            f"connections, wrong widths), or the extraction took a wrong unit ({again})"
        )
    if diag.get("stopped_by") == "time_limit":
        return Status.FAILED, f"chosen queries: {note}; give it a larger time_limit (or none)"
    if oracle.precision is not None and oracle.precision.name in ("float16", "bfloat16") and "max_queries" not in note:
        return Status.FAILED, (
            f"chosen queries: {note}, from {oracle.precision.name} outputs: their rounding "
            f"({oracle.eps:.2g}) is too coarse to locate kinks and measure their hyperplanes; query the "
            "model in float32 or float64"
        )
    return Status.FAILED, (
        f"chosen queries: {note}. The model may not be a ReLU network with hidden widths {widths}, a unit "
        f"may switch only rarely near the origin (another random_state may find it), or max_queries is too small"
    )


def _run(oracle, widths, rng, clock, diag, time_limit, readable):
    """The stages under ``time_limit``, then the certificate of a completed network:
    (hidden, out, certificate, note, queries of the extraction)."""
    hidden = out = cert = None
    note = ""
    fit: dict = {}
    try:
        # NumPy's BLAS at one thread: the linear algebra here is many small and middle-sized
        # solves, which multithreaded OpenBLAS slows several times over when the cores are
        # shared (its workers spin).
        with single_threaded_blas(), _deadline.limit(time_limit):
            hidden, out, _, note = _stages(oracle, widths, rng, clock, diag, fit)
    except BudgetSpent as exc:
        note, hidden, out = f"{exc}: stopped before the network was complete", None, None
        diag["stopped_by"] = "max_queries"
    except _deadline.TimeLimitReached as exc:
        stage = f" (stage {clock.raised_in.replace('_', ' ')})" if clock.raised_in else ""
        note, hidden, out = f"{exc}{stage}: stopped before the network was complete", None, None
        diag["stopped_by"] = "time_limit"
    except np.linalg.LinAlgError as exc:  # a failed result, as the passive methods give
        stage = f" in stage {clock.raised_in.replace('_', ' ')}" if clock.raised_in else ""
        note, hidden, out = f"numerical breakdown{stage} ({exc}): stopped before the network was complete", None, None
        diag["stopped_by"] = "numerical breakdown"
    n_extract = oracle.n_queries
    if hidden is not None:
        few = _underdetermined_signs((oracle.d, *widths), oracle.n_outputs)
        if few and not diag.get("signs_resolved"):  # the subset sum found no 0/1 solution
            diag.update(signs_resolved=False, signs_underdetermined_layers=tuple(few))
        try:
            with clock.stage("certificate"), single_threaded_blas():
                cert = certify(oracle, hidden, out, rng, readable=readable)
            tol = cert_tolerance(oracle.eps, (oracle.d, *widths))
            left = None if time_limit is None else time_limit - (time.perf_counter() - clock.t_start)
            # Close as the status calls it (below): in float32 up to CLOSE_TOL x the tolerance (a planted
            # float32 10-15-15-1 at seed 1 ended `approximate` at 3.6e-5, tolerance 1.2e-5, with a
            # second-layer row 4.8e-3 off where it was refitted only in part; repaired: 6.8e-8).
            if tol < cert["error"] < _close_bar(tol) and "X" in fit and (left is None or left > 0):
                with clock.stage("repair"), single_threaded_blas(), _deadline.limit(left):
                    hidden, out, cert = _repair(oracle, hidden, out, cert, fit, rng, readable, diag)
        except BudgetSpent as exc:
            note = f"{exc} by the certificate"
        except _deadline.TimeLimitReached:
            diag["repair"] = "stopped by the time_limit"
    return hidden, out, cert, note, n_extract


def _repair(oracle, hidden, out, cert, fit, rng, readable, diag):
    """A network close to the model but not certified (its error between the tolerance and
    CLOSE, or CLOSE_TOL times the tolerance where that is more): the weights polished again on
    the fit points and REPAIR_SETS sets of the certificate's kind of probes (both sides of
    every boundary, scales up to REPAIR_TOP), answered by the model, and certified again on
    fresh probes; kept only where that certificate's error is smaller. A row refitted only
    in part (a unit of the layer before never active at its kinks) can keep an error at the
    rounding's thousandfold that the fit points, drawn away from the boundaries, do not show
    (the trained diabetes 10-16-8-1: 7.8e-14 beside a second-layer boundary)."""
    m, d = oracle.n_outputs, oracle.d
    n_par = sum(W.size + b.size for W, b in [*hidden, out])
    Xp = np.vstack([certificate_probes(hidden, rng, top=REPAIR_TOP)[0] for _ in range(REPAIR_SETS)])
    if (len(fit["X"]) + len(Xp)) * m * n_par * 8 > POLISH_BYTES:
        diag["repair"] = "skipped (the polish's Jacobian would exceed POLISH_BYTES)"
        return hidden, out, cert
    Xp, Yp = _answered(oracle, Xp)
    X, Y = np.vstack([fit["X"], Xp]), np.vstack([fit["Y"], Yp])
    target = cert_tolerance(oracle.eps, (d, *[W.shape[0] for W, _ in hidden])) / 16
    h2, o2, _, _ = polish(hidden, out, X, Y, margin=oracle.eps**0.25 / 2, target=target)
    cert2 = certify(oracle, h2, o2, rng, readable=readable)
    diag["repair"] = (
        f"polished on {len(Xp)} more points beside the boundaries: error {cert['error']:.2g} -> {cert2['error']:.2g}"
    )
    if cert2["error"] < cert["error"]:
        return h2, o2, cert2
    return hidden, out, cert


#: Sets of the certificate's probes (scales up to REPAIR_TOP) added to the fit points when a
#: network is close to the model but not certified (:func:`_repair`).
REPAIR_SETS, REPAIR_TOP = 4, 10.0


def extract_chosen(
    f,
    n_features,
    widths,
    *,
    max_queries=None,
    dtype_name=None,
    precision=None,
    random_state=None,
    time_limit=None,
    progress=None,
    batch_size=None,
    readable=None,
    max_queries_low=None,
):
    """Extract a ReLU network with ``len(widths)`` hidden layers from a query function.

    Parameters
    ----------
    f : callable
        float64 (n, d) -> (n, m) outputs (any float dtype, the same number of outputs and
        dtype on every call).
    n_features : int
    widths : tuple of int
        Hidden widths (k_1, ..., k_L).
    max_queries : int or None
    max_queries_low : int or None
        The budget instead of ``max_queries`` where the outputs are low precision (float32).
    dtype_name : str or None
        Output dtype when known before the first call (torch modules).
    precision : None, str or float
        Precision of the outputs (default: their dtype).
    random_state : None, int or numpy Generator
    time_limit : float or None
        Seconds the extraction may take: checked before every call of the model and every
        stage; once passed, the run stops with ``diagnostics["stopped_by"] = "time_limit"``.
        The certificate of a network completed in time still runs (a few hundred queries).
    progress : bool or None
        A line on stderr with the stage, the queries and the seconds so far, and the share
        of ``max_queries`` spent (None: on a terminal only).
    batch_size : int or None
        Most queries in one call of the model (None: as many as a step asks for).
    readable : callable or None
        Outputs (n, m) -> bool (n,): where the model's outputs can be read (the ``readable``
        of :func:`relufast.bridges.logit_function`); the certificate stays at those scales.

    Returns
    -------
    RecoveryResult (one hidden layer) or DeepResult
        ``exact`` when the network reproduces the model to :func:`.fit.cert_tolerance` on
        every probe of the certificate (:func:`.fit.certify`); ``diagnostics`` holds its
        errors by scale and by kind of probe, its queries and the extraction's.

    Raises
    ------
    ValueError
        When the model's number of outputs or output dtype changes between calls.
    """
    rng = check_random_state(random_state)
    clock = Run("chosen")  # its stage timings (the result is built here)
    bar = Progress(max_queries, "relufast.extract (chosen)", progress)

    def report(oracle, stage=None, force=False):
        stage = stage or (clock.current or "").replace("_", " ")
        spent = time.perf_counter() - clock.t_start
        bar.total = oracle.max_queries or bar.total  # the low-precision budget once the outputs show it
        bar.update(oracle.n_queries, f"{stage}: {oracle.n_queries:,} queries, {spent:.0f} s   ", force)

    oracle = Oracle(
        f, n_features, max_queries, dtype_name, precision, batch_size, report if bar.enabled else None, max_queries_low
    )
    clock.meter = lambda: oracle.n_queries  # queries by stage: diagnostics["queries_by_stage"]
    diag: dict = {}
    if getattr(readable, "reads", None):
        diag["outputs_read_from"] = readable.reads
    try:
        hidden, out, cert, note, n_extract = _run(oracle, tuple(widths), rng, clock, diag, time_limit, readable)
        report(oracle, "done", force=True)
    finally:
        bar.close()
    clock.seconds["total"] = time.perf_counter() - clock.t_start
    prec = oracle.precision.name if oracle.precision is not None else "float64"
    tol = cert_tolerance(oracle.eps, (n_features, *widths))
    residual = float(cert["error"]) if cert is not None else np.inf
    exact = cert is not None and residual <= tol
    diag.update(certificate_tolerance=tol, extraction_queries=n_extract, queries_by_stage=dict(clock.metered))
    if cert is not None:
        diag.update(
            certificate_errors=dict(cert["by_family"]),
            certificate_scales=dict(cert["by_scale"]),
            certificate_queries=cert["queries"],
            certificate_inconsistency=cert["inconsistent"],
            certificate_probes=dict(cert["counts"]),
        )
    status, message = _verdict(exact, hidden is not None, cert, tol, prec, note, (n_features, *widths), oracle, diag)
    counts = {"queries": oracle.n_queries, "calls": oracle.n_calls}
    layers = None if out is None else _normalise(hidden, out)
    common = dict(
        status=status,
        message=message,
        exact=exact,
        residual=residual,
        seconds=clock.seconds,
        counts=counts,
        diagnostics=diag,
        precision=prec,
    )
    n_un = diag.get("undetermined_units", 0) if layers is not None else 0
    padded = tuple(range(widths[0] - n_un, widths[0]))  # _pad put them last
    if len(widths) > 1:
        n_rest = diag.get("affine_rest", 0) if layers is not None else 0
        rest = tuple((len(widths), i) for i in range(widths[-1] - n_rest, widths[-1]))  # _pad
        res = DeepResult(layers=layers, undetermined_units=tuple((1, i) for i in padded) + rest, **common)
    else:
        (V, b), (U, c) = layers if layers is not None else ((None, None), (None, None))
        res = RecoveryResult(U=U, V=V, b=b, c=c, method="chosen", undetermined_units=padded, **common)
    if not exact:
        warn(message)
    return res
