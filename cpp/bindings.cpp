// The one pybind11 translation unit: builds relufast._core (and, on x86-64,
// the same code compiled for AVX2/FMA as relufast._core_avx2).
#include <pybind11/eigen.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

#include "kernels/certify.hpp"
#include "kernels/contracted4.hpp"
#include "kernels/cp.hpp"
#include "kernels/detector.hpp"
#include "kernels/hermite.hpp"
#include "kernels/lattice.hpp"
#include "kernels/moments.hpp"
#include "kernels/parallel.hpp"
#include "kernels/refine.hpp"
#include "kernels/region.hpp"
#include "kernels/sign_patterns.hpp"

namespace py = pybind11;
using namespace relufast;

#ifndef RELUFAST_MODULE_NAME
#define RELUFAST_MODULE_NAME _core
#endif

namespace {

// Runs f() with the GIL released, interruptible: a Cancellation installed on
// this thread re-acquires the GIL every 50 ms (between the kernel's work
// items) and calls PyErr_CheckSignals, so Ctrl-C stops the kernel within a
// block instead of after it; the KeyboardInterrupt (or whatever the handler
// raised) is re-raised here. time_limit > 0 adds a deadline: TimeoutError.
// The deadline of the method run on this thread (relufast._deadline.limit sets it through
// _set_deadline): every kernel started on the thread stops once it passes, with the same
// TimeoutError as an explicit time_limit. Thread-local, so threads that each run a method
// (simulated MPI ranks) keep their own.
thread_local bool t_has_deadline = false;
thread_local std::chrono::steady_clock::time_point t_deadline;

double seconds_left_of_deadline() {
  if (!t_has_deadline) return 0.0;
  double left = std::chrono::duration<double>(t_deadline - std::chrono::steady_clock::now()).count();
  return left > 1e-9 ? left : 1e-9;  // passed: stop at the first check
}

template <class F>
auto interruptible(F&& f, double time_limit = 0.0) -> decltype(f()) {
  Cancellation cancel;
  if (double left = seconds_left_of_deadline(); left > 0.0)
    time_limit = time_limit > 0.0 ? std::min(time_limit, left) : left;
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  cancel.poll = [&]() {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return false;
    PyErr_Fetch(&type, &value, &trace);
    return true;
  };
  if (time_limit > 0.0) cancel.set_time_limit(time_limit);
  bool timed_out = false, cancelled = false;
  std::optional<decltype(f())> result;
  {
    py::gil_scoped_release release;
    ScopedCancellation scope(&cancel);
    try {
      result.emplace(f());
    } catch (const TimeLimitReached&) {
      timed_out = true;
    } catch (const Cancelled&) {
      cancelled = true;
    }
  }
  if (type) {  // a signal handler raised: that exception wins, even if the kernel finished
    PyErr_Restore(type, value, trace);
    throw py::error_already_set();
  }
  if (timed_out) {
    PyErr_SetString(PyExc_TimeoutError, "relufast kernel stopped by its time limit");
    throw py::error_already_set();
  }
  if (cancelled) throw std::runtime_error("relufast kernel cancelled");
  return std::move(*result);
}

bool cpu_has_avx2_fma() {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool compiled_with_avx512() {
#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512VL__) && defined(__AVX512BW__)
  return true;
#else
  return false;
#endif
}

bool compiled_with_avx2() {
#if defined(__AVX2__) && defined(__FMA__)
  return true;
#else
  return false;
#endif
}

py::dict refine_rows_py(const ConstRowRef& B, const ConstRowRef& X, const ConstRowRef& Vhat,
                        std::vector<double> margins, double tol_null, double tol_gap,
                        double tol_verify, double tol_support, Index min_zeros, int n_jobs,
                        double power, bool approximate) {
  RefineOptions opts;
  opts.approximate = approximate;
  if (!margins.empty()) opts.margins = std::move(margins);
  opts.tol_null = tol_null;
  opts.tol_gap = tol_gap;
  opts.tol_verify = tol_verify;
  opts.tol_support = tol_support;
  opts.min_zeros = min_zeros;
  opts.power = power;
  std::vector<RowCertificate> res = interruptible([&] { return refine_rows(B, X, Vhat, opts, n_jobs); });
  const Index c = static_cast<Index>(res.size()), d = X.cols();
  RowMatrixXd rows = RowMatrixXd::Constant(c, d, std::numeric_limits<double>::quiet_NaN());
  Eigen::Matrix<bool, Eigen::Dynamic, 1> certified(c), solved(c);
  Eigen::VectorXi sign(c);
  Eigen::VectorXd margin(c), null_ratio(c), gap_ratio(c), other_ratio(c), verify(c);
  Eigen::Matrix<Index, Eigen::Dynamic, 1> n_zero(c), support(c);
  for (Index i = 0; i < c; ++i) {
    const RowCertificate& r = res[i];
    if (r.solved) rows.row(i) = r.row.transpose();
    certified(i) = r.certified;
    solved(i) = r.solved;
    sign(i) = r.sign;
    margin(i) = r.margin;
    null_ratio(i) = r.null_ratio;
    gap_ratio(i) = r.gap_ratio;
    other_ratio(i) = r.other_ratio;
    verify(i) = r.verify_residual;
    n_zero(i) = r.n_zero;
    support(i) = r.support;
  }
  py::dict out;
  out["rows"] = rows;
  out["certified"] = certified;
  out["solved"] = solved;
  out["sign"] = sign;
  out["margin"] = margin;
  out["null_ratio"] = null_ratio;
  out["gap_ratio"] = gap_ratio;
  out["other_ratio"] = other_ratio;
  out["verify_residual"] = verify;
  out["n_zero"] = n_zero;
  out["support"] = support;
  return out;
}

PatternMode parse_mode(const std::string& mode) {
  if (mode == "rays") return PatternMode::Rays;
  if (mode == "vertices") return PatternMode::Vertices;
  throw std::invalid_argument("mode must be 'vertices' or 'rays'; got '" + mode + "'");
}

py::dict pattern_batch_to_dict(const PatternBatch& b) {
  const Index count = b.n_words ? static_cast<Index>(b.words.size()) / b.n_words : 0;
  Eigen::Matrix<std::uint64_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> words(count, b.n_words);
  if (count) std::copy(b.words.begin(), b.words.end(), words.data());
  py::dict out;
  out["words"] = words;
  out["coeffs"] = b.coeffs;
  out["systems"] = b.systems;
  return out;
}

// Test hook for the block pipeline of accumulate_blocks: sums 0 + 1 + ... + (n - 1)
// with a fault injected into one step. `stage` is "none", "make_local", "zero",
// "per_block" or "merge"; the fault is a std::runtime_error raised by the `at`-th
// call of that step (0-based, counted over all threads) and by every later call,
// as a persistent condition would (the region kernel's "more than max_regions").
// `sleep_us` slows each block that starts below sample `slow_until`, so that the
// threads holding later groups run ahead and wait for buffers. Used by the stress
// tests of the pipeline.
double fault_pipeline(long long n, long long block, int n_jobs, const std::string& stage, long long at,
                      long long sleep_us, long long slow_until) {
  static const char* stages[] = {"none", "make_local", "zero", "per_block", "merge"};
  int which = -1;
  for (int i = 0; i < 5; ++i)
    if (stage == stages[i]) which = i;
  if (which < 0) throw std::invalid_argument("stage must be none, make_local, zero, per_block or merge; got " + stage);
  std::atomic<long long> calls[5];
  for (auto& c : calls) c = 0;
  auto maybe_throw = [&](int step) {
    if (step == which && calls[step].fetch_add(1) >= at)
      throw std::runtime_error(std::string("injected fault in ") + stages[step] + " (call " + std::to_string(at) + ")");
  };
  double total = 0.0;
  accumulate_blocks<double>(
      n, block, n_jobs,
      [&]() {
        maybe_throw(1);
        return 0.0;
      },
      [&](double& L) {
        maybe_throw(2);
        L = 0.0;
      },
      [&](double& L, long long s0, long long len) {
        maybe_throw(3);
        if (sleep_us > 0 && s0 < slow_until) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
        for (long long s = s0; s < s0 + len; ++s) L += static_cast<double>(s);
      },
      [&](const double& L) {
        maybe_throw(4);
        total += L;
      });
  return total;
}

}  // namespace

PYBIND11_MODULE(RELUFAST_MODULE_NAME, m) {
  m.def(
      "_set_deadline",
      [](double seconds) {
        t_has_deadline = std::isfinite(seconds) && seconds > 0.0;
        if (t_has_deadline)
          t_deadline = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(seconds));
      },
      py::arg("seconds"),
      "Kernels started on this thread stop (TimeoutError) once `seconds` from now have passed; "
      "0, a negative or a non-finite value clears the deadline. Used by relufast._deadline.");
  m.doc() = "relufast compiled kernels (private; use the relufast package)";
  m.def("hardware_threads", &hardware_threads, "Threads the kernels use at most (hardware threads).");
  m.def("cpu_has_avx2_fma", &cpu_has_avx2_fma, "Whether this CPU supports AVX2 and FMA.");
  m.def("compiled_with_avx2", &compiled_with_avx2, "Whether this module was compiled for AVX2/FMA.");
  m.def("cpu_has_avx512", &cpu_has_avx512, "Whether this CPU supports AVX-512 F, DQ, VL and BW (and AVX2/FMA).");
  m.def("compiled_with_avx512", &compiled_with_avx512, "Whether this module was compiled for AVX-512.");
  m.def(
      "_fault_pipeline",
      [](long long n, long long block, int n_jobs, const std::string& stage, long long at, long long sleep_us,
         long long slow_until, double time_limit) {
        return interruptible([&] { return fault_pipeline(n, block, n_jobs, stage, at, sleep_us, slow_until); },
                             time_limit);
      },
      py::arg("n"), py::arg("block"), py::arg("n_jobs"), py::arg("stage") = "none", py::arg("at") = 0,
      py::arg("sleep_us") = 0, py::arg("slow_until") = std::numeric_limits<long long>::max(),
      py::arg("time_limit") = 0.0,
      "Test hook: the block pipeline summing 0..n-1, with a fault raised by the at-th call of one step.");

