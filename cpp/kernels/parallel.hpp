// Threading, cancellation and ordered reduction shared by the relufast kernels.
// No Python in here: the bindings install a Cancellation whose poll function
// checks for signals; the kernels only see an atomic flag and a deadline.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace relufast {

// Raised inside a kernel when its Cancellation's poll function asked it to stop.
struct Cancelled : std::exception {
  const char* what() const noexcept override { return "relufast kernel interrupted"; }
};
// Raised inside a kernel when its Cancellation's deadline has passed.
struct TimeLimitReached : std::exception {
  const char* what() const noexcept override { return "relufast kernel stopped by its time limit"; }
};

// Cancellation of one kernel call. `poll` runs only on the thread that owns the
// call (the one that installed it with ScopedCancellation), at most every
// `interval`; it returns true to stop. Worker threads see the outcome through
// `state` (0 running, 1 cancelled, 2 time limit), checked between work items.
struct Cancellation {
  using Clock = std::chrono::steady_clock;
  std::function<bool()> poll;
  std::chrono::milliseconds interval{50};
  bool has_deadline = false;
  Clock::time_point deadline{};
  std::thread::id owner = std::this_thread::get_id();
  std::atomic<int> state{0};
  Clock::time_point next_poll = Clock::now();  // touched by the owner only

  void set_time_limit(double seconds) {
    has_deadline = true;
    deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(seconds));
  }

  // True when the call must stop; polls (owner thread) and checks the deadline.
  bool should_stop() {
    if (state.load(std::memory_order_relaxed)) return true;
    if (!has_deadline && !poll) return false;
    const auto now = Clock::now();
    if (has_deadline && now >= deadline) {
      int expected = 0;
      state.compare_exchange_strong(expected, 2);
      return true;
    }
    if (poll && now >= next_poll && std::this_thread::get_id() == owner) {
      next_poll = now + interval;
      if (poll()) {
        int expected = 0;
        state.compare_exchange_strong(expected, 1);
        return true;
      }
    }
    return false;
  }

  [[noreturn]] void raise() const {
    if (state.load() == 2) throw TimeLimitReached();
    throw Cancelled();
  }
};

// The Cancellation of the kernel call running on this thread (nullptr: none).
inline Cancellation*& current_cancellation() {
  static thread_local Cancellation* current = nullptr;
  return current;
}

class ScopedCancellation {
 public:
  explicit ScopedCancellation(Cancellation* c) : saved_(current_cancellation()) {
    current_cancellation() = c;
  }
  ~ScopedCancellation() { current_cancellation() = saved_; }
  ScopedCancellation(const ScopedCancellation&) = delete;
  ScopedCancellation& operator=(const ScopedCancellation&) = delete;

 private:
  Cancellation* saved_;
};

// For long loops inside one work item: throws Cancelled or TimeLimitReached
// when the current call must stop.
inline void checkpoint() {
  Cancellation* c = current_cancellation();
  if (c && c->should_stop()) c->raise();
}

inline int hardware_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(std::min<unsigned>(hw, INT_MAX));
}

// Number of worker threads for `work_items` independent items: n_jobs <= 0
// means all hardware threads, and more than the hardware threads is never
// useful; never more threads than items, never fewer than 1.
inline int resolve_threads(int n_jobs, long long work_items) {
  const long long hw = hardware_threads();
  long long t = n_jobs > 0 ? std::min<long long>(n_jobs, hw) : hw;
  t = std::min(t, work_items);
  return static_cast<int>(std::max<long long>(t, 1));
}

// Samples per block, clamped to [1, n] so that a huge block cannot overflow
// the block count or size a huge workspace.
inline long long clamp_block(long long n, long long block) {
  return std::max(1LL, std::min(block, std::max(n, 1LL)));
}

