"""MPI ranks simulated by threads of the test process (one definition for every test file).

``allgather`` is a real collective: each rank blocks at a barrier until every rank has
contributed, so iterative pipelines whose later messages depend on earlier ones, and work
splits where each rank computes something different, run as they would under mpiexec.
The real two-process runs are in ``tests/test_mpi.py``.
"""

import threading

#: Seconds a simulated rank may wait in a collective before the test fails (no deadlock).
BARRIER_TIMEOUT = 120


class World:
    """State shared by the ranks: one slot per rank, the barrier, a count of collectives."""

    def __init__(self, size):
        self.size = size
        self.slots = [None] * size
        self.barrier = threading.Barrier(size, timeout=BARRIER_TIMEOUT)
        self.calls = 0

    def rank(self, r):
        return ThreadComm(self, r)

    def ranks(self):
        return [ThreadComm(self, r) for r in range(self.size)]


class ThreadComm:
    """One rank's communicator (the mpi4py methods relufast uses)."""

    def __init__(self, world, rank):
        self.world, self.rank = world, rank

    @classmethod
    def world_of(cls, size):
        """The communicators of ``size`` ranks, in rank order."""
        return World(size).ranks()

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.world.size

    def allgather(self, value):
        w = self.world
        w.slots[self.rank] = value
        w.barrier.wait()
        out = list(w.slots)
        if self.rank == 0:
            w.calls += 1
        w.barrier.wait()  # nobody overwrites a slot before every rank has read it
        return out


def run_ranks(size, fn):
    """``fn(rank, comm)`` on ``size`` simulated ranks, one thread each; returns their results
    in rank order and the shared :class:`World` (or raises the first rank's error)."""
    world = World(size)
    out, errors = [None] * size, []

    def target(r):
        try:
            out[r] = fn(r, world.rank(r))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)
            world.barrier.abort()

    threads = [threading.Thread(target=target, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out, world