  py::class_<SecondMoment>(m, "SecondMoment", py::module_local(),
                           "Mergeable accumulator of sum_s y_s (x) x_s x_s^T (BJW19 Sec. 4.2).")
      .def(py::init<Index, Index>(), py::arg("d"), py::arg("m"))
      .def(
          "update",
          [](SecondMoment& s, const ConstRowRef& X, const ConstRowRef& Y, int n_jobs, Index block,
             std::optional<RowMatrixXd> Q, std::optional<py::capsule> dgemm) {
            const long long big = std::numeric_limits<int>::max();
            if (dgemm && (X.outerStride() > big || block > big || static_cast<long long>(s.m()) * s.d() > big))
              throw py::value_error("SecondMoment.update: dimensions beyond a 32-bit BLAS; got X of " +
                                    std::to_string(X.rows()) + " x " + std::to_string(X.cols()) + ", m = " +
                                    std::to_string(s.m()));
            DgemmFn fn = dgemm ? reinterpret_cast<DgemmFn>(dgemm->get_pointer()) : nullptr;
            interruptible([&] {
              s.update(X, Y, n_jobs, block, Q ? &*Q : nullptr, fn);
              return true;
            });
          },
          py::arg("X").noconvert(), py::arg("Y").noconvert(), py::arg("n_jobs") = 0,
          py::arg("block") = 256, py::arg("Q") = py::none(), py::arg("dgemm") = py::none(),
          "Add samples X (n, d) with outputs Y (n, m), or Y @ Q when Q (p, m) is given. dgemm: the capsule of a "
          "Fortran dgemm safe to call from several threads (SciPy's, the BLAS held at one thread) for the "
          "blocks' products, or None for Eigen's.")
      .def("merge", &SecondMoment::merge, py::arg("other"))
      .def("tensor", &SecondMoment::tensor)
      .def("set_state", &SecondMoment::set_state, py::arg("count"), py::arg("sum_y"), py::arg("sum_yxx"))
      .def("state",
           [](const SecondMoment& s) {
             double count;
             Eigen::VectorXd sum_y;
             Eigen::MatrixXd sum_yxx;
             s.snapshot(count, sum_y, sum_yxx);  // one consistent copy under the lock
             py::dict st;
             st["count"] = count;
             st["sum_y"] = sum_y;
             st["sum_yxx"] = sum_yxx;
             return st;
           },
           "The raw sums: count, sum_y (m,), sum_yxx (d, m*d).")
      .def_property_readonly("d", &SecondMoment::d)
      .def_property_readonly("m", &SecondMoment::m)
      .def_property_readonly("count", &SecondMoment::count)
      .def_property_readonly("sum_y", [](const SecondMoment& s) { return Eigen::VectorXd(s.sum_y()); })
      .def_property_readonly("sum_yxx", [](const SecondMoment& s) { return Eigen::MatrixXd(s.sum_yxx()); });

