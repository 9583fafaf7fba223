from ._core import *  # noqa: F401,F403  (same API, AVX2/FMA build)