// Calls f(i) for every i in [0, n_items), on up to n_jobs threads that take
// items in increasing order. The calling thread works too, so the call
// completes even when no thread can be created (std::system_error from
// std::thread: the work goes to the threads that did start). Between items the
// current Cancellation is consulted; when it asks to stop, no new item starts
// and Cancelled / TimeLimitReached is thrown after the join. An exception from
// f stops the call too; the one from the lowest item is rethrown.
// f must write its results by item index: then they do not depend on n_jobs.
template <class F>
void parallel_for(long long n_items, int n_jobs, F&& f) {
  if (n_items <= 0) return;
  Cancellation* cancel = current_cancellation();
  const int want = resolve_threads(n_jobs, n_items);
  std::atomic<long long> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::condition_variable cv;
  long long error_item = LLONG_MAX;
  std::exception_ptr error;
  int running = 0;

  auto stop = [&]() { return failed.load(std::memory_order_relaxed) || (cancel && cancel->should_stop()); };
  auto work = [&]() {
    ScopedCancellation scope(cancel);
    while (!stop()) {
      const long long i = next.fetch_add(1);
      if (i >= n_items) return;
      try {
        f(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        if (i < error_item) {
          error_item = i;
          error = std::current_exception();
        }
        failed = true;
      }
    }
  };

  std::vector<std::thread> pool;
  pool.reserve(want - 1);
  for (int t = 1; t < want; ++t) {
    try {
      {
        std::lock_guard<std::mutex> lk(mu);
        ++running;
      }
      pool.emplace_back([&]() {
        work();
        std::lock_guard<std::mutex> lk(mu);
        --running;
        cv.notify_all();
      });
    } catch (const std::system_error&) {
      std::lock_guard<std::mutex> lk(mu);
      --running;
      break;  // fewer threads than asked; the calling thread runs what is left
    }
  }
  work();
  {
    // Wait for the workers; the owner keeps polling so a signal still stops them.
    // Every wait is bounded: the loop re-checks its condition at least every
    // polling interval, so a lost notification can delay it but never hang it.
    std::unique_lock<std::mutex> lk(mu);
    const auto interval = cancel ? cancel->interval : std::chrono::milliseconds(50);
    while (running > 0) {
      cv.wait_for(lk, interval);
      if (running > 0 && cancel) {
        lk.unlock();
        cancel->should_stop();
        lk.lock();
      }
    }
  }
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
  if (cancel && cancel->state.load() && next.load() < n_items) cancel->raise();
}

// The mergeable-accumulator pattern of every moment kernel, reduced in a fixed
// order. Samples [0, n) are cut into blocks of `block`, and consecutive blocks
// into groups whose size depends only on n and block. A group is accumulated
// into a zeroed partial (zero(L), then per_block(L, s0, len) for its blocks in
// order), and the partials are added into the result strictly in group order
// (merge(L), under a lock, by whichever thread completes the next group). The
// floating-point sum is thus ((g0 + g1) + g2) + ... whatever the thread count:
// results do not depend on n_jobs. Partials are recycled from a small pool, so
// memory is (threads + 1) partials, not O(groups).
template <class Local, class MakeLocal, class Zero, class PerBlock, class Merge>
void accumulate_blocks(long long n, long long block, int n_jobs, MakeLocal make_local, Zero zero,
                       PerBlock per_block, Merge merge) {
  if (n <= 0) return;
  block = clamp_block(n, block);
  const long long nblocks = n / block + (n % block != 0);
  // About 64 groups when there are enough blocks, at most 8 blocks per group:
  // merging a partial costs about one block's worth of memory traffic, so this
  // keeps the merges below ~1% of the work while leaving groups to balance.
  const long long per_group = std::max(1LL, std::min(8LL, nblocks / 64));
  const long long ngroups = nblocks / per_group + (nblocks % per_group != 0);
  const int nthreads = resolve_threads(n_jobs, ngroups);
  // One partial in progress per thread plus one parked ahead of its turn.
  const size_t cap = static_cast<size_t>(nthreads + 1);

  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Local>> free_list;
  std::map<long long, std::unique_ptr<Local>> done;
  size_t allocated = 0;
  long long next_commit = 0;
  bool aborted = false;
  // Any failure in any step (make_local, zero, per_block, merge, a stop request
  // seen while waiting) marks the call aborted under the lock and wakes every
  // waiter before the exception leaves the work item; parallel_for then
  // rethrows it after the join.
  auto abort_locked = [&]() {
    aborted = true;
    cv.notify_all();
  };

  parallel_for(ngroups, nthreads, [&](long long g) {
    std::unique_ptr<Local> L;
    {
      // The thread holding the next group to commit may always allocate: the
      // chain of commits can then never wait on a buffer. The wait is bounded
      // and sees stop requests, so it has a way out even if a wake-up is lost.
      std::unique_lock<std::mutex> lk(mu);
      auto ready = [&] { return aborted || !free_list.empty() || allocated < cap || g == next_commit; };
      while (!ready()) {
        cv.wait_for(lk, std::chrono::milliseconds(20));
        if (ready()) break;
        Cancellation* c = current_cancellation();
        if (c && c->should_stop()) {
          abort_locked();
          c->raise();
        }
      }
      if (aborted) return;
      if (!free_list.empty()) {
        L = std::move(free_list.back());
        free_list.pop_back();
      } else {
        ++allocated;
      }
    }
    try {
      if (!L) L.reset(new Local(make_local()));
      zero(*L);
      const long long b0 = g * per_group, b1 = std::min(nblocks, b0 + per_group);
      for (long long b = b0; b < b1; ++b) {
        if (b > b0) checkpoint();  // a stop request is seen between blocks, not only between groups
        const long long s0 = b * block;
        per_block(*L, s0, std::min(block, n - s0));
      }
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      abort_locked();
      throw;
    }
    std::lock_guard<std::mutex> lk(mu);
    if (aborted) return;
    done.emplace(g, std::move(L));
    try {
      while (!done.empty() && done.begin()->first == next_commit) {
        merge(*done.begin()->second);
        free_list.push_back(std::move(done.begin()->second));
        done.erase(done.begin());
        ++next_commit;
      }
    } catch (...) {
      abort_locked();
      throw;
    }
    cv.notify_all();
  });
}

}  // namespace relufast
