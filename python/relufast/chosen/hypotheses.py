"""Choices of the signs the wiggles left open (:mod:`.signs`) for the clustering of a deeper
layer's kinks (:func:`.deep.next_layer`): every choice is clustered, and the one whose
verified rows read the open units leads (:func:`chosen_choice`)."""

from __future__ import annotations

import numpy as np

from .verify import verified

__all__ = ["OPEN_SIGNS", "chosen_choice", "sign_choices"]


def sign_choices(settled):
    """Flips of the tentative layer to cluster under while its signs are open: every choice
    for the units the wiggles left open when they are OPEN_SIGNS or fewer (the others are
    oriented already), else none."""
    if settled is None or np.all(settled):
        return []
    open_units = np.nonzero(~np.asarray(settled, dtype=bool))[0]
    if len(open_units) > OPEN_SIGNS:
        return []
    out = []
    for bits in range(2 ** len(open_units)):
        flip = np.zeros(len(settled), dtype=bool)
        flip[open_units] = [(bits >> i) & 1 for i in range(len(open_units))]
        out.append(flip)
    return out


#: Most units left open by the wiggles for which every choice of signs is clustered (a
#: trained float32 784-64-64-10 left one of 63 open: its second layer was grouped with the
#: signs open, by null spaces that float32 normals at d = 784 do not resolve, and found none).
OPEN_SIGNS = 2


def chosen_choice(oracle, known, tent, hyps, parts, rng, carry, tol):
    """The rows clustered under the choice of open signs (``hyps[i]``, rows ``parts[i]``) that
    verifies HYPOTHESIS_LEAD times as many rows as any other, at least HYPOTHESIS_MIN; that
    choice is then the tentative layer's flips (``carry["delta"]``). Returns (those rows,
    which of them verified); none while no choice leads.

    Only a row that reads an open unit (its weight there at least HYPOTHESIS_WEIGHT of its
    weights on the tentative layer) is evidence: the rows clustered under a wrong choice
    give the open unit no weight (rounding only) and verify all the same, since their
    boundaries do not depend on it (the float32 64-32-32-10 with one sign left open in
    tests/test_chosen_float32.py: its first round gave three verified rows under the wrong
    choice and none under the right one, and under OpenBLAS's SkylakeX kernels the wrong
    one was taken; over four draws, both kernels, the open unit's weight in the rows of the
    wrong choice was 2e-7 to 1e-5 of their norm, in those of the right one 0.01 to 0.29)."""
    hold = [verified(oracle, known, tent, R, rng, carry, tol) if len(R) else np.zeros(0, dtype=bool) for R in parts]
    kt = tent[0].shape[0]
    open_units = np.any([h != hyps[0] for h in hyps], axis=0)
    good = []
    for R, h in zip(parts, hold):
        C = R[:, :kt]
        reads = np.abs(C[:, open_units]).max(axis=1, initial=0.0) >= HYPOTHESIS_WEIGHT * np.linalg.norm(C, axis=1)
        good.append(int((h & reads).sum()))
    order = np.argsort(good)[::-1]
    best, second = good[order[0]], (good[order[1]] if len(good) > 1 else 0)
    if best >= HYPOTHESIS_MIN and best >= HYPOTHESIS_LEAD * second:
        carry["delta"] = hyps[order[0]]
        return parts[order[0]], hold[order[0]]
    return np.zeros((0, parts[0].shape[1])), np.zeros(0, dtype=bool)


#: Verified rows reading an open unit that a choice of open signs needs, and its lead over
#: every other choice.
HYPOTHESIS_MIN, HYPOTHESIS_LEAD = 3, 2

#: Least weight on an open unit, relative to a row's weights on the tentative layer, for the
#: row to count as evidence for a choice of signs (see chosen_choice).
HYPOTHESIS_WEIGHT = 1e-3
