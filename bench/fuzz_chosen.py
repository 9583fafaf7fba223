"""Fuzz the chosen-query certificate: ``exact`` must mean the network is right at every scale.

Seeded random models of two kinds, extracted with ``relufast.extract(..., queries="chosen")``:

- just outside the class: ReLU capped, outputs clipped, leaky slopes from 1e-8 to 1e-1, a
  linear skip connection, max-pooling of unit pairs, outputs rounded, noise, dropout, a unit
  that switches only far out (bias -30 to -3000) or a pair of nearly parallel units (cos
  1 - 1e-7 to 1 - 1e-4, biases 1e-4 to 1e-2 apart) with n_hidden one short, wrong widths,
  and outputs whose number changes between calls;
- inside it: ReLU networks of depth 1-5 and d = 1-200, outputs scaled by 1e-6 to 1e6, int8
  weights, duplicated and dead units, float32 outputs.

For every ``exact`` result the script draws fresh Gaussian inputs at scales 1, 10, 100, 1e3
and 1e4 and checks that the network's error relative to the model's largest output at that
scale is at rounding level (1e-8 for float64 outputs, 1e-4 for float32). An in-class model
that is not exact is extracted again with another random state; when that one is exact, the
first message must not blame the model (say it is outside the class with no in-class cause:
another random_state, signs unresolved, max_queries, the rounding of the weights). A
``ValueError`` with a message is an allowed refusal (outputs that change between calls must
be refused); any other exception is a bug.

Run: ``python bench/fuzz_chosen.py --quick`` (about 60 cases, a few minutes on two shared
cores) or ``python bench/fuzz_chosen.py --cases 400 [--seed 0] [--minutes 20]``. Prints one
line per problem and the counts; exits 1 on a wrong ``exact``, a blame or an exception.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings

import numpy as np

import relufast

OUTSIDE = (
    "clip_hidden",
    "clip_outputs",
    "leaky",
    "skip",
    "maxpool",
    "rounding",
    "noise",
    "dropout",
    "far_unit",
    "near_parallel",
    "wrong_widths",
    "changing_outputs",
)
INSIDE = ("plain", "scaled", "int8", "duplicated", "dead", "deep", "wide_input", "float32")
#: Largest relative error on fresh inputs of an ``exact`` network, by output precision.
ROUNDING = {"float64": 1e-8, "float32": 1e-4}
#: Scales of the fresh inputs that check an ``exact`` network.
CHECK_SCALES = (1.0, 10.0, 100.0, 1e3, 1e4)
#: Query budget of every extraction (bounds the time of a case).
MAX_QUERIES = 100_000
#: In-class causes a message may give for a non-exact result (so it does not blame the model).
IN_CLASS_CAUSES = ("another random_state", "signs unresolved", "max_queries", "rounding", "float16")


def _log_uniform(rng, lo, hi):
    return float(10.0 ** rng.uniform(np.log10(lo), np.log10(hi)))


def draw_case(rng):
    """One case: what to plant, how to spoil it, and the widths to extract."""
    inside = rng.random() < 0.5
    family = str(rng.choice(INSIDE if inside else OUTSIDE))
    depth = int(rng.choice([1, 1, 1, 2, 2, 3]))
    d = int(rng.integers(3, 13))
    if family == "deep":
        depth = int(rng.integers(3, 6))
        d = int(rng.integers(4, 9))
    if family == "wide_input":
        d = int(np.round(_log_uniform(rng, 1, 200)))
        depth = 1
    widths = [int(rng.integers(2, 7 if depth <= 2 else 5)) for _ in range(depth)]
    if family == "wide_input":
        widths = [int(rng.integers(1, 6))]
    return {
        "inside": inside,
        "family": family,
        "d": d,
        "widths": widths,
        "m": int(rng.integers(1, 4)),
        "param": float(rng.random()),
        "seed": int(rng.integers(2**31)),
    }


def _relu_net(hidden, out, act=None, dtype=np.float64):
    return relufast.planted.relu_function(hidden, out, dtype, act)


def plant(case):
    """(model callable, widths to extract, output precision, changed) of a case; ``changed()``
    tells whether the model's outputs changed between the calls made so far (changing_outputs)."""
    rng = np.random.default_rng(case["seed"])
    d, widths, m, u, fam = case["d"], list(case["widths"]), case["m"], case["param"], case["family"]
    hidden, out = relufast.planted.deep_relu(d, tuple(widths), m, random_state=case["seed"])
    hidden = [(W.copy(), b.copy()) for W, b in hidden]
    prec, changed = "float64", lambda: False
    f = _relu_net(hidden, out)
    if fam == "clip_hidden":
        cap = 10.0 ** (0.5 + 2.0 * u)
        f = _relu_net(hidden, out, act=lambda z: np.clip(z, 0.0, cap))
    elif fam == "clip_outputs":
        g, cap = f, 10.0 ** (1.0 + 2.0 * u)
        f = lambda X: np.clip(g(X), -cap, cap)
    elif fam == "leaky":
        slope = 10.0 ** (-8.0 + 7.0 * u)
        f = _relu_net(hidden, out, act=lambda z: np.where(z > 0, z, slope * z))
    elif fam == "skip":
        g, a = f, 0.1 * rng.standard_normal((d, m)) * 10.0 ** (-3.0 * u)
        f = lambda X: g(X) + np.asarray(X) @ a
    elif fam == "maxpool":
        Wo, c = out

        def f(X, hidden=hidden):
            H = np.asarray(X, dtype=np.float64)
            for W, b in hidden:
                H = np.maximum(H @ W.T + b, 0.0)
            H = H.copy()
            H[:, 0] = np.maximum(H[:, 0], H[:, -1])  # unit 0 max-pools itself with the last unit
            return H @ Wo.T + c

    elif fam == "rounding":
        g, q = f, 10.0 ** (-12.0 + 9.0 * u)
        f = lambda X: np.round(g(X) / q) * q
    elif fam == "noise":
        g, s = f, 10.0 ** (-12.0 + 9.0 * u)
        f = lambda X: g(X) + s * rng.standard_normal((len(X), m))
    elif fam == "dropout":
        p = 0.001 + 0.2 * u

        def f(X, hidden=hidden):  # left on at inference: a mask per query and unit
            H = np.asarray(X, dtype=np.float64)
            for W, b in hidden:
                H = np.maximum(H @ W.T + b, 0.0) * (rng.random((len(H), W.shape[0])) > p) / (1 - p)
            return H @ out[0].T + out[1]

    elif fam == "far_unit":  # one unit more than extracted, switching only far out
        li = int(rng.integers(len(hidden)))
        W, b = hidden[li]
        w = rng.standard_normal(W.shape[1])
        hidden[li] = (np.vstack([W, w / np.linalg.norm(w)]), np.append(b, -(10.0 ** (1.5 + 2.0 * u))))
        if li + 1 < len(hidden):
            Wn, bn = hidden[li + 1]
            hidden[li + 1] = (np.hstack([Wn, rng.standard_normal((Wn.shape[0], 1)) / np.sqrt(Wn.shape[1])]), bn)
        else:
            out = (np.hstack([out[0], rng.standard_normal((m, 1))]), out[1])
        f = _relu_net(hidden, out)
    elif fam == "near_parallel":  # unit 0 and a near copy, extracted with one unit fewer
        W, b = hidden[0]
        p = rng.standard_normal(d)
        p -= (p @ W[0]) * W[0]
        p /= max(np.linalg.norm(p), 1e-300)
        one_minus_cos = 10.0 ** (-7.0 + 3.0 * u)
        w = (1 - one_minus_cos) * W[0] + np.sqrt(1 - (1 - one_minus_cos) ** 2) * p
        gap = 10.0 ** rng.uniform(-4, -2)
        hidden[0] = (np.vstack([W, w]), np.append(b, b[0] + gap))
        weight = float(rng.choice([-0.003, 0.01, -0.5, 1.0]))
        nxt = out if len(hidden) == 1 else hidden[1]
        Wn, bn = nxt
        Wn = np.hstack([Wn, weight * Wn[:, :1]])
        if len(hidden) == 1:
            out = (Wn, bn)
        else:
            hidden[1] = (Wn, bn)
        f = _relu_net(hidden, out)
    elif fam == "wrong_widths":
        li = int(rng.integers(len(widths)))
        widths[li] += -1 if (u < 0.5 and widths[li] > 1) else 1
    elif fam == "changing_outputs":
        g, calls, after = f, [0], 1 + int(5 * u)

        def f(X):
            calls[0] += 1
            Y = g(X)
            return Y if calls[0] <= after else np.hstack([Y, Y[:, :1]])

        changed = lambda: calls[0] > after

    elif fam == "scaled":
        s = 10.0 ** (-6.0 + 12.0 * u)
        f = _relu_net(hidden, (out[0] * s, out[1] * s))
    elif fam == "int8":
        q = [(np.round(127 * W / np.abs(W).max()), np.round(127 * b / max(np.abs(b).max(), 1e-300))) for W, b in hidden]
        f = _relu_net(q, (np.round(127 * out[0] / np.abs(out[0]).max()), np.round(10 * out[1])))
    elif fam == "duplicated":
        W, b = hidden[0]
        hidden[0] = (np.vstack([W, W[:1]]), np.append(b, b[0]))
        widths[0] += 1
        nxt = out if len(hidden) == 1 else hidden[1]
        Wn = np.hstack([nxt[0], rng.standard_normal((nxt[0].shape[0], 1))])
        if len(hidden) == 1:
            out = (Wn, out[1])
        else:
            hidden[1] = (Wn, hidden[1][1])
        f = _relu_net(hidden, out)
    elif fam == "dead":
        W, b = hidden[0]
        b[int(rng.integers(len(b)))] = -(10.0 ** (1.0 + 3.0 * u))
        f = _relu_net(hidden, out)
    elif fam == "float32":
        f, prec = _relu_net(hidden, out, dtype=np.float32), "float32"
    return f, tuple(widths), prec, changed


