import numpy as np
import pytest

import relufast as rf

#: Exact recovery: relative errors of U and V at this level are machine precision plus
#: the conditioning of the least-squares fit (1e-10 or better).
EXACT_TOL = 1e-10


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def planted(d, k, m, seed, **kw):
    return rf.planted.two_layer(d=d, k=k, m=m, random_state=seed, **kw)
