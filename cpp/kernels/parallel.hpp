// Small threading helpers shared by the relufast kernels. No Python in here.
#pragma once

#include <algorithm>
#include <exception>
#include <thread>
#include <vector>

namespace relufast {

// Number of worker threads for `work_items` independent items: n_jobs <= 0
// means all hardware threads; never more threads than items, never fewer than 1.
inline int resolve_threads(int n_jobs, long long work_items) {
  unsigned hw = std::thread::hardware_concurrency();
  long long t = n_jobs > 0 ? n_jobs : static_cast<long long>(hw == 0 ? 1 : hw);
  t = std::min(t, work_items);
  return static_cast<int>(std::max<long long>(t, 1));
}

// Calls f(thread_index, begin, end) on `nthreads` contiguous ranges covering
// [0, n). Exceptions thrown by workers are captured and the first one (by
// thread index) is rethrown after all threads have joined.
template <class F>
void parallel_ranges(int nthreads, long long n, F&& f) {
  if (nthreads <= 1 || n <= 1) {
    f(0, 0LL, n);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(nthreads);
  pool.reserve(nthreads);
  for (int t = 0; t < nthreads; ++t) {
    long long begin = n * t / nthreads, end = n * (t + 1) / nthreads;
    pool.emplace_back([&f, &errors, t, begin, end]() {
      try {
        f(t, begin, end);
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// The mergeable-accumulator pattern shared by every moment kernel: samples
// [0, n) are cut into blocks of `block`; each thread owns one accumulator
// (make_local()) and a contiguous range of blocks (per_block(local, s0, len));
// the accumulators are then merged in thread order (merge(local)), so partial
// sums over chunks, threads, MPI ranks or dask blocks all reduce the same way.
template <class Local, class MakeLocal, class PerBlock, class Merge>
void accumulate_blocks(long long n, long long block, int n_jobs, MakeLocal make_local,
                       PerBlock per_block, Merge merge) {
  if (n <= 0) return;
  const long long nblocks = (n + block - 1) / block;
  const int nthreads = resolve_threads(n_jobs, nblocks);
  std::vector<Local> locals(nthreads);
  parallel_ranges(nthreads, nblocks, [&](int t, long long b0, long long b1) {
    locals[t] = make_local();
    for (long long b = b0; b < b1; ++b) {
      const long long s0 = b * block;
      per_block(locals[t], s0, std::min(block, n - s0));
    }
  });
  for (auto& L : locals) merge(L);
}

}  // namespace relufast
