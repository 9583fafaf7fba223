from ._core import *  # noqa: F401,F403  (same API, AVX-512 build)