  py::class_<DetectorMoment>(m, "DetectorMoment", py::module_local(),
                             "GKLW19 pure-neuron detector matrix, covariance form (mergeable).")
      .def(py::init<const RowMatrixXd&>(), py::arg("M"))
      .def(
          "update",
          [](DetectorMoment& s, const ConstRowRef& X, const ConstRowRef& Y, int n_jobs, Index block) {
            interruptible([&] {
              s.update(X, Y, n_jobs, block);
              return true;
            });
          },
          py::arg("X").noconvert(), py::arg("Y").noconvert(), py::arg("n_jobs") = 0, py::arg("block") = 256)
      .def("merge", &DetectorMoment::merge, py::arg("other"))
      .def("matrix", &DetectorMoment::matrix, py::arg("centred") = true)
      .def("set_state", &DetectorMoment::set_state, py::arg("count"), py::arg("sum_phipsi"),
           py::arg("sum_phi"), py::arg("sum_psi"))
      .def("state",
           [](const DetectorMoment& s) {
             double count;
             Eigen::MatrixXd sum_phipsi;
             Eigen::VectorXd sum_phi, sum_psi;
             s.snapshot(count, sum_phipsi, sum_phi, sum_psi);  // one consistent copy under the lock
             py::dict st;
             st["count"] = count;
             st["sum_phipsi"] = sum_phipsi;
             st["sum_phi"] = sum_phi;
             st["sum_psi"] = sum_psi;
             return st;
           },
           "The raw sums: count, sum_phipsi (D1, D2), sum_phi (D1,), sum_psi (D2,).")
      .def_property_readonly("count", &DetectorMoment::count)
      .def_property_readonly("d", &DetectorMoment::d)
      .def_property_readonly("k", &DetectorMoment::k);

