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

}  // namespace relufast