def extract(f, case, widths, seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return relufast.extract(
            f, n_features=case["d"], n_hidden=widths, queries="chosen", max_queries=MAX_QUERIES, random_state=seed
        )


def fresh_errors(res, f, case):
    """Relative error of the result at each check scale (fresh Gaussian inputs)."""
    rng = np.random.default_rng(case["seed"] + 1)
    errs = []
    for s in CHECK_SCALES:
        X = s * rng.standard_normal((2000, case["d"]))
        Y = np.asarray(f(X), dtype=np.float64).reshape(len(X), -1)
        den = np.abs(Y).max()
        errs.append(float(np.abs(res.predict(X) - Y).max() / den) if den > 0 else float(np.abs(res.predict(X)).max()))
    return errs


def blames(message):
    """Whether a message says the model is outside the class with no in-class cause."""
    accuses = "outside the class" in message or "not a ReLU network" in message
    return accuses and not any(c in message for c in IN_CLASS_CAUSES)


def run_case(case):
    """Extract one case and check it. Returns a dict: status, err (largest fresh error of an
    exact result), problem, seconds, share (certificate queries over extraction queries),
    message, and rescued (in-class and not exact: whether random_state=1 is exact)."""
    f, widths, prec, changed = plant(case)
    out = {"err": None, "problem": None, "share": None, "rescued": None}
    t0 = time.perf_counter()
    try:
        res = extract(f, case, widths, 0)
    except ValueError as exc:  # a refusal with a clear message is allowed
        problem = None if str(exc) else "empty ValueError"
        if case["family"] != "changing_outputs":
            problem = f"ValueError on a fixed model: {exc}"
        return {
            **out,
            "status": "refused",
            "problem": problem,
            "seconds": time.perf_counter() - t0,
            "message": str(exc),
        }
    except Exception:  # noqa: BLE001 - anything else is a bug
        tb = traceback.format_exc(limit=4)
        return {**out, "status": "raised", "problem": tb, "seconds": time.perf_counter() - t0, "message": ""}
    out.update(status=res.status.value, seconds=time.perf_counter() - t0, message=res.message)
    dg = res.diagnostics
    if "certificate_queries" in dg:
        out["share"] = dg["certificate_queries"] / dg["extraction_queries"]
    if case["family"] == "changing_outputs" and res.exact:
        # exact is right only when the outputs changed after the last call
        out["problem"] = "exact although the model's outputs changed between calls" if changed() else None
    elif res.exact:
        errs = fresh_errors(res, f, case)
        out["err"] = max(errs)
        if not out["err"] <= ROUNDING[prec]:
            out["problem"] = (
                f"exact but the fresh error is {out['err']:.3g} > {ROUNDING[prec]:g} "
                f"(by scale {[f'{e:.2g}' for e in errs]})"
            )
    elif case["inside"]:
        try:
            out["rescued"] = bool(extract(f, case, widths, 1).exact)
        except Exception:  # noqa: BLE001 - reported by the first extraction's checks
            out["rescued"] = False
        if out["rescued"] and blames(res.message):
            out["problem"] = f"in class, exact with random_state=1, blamed with 0: {res.message}"
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float, default=None, help="stop starting new cases after this")
    ap.add_argument("--quick", action="store_true", help="60 cases, at most 4 minutes")
    ap.add_argument("--verbose", action="store_true", help="one line per case")
    args = ap.parse_args(argv)
    if args.quick:
        args.cases, args.minutes = 60, 4.0 if args.minutes is None else args.minutes
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    counts: dict = {}
    families: dict = {}
    problems, shares, rescued, blamed = [], [], [], 0
    for i in range(args.cases):
        if args.minutes is not None and time.perf_counter() - t0 > 60 * args.minutes:
            break
        case = draw_case(rng)
        r = run_case(case)
        side = "inside" if case["inside"] else "outside"
        for table, key in ((counts, side), (families, f"{side} {case['family']}")):
            table.setdefault(key, {}).setdefault(r["status"], 0)
            table[key][r["status"]] += 1
        if r["share"] is not None:
            shares.append(r["share"])
        if r["rescued"] is not None:
            rescued.append(r["rescued"])
        blamed += bool(case["inside"] and r["status"] != "exact" and blames(r["message"]))
        if args.verbose:
            e = "" if r["err"] is None else f" fresh {r['err']:.2g}"
            again = "" if r["rescued"] is None else f" (random_state=1: {'exact' if r['rescued'] else 'not exact'})"
            shape = f"d={case['d']} widths={case['widths']} m={case['m']}"
            print(f"case {i}: {side} {case['family']} {shape} -> {r['status']}{e}{again} ({r['seconds']:.2f} s)")
            if r["status"] != "exact":
                print(f"    {r['message'][:220]}", flush=True)
        if r["problem"]:
            problems.append((i, case, r["problem"]))
            print(f"case {i}: {r['problem']}\n  {case}", flush=True)
    ran = sum(sum(c.values()) for c in counts.values())
    for key in sorted(families):
        print(f"  {key:28s} {families[key]}")
    if shares:
        print(f"certificate queries / extraction queries: median {np.median(shares):.3f}, max {max(shares):.3f}")
    print(
        f"in class and not exact: {len(rescued)}, exact with random_state=1: {sum(rescued)}; "
        f"in-class results whose message blames the model: {blamed}"
    )
    print(f"{ran} cases in {time.perf_counter() - t0:.0f} s; statuses {counts}; {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