  // ---- The network pass: certify and relu_stats share one kernel ----
  auto stats_dict = [](const NetworkStats& s, bool with_nonfinite) {
    py::dict out;
    out["count"] = s.count;
    out["gram"] = s.gram;
    out["cross"] = s.cross;
    out["sq_residual"] = s.sq_residual;
    out["sq_norm"] = s.sq_norm;
    if (with_nonfinite) out["nonfinite"] = s.nonfinite;
    return out;
  };
  m.def(
      "certify",
      [stats_dict](const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                   std::optional<RowMatrixXd> U, int n_jobs, Index block, double power, bool normal_equations,
                   std::optional<Eigen::VectorXd> b, bool intercept) {
        PassOptions opt;
        opt.power = power;
        opt.normal_equations = normal_equations;
        opt.count_nonfinite = true;
        opt.b = b ? &*b : nullptr;
        opt.intercept = intercept;
        NetworkStats s =
            interruptible([&] { return network_pass(X, Y, V, U ? &*U : nullptr, n_jobs, block, opt, "certify"); });
        return stats_dict(s, true);
      },
      py::arg("X").noconvert(), py::arg("Y").noconvert(), py::arg("V"), py::arg("U") = py::none(),
      py::arg("n_jobs") = 0, py::arg("block") = 4096, py::arg("power") = 1.0,
      py::arg("normal_equations") = true, py::arg("b") = py::none(), py::arg("intercept") = false,
      "One pass: F = relu(X V^T + b)^power (and a constant column with intercept); F^T F, F^T Y "
      "(skipped when U is given and normal_equations is false), non-finite entries of X and Y and, "
      "given U, ||Y - F U^T||_F^2 and ||Y||_F^2.");
  m.def(
      "count_nonfinite",
      [](const ConstRowRef& A, int n_jobs, Index block) {
        return interruptible([&] { return count_nonfinite(A, n_jobs, block); });
      },
      py::arg("A").noconvert(), py::arg("n_jobs") = 0, py::arg("block") = 8192,
      "Number of NaN or infinite entries of A (row blocks, threads).");

  m.def(
      "relu_stats",
      [stats_dict](const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                   std::optional<RowMatrixXd> U, int n_jobs, Index block, double power,
                   std::optional<Eigen::VectorXd> b, bool intercept) {
        ReluStats s = interruptible([&] {
          return relu_stats(X, Y, V, U ? &*U : nullptr, n_jobs, block, power, b ? &*b : nullptr, intercept);
        });
        return stats_dict(s, false);
      },
      py::arg("X").noconvert(), py::arg("Y").noconvert(), py::arg("V"), py::arg("U") = py::none(),
      py::arg("n_jobs") = 0, py::arg("block") = 4096, py::arg("power") = 1.0, py::arg("b") = py::none(),
      py::arg("intercept") = false,
      "The pass of certify without the finiteness count: F = relu(X V^T + b)^power (and a constant "
      "column with intercept); F^T F, F^T Y and, given U, ||Y - F U^T||_F^2 and ||Y||_F^2.");

  m.def(
      "pattern_subset_count",
      [](Index n, Index k, const std::string& mode) {
        return pattern_subset_count(n, k, parse_mode(mode));
      },
      py::arg("n"), py::arg("k"), py::arg("mode"), "Subsets visited: C(n, k) (vertices) or C(n, k-1) (rays).");

  m.def(
      "enumerate_patterns",
      [](const ConstRowRef& B, const std::string& mode, long long begin, long long end, double tol,
         int n_jobs, double time_limit) {
        const PatternMode pm = parse_mode(mode);
        PatternBatch b =
            interruptible([&] { return enumerate_patterns(B, pm, begin, end, tol, n_jobs); }, time_limit);
        return pattern_batch_to_dict(b);
      },
      py::arg("B").noconvert(), py::arg("mode"), py::arg("begin"), py::arg("end"),
      py::arg("tol") = 1e-9, py::arg("n_jobs") = 0, py::arg("time_limit") = 0.0,
      "BJW19 Lemma 1 (vertices) or extreme rays: positive sets of vectors in the row span of B.\n"
      "time_limit > 0: raise TimeoutError once that many seconds have passed.");

  m.def(
      "enumerate_patterns_for",
      [](const ConstRowRef& B, const std::string& mode, const IndexMatrix& subsets, double tol,
         int n_jobs, double time_limit) {
        const PatternMode pm = parse_mode(mode);
        PatternBatch b =
            interruptible([&] { return enumerate_patterns_for(B, pm, subsets, tol, n_jobs); }, time_limit);
        return pattern_batch_to_dict(b);
      },
      py::arg("B").noconvert(), py::arg("mode"), py::arg("subsets"), py::arg("tol") = 1e-9,
      py::arg("n_jobs") = 0, py::arg("time_limit") = 0.0, "The systems of enumerate_patterns on explicit subsets (rows of subsets).");

  m.def("refine_rows", &refine_rows_py, py::arg("B").noconvert(), py::arg("X").noconvert(),
        py::arg("Vhat"), py::arg("margins") = std::vector<double>{}, py::arg("tol_null") = 1e-10,
        py::arg("tol_gap") = 1e-6, py::arg("tol_verify") = 1e-9, py::arg("tol_support") = 1e-9,
        py::arg("min_zeros") = 0, py::arg("n_jobs") = 0, py::arg("power") = 1.0,
        py::arg("approximate") = true,
        "BJW19 Alg. 5 (margin form): certify and solve hidden rows from approximate directions.");

  // ---- GP19 (Goel and Panigrahy 2019), Step 1: contractions of the fourth-order
  // Hermite statistic with directions, with active-row filtering (kernels/contracted4).
  py::class_<Hermite4Contraction>(m, "Hermite4Contraction", py::module_local(),
                                  "GP19 Sec. 2.1: mergeable sums sum ft y^p, sum ft y^p x (p = 1, 3) "
                                  "for y = Z x, ft = f - offset, over active rows.")
      .def(py::init<const RowMatrixXd&, double, double, bool, bool>(), py::arg("Z"), py::arg("offset"),
           py::arg("active_tol") = 0.0, py::arg("second") = false, py::arg("pairs") = false)
      .def("update", &Hermite4Contraction::update, py::arg("X").noconvert(), py::arg("f").noconvert(),
           py::arg("n_jobs") = 0, py::arg("block") = 1024, py::call_guard<py::gil_scoped_release>())
      .def("merge", &Hermite4Contraction::merge, py::arg("other"))
      .def("set_state", &Hermite4Contraction::set_state, py::arg("count"), py::arg("n_active"), py::arg("s0"),
           py::arg("S"), py::arg("G1"), py::arg("G3"), py::arg("M"), py::arg("S11"), py::arg("S22"), py::arg("GP"))
      .def("state",
           [](const Hermite4Contraction& h) {
             py::dict st;
             st["count"] = h.count();
             st["n_active"] = h.n_active();
             st["s0"] = h.s0();
             st["S"] = RowMatrixXd(h.S());
             st["G1"] = RowMatrixXd(h.G1());
             st["G3"] = RowMatrixXd(h.G3());
             st["M"] = RowMatrixXd(h.M());
             st["S11"] = RowMatrixXd(h.S11());
             st["S22"] = RowMatrixXd(h.S22());
             st["GP"] = RowMatrixXd(h.GP());
             return st;
           },
           "The raw sums: count, n_active, s0, S (R, 4), G1, G3 (R, n), M (n, n), S11, S22 (R, R), GP (R, n).")
      .def_property_readonly("n", &Hermite4Contraction::n)
      .def_property_readonly("r", &Hermite4Contraction::r)
      .def_property_readonly("count", &Hermite4Contraction::count)
      .def_property_readonly("n_active", &Hermite4Contraction::n_active)
      .def_property_readonly("s0", &Hermite4Contraction::s0)
      .def_property_readonly("S", [](const Hermite4Contraction& h) { return RowMatrixXd(h.S()); })
      .def_property_readonly("G1", [](const Hermite4Contraction& h) { return RowMatrixXd(h.G1()); })
      .def_property_readonly("G3", [](const Hermite4Contraction& h) { return RowMatrixXd(h.G3()); })
      .def_property_readonly("M", [](const Hermite4Contraction& h) { return RowMatrixXd(h.M()); })
      .def_property_readonly("S11", [](const Hermite4Contraction& h) { return RowMatrixXd(h.S11()); })
      .def_property_readonly("S22", [](const Hermite4Contraction& h) { return RowMatrixXd(h.S22()); })
      .def_property_readonly("GP", [](const Hermite4Contraction& h) { return RowMatrixXd(h.GP()); });
  // ---- end GP19
  // ---- ATV21 (Awasthi, Tang, Vijayaraghavan, NeurIPS 2021): projected Hermite sums of
  // order 0..4, and relufast's activation-region refinement for biased networks. ----
  py::class_<HermiteSums>(m, "HermiteSums", py::module_local(),
                          "Mergeable raw sums sum_s y_si z_s^(x r), r <= order, z = P^T x (ATV21 Alg. 4).")
      .def(py::init<Index, Index, int>(), py::arg("k"), py::arg("m"), py::arg("order"))
      .def(
          "update",
          [](HermiteSums& h, const ConstRowRef& X, const ConstRowRef& Y, std::optional<RowMatrixXd> P,
             int n_jobs, Index block) {
            interruptible([&] {
              h.update(X, Y, P ? &*P : nullptr, n_jobs, block);
              return true;
            });
          },
          py::arg("X").noconvert(), py::arg("Y").noconvert(), py::arg("P") = py::none(),
          py::arg("n_jobs") = 0, py::arg("block") = 256,
          "Add samples X (n, d) with outputs Y (n, m); z = P^T x when P (d, k) is given.")
      .def("merge", &HermiteSums::merge, py::arg("other"))
      .def("sums", [](const HermiteSums& h, int r) { return RowMatrixXd(h.sums(r)); }, py::arg("r"))
      .def(
          "set_state",
          [](HermiteSums& h, double count, py::kwargs kw) {
            std::vector<RowMatrixXd> sums;
            for (int r = 0; r <= h.order(); ++r) {
              const std::string key = "sums_" + std::to_string(r);
              if (!kw.contains(key.c_str())) throw std::invalid_argument("HermiteSums.set_state: missing " + key);
              sums.push_back(kw[key.c_str()].cast<RowMatrixXd>());
            }
            h.set_state(count, sums);
          },
          py::arg("count"), "Replace the raw sums (count, sums_0=..., ..., sums_order=...).")
      .def("state",
           [](const HermiteSums& h) {
             py::dict st;
             st["count"] = h.count();
             for (int r = 0; r <= h.order(); ++r) st[("sums_" + std::to_string(r)).c_str()] = RowMatrixXd(h.sums(r));
             return st;
           },
           "The raw sums: count and sums_r (m, k^r) for r = 0..order.")
      .def_property_readonly("k", &HermiteSums::k)
      .def_property_readonly("m", &HermiteSums::m)
      .def_property_readonly("order", &HermiteSums::order)
      .def_property_readonly("count", &HermiteSums::count);

  m.def(
      "region_systems",
      [](const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V, const Eigen::VectorXd& b,
         const RowMatrixXd& U, const Eigen::VectorXd& c, const Eigen::VectorXd& margin,
         std::optional<BoolVector> mask, Index max_regions, int n_jobs, Index block) {
        RegionSystems r = interruptible([&] {
          return region_systems(X, Y, V, b, U, c, margin, mask ? &*mask : nullptr, max_regions, n_jobs, block);
        });
        const Index R = r.counts.size();
        Eigen::Matrix<std::uint64_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> keys(R, r.n_words);
        if (R) std::copy(r.keys.begin(), r.keys.end(), keys.data());
        py::dict out;
        out["keys"] = keys;
        out["counts"] = r.counts;
        out["gram"] = r.gram;
        out["cross"] = r.cross;
        out["sq_res"] = r.sq_res;
        out["fgram"] = r.fgram;
        out["fcross"] = r.fcross;
        out["sq_residual"] = r.sq_residual;
        out["sq_norm"] = r.sq_norm;
        out["n_certain"] = r.n_certain;
        out["count"] = r.count;
        return out;
      },
      py::arg("X").noconvert(), py::arg("Y").noconvert(), py::arg("V"), py::arg("b"), py::arg("U"),
      py::arg("c"), py::arg("margin"), py::arg("mask") = py::none(), py::arg("max_regions") = 1 << 16,
      py::arg("n_jobs") = 0, py::arg("block") = 4096,
      "Per activation region (certain pattern) normal equations of the residual's affine fit, "
      "plus output-layer statistics over all samples.");

  m.def(
      "region_residuals",
      [](const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V, const Eigen::VectorXd& b,
         const RowMatrixXd& U, const Eigen::VectorXd& c, const Eigen::VectorXd& margin,
         const RowMatrixXd& dC, const Eigen::VectorXd& dc, int n_jobs, Index block) {
        return interruptible([&] { return region_residuals(X, Y, V, b, U, c, margin, dC, dc, n_jobs, block); });
      },
      py::arg("X").noconvert(), py::arg("Y").noconvert(), py::arg("V"), py::arg("b"), py::arg("U"),
      py::arg("c"), py::arg("margin"), py::arg("dC"), py::arg("dc"), py::arg("n_jobs") = 0,
      py::arg("block") = 4096, "Per-sample residual after the linearised region update (NaN: uncertain).");

  m.def(
      "lll_reduce",
      [](const ConstRowRef& B, double delta, long long max_swaps) {
        LllResult res = interruptible([&] { return lll_reduce(B, delta, max_swaps); });
        py::dict out;
        out["basis"] = res.basis;
        out["swaps"] = res.swaps;
        out["complete"] = res.complete;
        return out;
      },
      py::arg("B").noconvert(), py::arg("delta") = 0.99, py::arg("max_swaps") = 10000000LL,
      "LLL reduction (Schnorr-Euchner floating-point form) of the rows of B, integers held in doubles "
      "below 2^52: dict of basis (reduced rows), swaps and complete (False: stopped at max_swaps).");

  // ---- CP-ALS contractions (kernels/cp) ----
  m.def(
      "slice_products",
      [](const ConstRowRef& P, Index k1, const ConstRowRef& C, std::optional<RowMatrixXd> W,
         std::optional<py::capsule> dgemm, int n_jobs, std::optional<py::array_t<double, py::array::c_style>> out) {
        auto shape = [](const auto& a) { return std::to_string(a.rows()) + " x " + std::to_string(a.cols()); };
        if (k1 < 1 || P.rows() % k1 != 0)
          throw py::value_error("slice_products: P must have a multiple of k1 >= 1 rows; got P " + shape(P) +
                                ", k1 = " + std::to_string(k1));
        if (C.rows() != P.cols())
          throw py::value_error("slice_products: C must have P.shape[1] rows; got P " + shape(P) + ", C " + shape(C));
        if (W && (W->rows() != k1 || W->cols() != C.cols()))
          throw py::value_error("slice_products: W must be k1 x C.shape[1]; got W " + shape(*W) + ", k1 = " +
                                std::to_string(k1) + ", C " + shape(C));
        const long long big = std::numeric_limits<int>::max();
        if (dgemm && (P.rows() > big || P.outerStride() > big || C.outerStride() > big))
          throw py::value_error("slice_products: dimensions beyond a 32-bit BLAS; got P " + shape(P));
        DgemmFn fn = dgemm ? reinterpret_cast<DgemmFn>(dgemm->get_pointer()) : nullptr;
        // Q is written in place into a NumPy array (a fresh one, or `out` reused across
        // calls): no copy on return, and no new pages to fault in at every CP-ALS sweep.
        py::array_t<double, py::array::c_style> Qa =
            out ? *out : py::array_t<double, py::array::c_style>({P.rows(), C.cols()});
        if (out && (Qa.ndim() != 2 || Qa.shape(0) != P.rows() || Qa.shape(1) != C.cols() || !Qa.writeable()))
          throw py::value_error("slice_products: out must be a writeable C-contiguous float64 array of shape (" +
                                std::to_string(P.rows()) + ", " + std::to_string(C.cols()) + ")");
        Eigen::Map<RowMatrixXd> Q(Qa.mutable_data(), P.rows(), C.cols());
        RowMatrixXd T;
        const RowMatrixXd none(0, C.cols());
        interruptible([&] {
          slice_products(P, k1, C, W ? ConstRowRef(*W) : ConstRowRef(none), fn, n_jobs, Q, T);
          return true;
        });
        return py::make_tuple(Qa, T);
      },
      py::arg("P").noconvert(), py::arg("k1"), py::arg("C").noconvert(), py::arg("W") = py::none(),
      py::arg("dgemm") = py::none(), py::arg("n_jobs") = 0, py::arg("out").noconvert() = py::none(),
      "CP-ALS: P ((m k1) x k2, m slices of k1 rows) times C (k2 x r) slice by slice, Q ((m k1) x r), and "
      "T (m x r), row i the column sums of Q_i .* W for W (k1 x r) (0 x r without W). dgemm: the capsule "
      "of a Fortran dgemm that is safe to call from several threads (scipy.linalg.cython_blas's, with the "
      "BLAS limited to one thread), or None for Eigen's product. out: an array to write Q into.");
  m.def(
      "slice_weighted_sum",
      [](const ConstRowRef& S, const ConstRowRef& A, int n_jobs) {
        if (A.rows() < 1 || S.rows() % A.rows() != 0 || S.cols() != A.cols())
          throw py::value_error("slice_weighted_sum: S must be (m k) x r for A (m x r), m >= 1; got S " +
                                std::to_string(S.rows()) + " x " + std::to_string(S.cols()) + ", A " +
                                std::to_string(A.rows()) + " x " + std::to_string(A.cols()));
        return interruptible([&] { return slice_weighted_sum(S, A, n_jobs); });
      },
      py::arg("S").noconvert(), py::arg("A").noconvert(), py::arg("n_jobs") = 0,
      "CP-ALS: sum over i of the slices S_i (rows [i k, (i + 1) k) of S) times row i of A, elementwise "
      "(k x r; summed in order of i whatever n_jobs).");
}
