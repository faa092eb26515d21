// Fused CPU kernels for HSTU pointwise attention, called through MindSpore ops.Custom (func_type="aot").
//
// RabIndex: the relative (position, time) bucket of every (query, key) pair, or the mask index, in one
//           pass (MindSpore would need ~12 elementwise kernels, each a full pass over B x K).
// BiasSilu: out = SiLU(scores + table[head, index]) with masked pairs set to exactly 0, in one pass
//           (instead of gather + add + sigmoid + mul).
// PointwiseAttention: out = sum_k SiLU(q k^T + table[head, index]) v * inv_norm, tile by tile, so the
//           [B, K] score block never leaves the cache (instead of bmm + BiasSilu + bmm through memory).
//           Q, K and V are read in place through strided views (the token-major projection output, or
//           a slot of the KV pool), so no head transpose, block slice or pool gather copies them first. The tile GEMMs call
//           oneDNN's dnnl_sgemm from the libdnnl that MindSpore ships (RelaygrInitGemm finds it).
// ScatterViewRows: copies per-head rows of the layers' projection outputs into rows of a KV pool Parameter, in
//           place (the prefix graph's slot write: no head transpose, stack or scatter_update copy first).
// All follow the reference ops in mindspore_relaygr/model/hstu.py exactly: time buckets are defined
// by thresholds (bucket = number of thresholds <= dt), found here with a fast log estimate plus an
// exact +-1 correction against the same thresholds. Build with -ffp-contract=off so hi * 65536 + lo is
// rounded exactly like the reference (no fused multiply-add). Threads come from a small pool of our own whose
// workers sleep between calls: OpenMP's spinning workers would steal the cores MindSpore's own kernels use.
#include <dlfcn.h>
#include <sched.h>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

// Threads a kernel may use: RELAYGR_KERNEL_THREADS (at least 1), else the cores this process may run on (its
// affinity mask: an instance pinned to one core must not run two kernel threads on it), else the hardware's.
int64_t kernel_threads() {
  const char *env = std::getenv("RELAYGR_KERNEL_THREADS");
  if (env != nullptr) return std::max(1, std::atoi(env));
  static const int64_t usable = [] {  // read once: no system call on every kernel call
#ifdef __linux__
    cpu_set_t mask;
    if (sched_getaffinity(0, sizeof(mask), &mask) == 0 && CPU_COUNT(&mask) > 0) return int64_t{CPU_COUNT(&mask)};
#endif
    const int64_t hw = static_cast<int64_t>(std::thread::hardware_concurrency());
    return hw > 0 ? hw : int64_t{1};
  }();
  return usable;
}

// Worker threads kept for the life of the process, parked on a condition variable between kernel calls (never
// spinning, so they take no core from MindSpore's own kernels). A kernel call costs a wake-up (~10 us) instead of
// a thread creation (~37 us here), and each worker keeps its thread_local scratch buffers from call to call. One
// run at a time: a caller that finds the pool busy (another thread is running a kernel) spawns threads instead.
class WorkerPool {
 public:
  // This process's pool: a forked child (whose copy has no threads) builds its own; the old one is left alone.
  static WorkerPool &get() {
    static std::atomic<WorkerPool *> pool{nullptr};
    static std::atomic<pid_t> owner{0};
    const pid_t pid = getpid();
    WorkerPool *current = pool.load();
    if (current == nullptr || owner.load() != pid) {
      static std::mutex create_mu;  // a child that forked while it was held never reaches here twice
      std::lock_guard<std::mutex> lock(create_mu);
      current = pool.load();
      if (current == nullptr || owner.load() != pid) {
        current = new WorkerPool();  // never deleted: parked workers may outlive static destructors
        pool.store(current);
        owner.store(pid);
      }
    }
    return *current;
  }

  // body(t) for t in [0, threads): t = 0 on the calling thread, the others on workers; returns when all are done.
  void run(int64_t threads, const std::function<void(int64_t)> &body) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (!busy.owns_lock()) {
      spawn(threads, body);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (static_cast<int64_t>(workers_.size()) < threads - 1) {
        const int64_t index = static_cast<int64_t>(workers_.size()) + 1;
        workers_.emplace_back([this, index] { work(index); });
        workers_.back().detach();
      }
      job_ = &body;
      wanted_ = threads;
      pending_ = threads - 1;
      ++generation_;
    }
    wake_.notify_all();
    body(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  static void spawn(int64_t threads, const std::function<void(int64_t)> &body) {
    std::vector<std::thread> extra;
    for (int64_t t = 1; t < threads; ++t) extra.emplace_back(body, t);
    body(0);
    for (auto &th : extra) th.join();
  }

  void work(int64_t index) {
    int64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (index >= wanted_) continue;  // this run needs fewer threads
      const std::function<void(int64_t)> *job = job_;
      lock.unlock();
      (*job)(index);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex run_mu_, mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t)> *job_ = nullptr;
  int64_t generation_ = 0, wanted_ = 0, pending_ = 0;
};

// Kernel profile (off unless RelaygrProfile(1)): where the kernels' threads spend their time, summed over every
// thread of every kernel call, so a benchmark can split a graph's time into the tile GEMMs (their calls, FLOPs and
// time inside dnnl_sgemm), the fused elementwise work around them (bias + SiLU, layer norm, gating, residual),
// the rest of the kernels' parallel loops (bias index, masks, tile set-up) and everything outside the kernels.
std::atomic<bool> g_profile{false};
std::atomic<int64_t> g_gemm_calls{0}, g_gemm_ns{0}, g_gemm_flops{0}, g_elementwise_ns{0}, g_kernel_ns{0};

// Adds the thread-nanoseconds of its lifetime to `counter` while the profile is on (two clock reads; nothing off).
class ProfileScope {
 public:
  explicit ProfileScope(std::atomic<int64_t> &counter)
      : counter_(counter), on_(g_profile.load(std::memory_order_relaxed)) {
    if (on_) t0_ = std::chrono::steady_clock::now();
  }
  bool on() const { return on_; }
  ~ProfileScope() {
    if (!on_) return;
    const auto dt = std::chrono::steady_clock::now() - t0_;
    counter_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count(), std::memory_order_relaxed);
  }
  ProfileScope(const ProfileScope &) = delete;
  ProfileScope &operator=(const ProfileScope &) = delete;

 private:
  std::atomic<int64_t> &counter_;
  const bool on_;
  std::chrono::steady_clock::time_point t0_;
};

template <typename F>
void parallel_rows(int64_t rows, int64_t work_per_row, F fn) {
  int64_t threads = kernel_threads();
  const int64_t min_work = 1 << 16;  // below this a thread costs more than it saves
  if (threads > rows) threads = rows;
  if (threads > 1 && rows * work_per_row < min_work * threads) threads = std::max<int64_t>(1, rows * work_per_row / min_work);
  if (threads <= 1) {
    ProfileScope scope(g_kernel_ns);
    fn(0, rows);
    return;
  }
  const int64_t step = (rows + threads - 1) / threads;
  WorkerPool::get().run(threads, [&](int64_t t) {
    ProfileScope scope(g_kernel_ns);
    const int64_t lo = t * step, hi = std::min(rows, lo + step);
    if (lo < hi) fn(lo, hi);
  });
}

// Natural log estimate (|error| < 1e-4) for x >= 1; branch-free so loops vectorize.
inline float log_estimate(float x) {
  int32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const float e = static_cast<float>((bits >> 23) - 127);
  bits = (bits & 0x007fffff) | 0x3f800000;
  float m;
  std::memcpy(&m, &bits, sizeof(bits));  // m in [1, 2)
  const float t = (m - 1.0f) / (m + 1.0f), t2 = t * t;
  return e * 0.69314718f + 2.0f * t * (1.0f + t2 * (0.33333333f + t2 * (0.2f + t2 * 0.14285714f)));
}

// a * b + c: one rounding where the CPU has FMA (explicit, so -ffp-contract=off elsewhere is unaffected).
inline float mul_add(float a, float b, float c) {
#ifdef __FMA__
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// exp(z) for z in [-87, 87] within ~2 ulp; branch-free (round via the 1.5 * 2^23 trick) so loops vectorize.
inline float exp_clamped(float z) {
  const float k = z * 1.44269504088896341f;
  const float n = (k + 12582912.0f) - 12582912.0f;
  const float r = mul_add(n, 2.12194440e-4f, mul_add(-n, 0.693359375f, z));
  float p = 1.9875691500e-4f;
  p = mul_add(p, r, 1.3981999507e-3f);
  p = mul_add(p, r, 8.3334519073e-3f);
  p = mul_add(p, r, 4.1665795894e-2f);
  p = mul_add(p, r, 1.6666665459e-1f);
  p = mul_add(p, r, 5.0000001201e-1f);
  p = mul_add(p * r, r, r + 1.0f);
  int32_t bits;
  std::memcpy(&bits, &p, sizeof(bits));
  bits += static_cast<int32_t>(n) * (1 << 23);
  std::memcpy(&p, &bits, sizeof(bits));
  return p;
}

inline float silu(float x) {
  // Ternaries, not fmin/fmax: those keep NaN semantics and block vectorization.
  float z = -x;
  z = z < -87.0f ? -87.0f : z;
  z = z > 87.0f ? 87.0f : z;
  return x / (1.0f + exp_clamped(z));
}

#ifdef __AVX512F__
// 16 lanes of SiLU(x) = x / (1 + exp(-x)): exp by the same Cody-Waite reduction and polynomial as exp_clamped,
// with vscalefps for the 2^n step, and the division as a reciprocal estimate plus one Newton step (relative
// error ~1e-7). Sixteen lanes where the compiler's auto-vectorized loops use eight (-march=native tunes for
// 256-bit vectors here), and no vdivps, which is slow.
inline __m512 silu16(__m512 x) {
  const __m512 z = _mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), x), _mm512_set1_ps(87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(z, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), z);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512 d = _mm512_add_ps(_mm512_scalef_ps(p, n), _mm512_set1_ps(1.0f));  // z <= 87: d is finite
  __m512 inv = _mm512_rcp14_ps(d);
  inv = _mm512_mul_ps(inv, _mm512_fnmadd_ps(d, inv, _mm512_set1_ps(2.0f)));
  return _mm512_mul_ps(x, inv);
}

// Lanes [0, n) of a 16-lane step (n < 16 only at the end of a span).
inline __mmask16 first_lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }
#endif

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define RELAYGR_AVX2 1
// 8 lanes of SiLU(x), as silu16 but for AVX2: the 2^n step adds n to the exponent bits (as exp_clamped does), so z
// is clamped to [-87, 87] on both sides; the division is a reciprocal estimate plus one Newton step (relative error
// ~2e-7). The compiler's own vectorization of silu() keeps vdivps and the scalar table gather of bias_silu_span.
inline __m256 silu8(__m256 x) {
  __m256 z = _mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), x), _mm256_set1_ps(87.0f));
  z = _mm256_max_ps(z, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(z, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), z);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
  const __m256 d = _mm256_add_ps(_mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e)), _mm256_set1_ps(1.0f));
  __m256 inv = _mm256_rcp_ps(d);
  inv = _mm256_mul_ps(inv, _mm256_fnmadd_ps(d, inv, _mm256_set1_ps(2.0f)));
  return _mm256_mul_ps(x, inv);
}
#endif

// o[j] = SiLU(s[j] + t[ix[j]]), or exactly 0 where ix[j] == mask (o may be s).
void bias_silu_span(const float *s, const int32_t *__restrict ix, const float *__restrict t, float *o, int64_t n,
                    int32_t mask) {
#ifdef __AVX512F__
  const __m512i vmask = _mm512_set1_epi32(mask);
  auto step = [&](int64_t j, __mmask16 lanes, bool full) {
    // Lanes past n read the mask entry; masked loads and stores only at the end (they are slow on some CPUs).
    const __m512i k = full ? _mm512_loadu_si512(ix + j) : _mm512_mask_loadu_epi32(vmask, lanes, ix + j);
    const __m512 sv = full ? _mm512_loadu_ps(s + j) : _mm512_maskz_loadu_ps(lanes, s + j);
    const __m512 y = _mm512_maskz_mov_ps(_mm512_cmpneq_epi32_mask(k, vmask),
                                         silu16(_mm512_add_ps(sv, _mm512_i32gather_ps(k, t, 4))));
    if (full) {
      _mm512_storeu_ps(o + j, y);
    } else {
      _mm512_mask_storeu_ps(o + j, lanes, y);
    }
  };
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) step(j, 0xffff, true);
  if (j < n) step(j, first_lanes(n - j), false);
#elif defined(RELAYGR_AVX2)
  const __m256i vmask = _mm256_set1_epi32(mask);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(ix + j));
    const __m256 keep = _mm256_castsi256_ps(_mm256_xor_si256(_mm256_cmpeq_epi32(k, vmask), _mm256_set1_epi32(-1)));
    const __m256 y = silu8(_mm256_add_ps(_mm256_loadu_ps(s + j), _mm256_i32gather_ps(t, k, 4)));
    _mm256_storeu_ps(o + j, _mm256_and_ps(keep, y));
  }
  for (; j < n; ++j) o[j] = ix[j] == mask ? 0.0f : silu(s[j] + t[ix[j]]);
#else
  // Two passes over an L1-sized chunk: the table gather is scalar, the SiLU pass vectorizes.
  constexpr int64_t kChunk = 512;
  float x[kChunk], keep[kChunk];
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t m = std::min(kChunk, n - c0);
    for (int64_t j = 0; j < m; ++j) {
      const int32_t k = ix[c0 + j];
      x[j] = s[c0 + j] + t[k];
      keep[j] = static_cast<float>(k != mask);  // masked pairs are exactly 0
    }
    for (int64_t j = 0; j < m; ++j) o[c0 + j] = keep[j] * silu(x[j]);
  }
#endif
}

// o[j] = keep[j] * SiLU(s[j] + bias[j]) (o may be s): rows that share one bias row (candidates), whose bias and
// mask were looked up once; keep == nullptr means every column is kept (a dense bias, as in ProjectSilu).
void add_silu_span(const float *s, const float *__restrict bias, const float *__restrict keep, float *o, int64_t n) {
#ifdef __AVX512F__
  auto step = [&](int64_t j, __mmask16 lanes, bool full) {
    const __m512 sv = full ? _mm512_loadu_ps(s + j) : _mm512_maskz_loadu_ps(lanes, s + j);
    const __m512 bv = full ? _mm512_loadu_ps(bias + j) : _mm512_maskz_loadu_ps(lanes, bias + j);
    __m512 y = silu16(_mm512_add_ps(sv, bv));
    if (keep != nullptr) y = _mm512_mul_ps(full ? _mm512_loadu_ps(keep + j) : _mm512_maskz_loadu_ps(lanes, keep + j), y);
    if (full) {
      _mm512_storeu_ps(o + j, y);
    } else {
      _mm512_mask_storeu_ps(o + j, lanes, y);
    }
  };
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) step(j, 0xffff, true);
  if (j < n) step(j, first_lanes(n - j), false);
#elif defined(RELAYGR_AVX2)
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 y = silu8(_mm256_add_ps(_mm256_loadu_ps(s + j), _mm256_loadu_ps(bias + j)));
    if (keep != nullptr) y = _mm256_mul_ps(_mm256_loadu_ps(keep + j), y);
    _mm256_storeu_ps(o + j, y);
  }
  for (; j < n; ++j) o[j] = (keep == nullptr ? 1.0f : keep[j]) * silu(s[j] + bias[j]);
#else
  if (keep == nullptr) {
    for (int64_t j = 0; j < n; ++j) o[j] = silu(s[j] + bias[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) o[j] = keep[j] * silu(s[j] + bias[j]);
  }
#endif
}

struct RabQuery {
  int32_t pos;
  float hi, lo;
};

struct RabParams {
  const int32_t *__restrict pos_lut;
  const float *__restrict thr;
  int32_t max_rel, max_tb, num_pos, mask;
  float scale;
};

void rab_index_row(RabQuery q, const int32_t *__restrict k_pos, const float *__restrict k_hi,
                   const float *__restrict k_lo, const uint8_t *__restrict k_valid, const RabParams &prm,
                   int32_t *__restrict out, int64_t cols) {
  const int32_t *__restrict lut = prm.pos_lut;
  const float *__restrict thr = prm.thr;
  const int32_t max_rel = prm.max_rel, max_tb = prm.max_tb, num_pos = prm.num_pos, mask = prm.mask;
  const float scale = prm.scale;
  for (int64_t j = 0; j < cols; ++j) {
    const int32_t rel = q.pos - k_pos[j];
    const float hi = q.hi - k_hi[j];
    const float lo = q.lo - k_lo[j];
    const float dt = std::fabs(hi * 65536.0f + lo);
    int32_t tb = static_cast<int32_t>(log_estimate(1.0f + dt) * scale);
    tb = std::min(std::max(tb, 0), max_tb);
    // Exact correction (the thresholds define the bucket): the estimate is off by at most one bucket,
    // and both thresholds are read with the same index so the loop vectorizes (two gathers).
    const float below = thr[tb], above = thr[tb + 1];
    tb = tb - static_cast<int32_t>(dt < below) + static_cast<int32_t>(dt >= above);
    const int32_t pb = lut[std::min(std::max(rel, 0), max_rel)];
    const int32_t visible = static_cast<int32_t>(k_valid[j] != 0) & static_cast<int32_t>(rel >= 0);
    out[j] = visible * (tb * num_pos + pb) + (1 - visible) * mask;
  }
}

// Rows of S [rows, cols] (leading dimension ld) in place: s = SiLU(s + t[ix]), masked pairs exactly 0.
// ix_ld == 0 means every row shares one index row (candidates): its bias is gathered once and the rows only
// add it.
void bias_silu_tile(float *__restrict s, int64_t ld, const int32_t *__restrict ix, int64_t ix_ld,
                    const float *__restrict t, int64_t rows, int64_t cols, int32_t mask) {
  if (ix_ld == 0 && rows > 1) {
    thread_local std::vector<float> bias, keep;
    bias.resize(cols);
    keep.resize(cols);
    float *__restrict b = bias.data();
    float *__restrict kp = keep.data();
    for (int64_t j = 0; j < cols; ++j) {
      b[j] = t[ix[j]];
      kp[j] = static_cast<float>(ix[j] != mask);
    }
    for (int64_t r = 0; r < rows; ++r) add_silu_span(s + r * ld, b, kp, s + r * ld, cols);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) bias_silu_span(s + r * ld, ix + r * ix_ld, t, s + r * ld, cols, mask);
}

// 1 + the last column of the tile that any row sees (not the mask index); 0 if it sees none. Causal tiles on
// the diagonal then run their GEMMs over the visible columns only. Rows are scanned from the last, which
// sees the most under a causal mask, so a fully visible tile costs one comparison.
int64_t visible_cols(const int32_t *ix, int64_t ix_ld, int64_t rows, int64_t cols, int32_t mask) {
  int64_t seen = 0;
  for (int64_t r = rows - 1; r >= 0 && seen < cols; --r) {
    const int32_t *irow = ix + r * ix_ld;
    for (int64_t j = cols - 1; j >= seen; --j) {
      if (irow[j] != mask) {
        seen = j + 1;
        break;
      }
    }
  }
  return seen;
}

using SgemmFn = int (*)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                        int64_t, float, float *, int64_t);
std::atomic<SgemmFn> g_sgemm{nullptr};

int tile_gemm(SgemmFn sgemm, char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
              int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  ProfileScope scope(g_gemm_ns);
  if (scope.on()) {
    g_gemm_calls.fetch_add(1, std::memory_order_relaxed);
    g_gemm_flops.fetch_add(2 * m * n * k, std::memory_order_relaxed);
  }
  return sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Work items are handed out one at a time: causal tiles differ in cost, so a static split would idle a core.
template <typename F>
void parallel_items(int64_t items, F fn) {
  const int64_t threads = std::min(kernel_threads(), std::max<int64_t>(items, 1));
  std::atomic<int64_t> next{0};
  auto worker = [&](int64_t) {
    ProfileScope scope(g_kernel_ns);
    for (int64_t i = next.fetch_add(1); i < items; i = next.fetch_add(1)) fn(i);
  };
  if (threads <= 1) {
    worker(0);
    return;
  }
  WorkerPool::get().run(threads, worker);
}

int64_t numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

// RabIndex over queries [q0, q0 + rows) and keys [k0, k0 + cols) of params[0..9] (see RabIndex) into idx.
int rab_index(void **params, int *ndims, int64_t **shapes, int64_t q0, int64_t rows, int64_t k0, int64_t cols,
              int32_t *idx) {
  const int32_t *q_pos = static_cast<const int32_t *>(params[0]) + q0;
  const float *q_hi = static_cast<const float *>(params[1]) + q0;
  const float *q_lo = static_cast<const float *>(params[2]) + q0;
  const int32_t *k_pos = static_cast<const int32_t *>(params[3]) + k0;
  const float *k_hi = static_cast<const float *>(params[4]) + k0;
  const float *k_lo = static_cast<const float *>(params[5]) + k0;
  const uint8_t *k_valid = static_cast<const uint8_t *>(params[6]) + k0;  // bool, one byte
  const int32_t *pos_lut = static_cast<const int32_t *>(params[7]);
  const float *thr = static_cast<const float *>(params[8]);
  const float *p = static_cast<const float *>(params[9]);
  const int32_t max_rel = static_cast<int32_t>(numel(ndims[7], shapes[7]) - 1);
  const int32_t max_tb = static_cast<int32_t>(numel(ndims[8], shapes[8]) - 2);
  const RabParams prm{pos_lut, thr, max_rel, max_tb, static_cast<int32_t>(p[0]), static_cast<int32_t>(p[2]), p[1]};
  parallel_rows(rows, cols, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      rab_index_row(RabQuery{q_pos[i], q_hi[i], q_lo[i]}, k_pos, k_hi, k_lo, k_valid, prm, idx + i * cols, cols);
    }
  });
  return 0;
}

}  // namespace

extern "C" {

// inputs: q_pos[B] i32, q_hi[B] f32, q_lo[B] f32, k_pos[K] i32, k_hi[K] f32, k_lo[K] f32, k_valid[K] bool,
//         pos_lut[R] i32, thresholds[T + 1] f32 (0, then the T - 1 time thresholds, then +inf),
//         params[3] f32 = (num_pos_buckets, time_scale, mask_index)
// output: idx[B, K] i32
int RabIndex(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
             void *extra) {
  if (nparam != 11) return 1;
  const int64_t rows = numel(ndims[0], shapes[0]), cols = numel(ndims[3], shapes[3]);
  return rab_index(params, ndims, shapes, 0, rows, 0, cols, static_cast<int32_t *>(params[10]));
}

// RabIndex of a window: queries [q0, q0 + B) and keys [k0, k0 + K) of the query and key arrays, which need not be
// sliced first (a block of a long prefix: its graph then runs one op per block instead of eight).
// inputs: as RabIndex (query arrays [Bq], key arrays [Kk]), then window[2] i64 = (q0, k0), rows[B] and cols[K] (any
//         dtype: only their shapes are read, they give the output its shape)
// output: idx[B, K] i32
int RabIndexWindow(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                   void *extra) {
  if (nparam != 14) return 1;
  const int64_t *window = static_cast<const int64_t *>(params[10]);
  const int64_t rows = numel(ndims[11], shapes[11]), cols = numel(ndims[12], shapes[12]);
  const int64_t q0 = window[0], k0 = window[1];
  if (q0 < 0 || k0 < 0 || q0 + rows > numel(ndims[0], shapes[0]) || k0 + cols > numel(ndims[3], shapes[3])) return 2;
  return rab_index(params, ndims, shapes, q0, rows, k0, cols, static_cast<int32_t *>(params[13]));
}

// inputs: scores[H, B, K] f32, idx[Bi, K] i32 (Bi == B, or 1 to share one row), table[H, T] f32
//         (its last column, index T-1, is the mask entry)
// output: out[H, B, K] f32
int BiasSilu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
             void *extra) {
  if (nparam != 4) return 1;
  const float *scores = static_cast<const float *>(params[0]);
  const int32_t *idx = static_cast<const int32_t *>(params[1]);
  const float *table = static_cast<const float *>(params[2]);
  float *out = static_cast<float *>(params[3]);
  const int64_t heads = shapes[0][0], rows = shapes[0][1], cols = shapes[0][2];
  const int64_t idx_rows = shapes[1][0];
  const int64_t table_cols = shapes[2][1];
  const int32_t mask = static_cast<int32_t>(table_cols - 1);
  if (idx_rows == 1) {
    std::vector<float> bias(heads * cols), keep(cols);
    for (int64_t j = 0; j < cols; ++j) keep[j] = static_cast<float>(idx[j] != mask);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t j = 0; j < cols; ++j) bias[h * cols + j] = table[h * table_cols + idx[j]];
    }
    parallel_rows(heads * rows, cols, [&](int64_t r0, int64_t r1) {
      ProfileScope scope(g_elementwise_ns);
      for (int64_t hr = r0; hr < r1; ++hr) {
        add_silu_span(scores + hr * cols, bias.data() + (hr / rows) * cols, keep.data(), out + hr * cols, cols);
      }
    });
    return 0;
  }
  parallel_rows(heads * rows, cols, [&](int64_t r0, int64_t r1) {
    ProfileScope scope(g_elementwise_ns);
    for (int64_t hr = r0; hr < r1; ++hr) {
      const int64_t h = hr / rows, r = hr % rows;
      bias_silu_span(scores + hr * cols, idx + r * cols, table + h * table_cols, out + hr * cols, cols, mask);
    }
  });
  return 0;
}

// Width in bits of the SIMD path this library was built with for SiLU and the bias gather: 512 (AVX-512), 256
// (AVX2 + FMA) or 0 (the compiler's own vectorization of the scalar code).
int RelaygrVectorBits() {
#if defined(__AVX512F__)
  return 512;
#elif defined(RELAYGR_AVX2)
  return 256;
#else
  return 0;
#endif
}

// Turns the kernel profile on (1: its counters restart from zero) or off (0: they keep what they counted).
void RelaygrProfile(int on) {
  g_profile.store(false);
  if (on == 0) return;
  for (auto *counter : {&g_gemm_calls, &g_gemm_ns, &g_gemm_flops, &g_elementwise_ns, &g_kernel_ns}) counter->store(0);
  g_profile.store(true);
}

// out[5] = (tile GEMM calls, thread-nanoseconds inside them, their FLOPs, thread-nanoseconds in the fused
// elementwise work, thread-nanoseconds in the kernels' parallel loops, which include both) since the profile was
// turned on.
void RelaygrProfileCounters(int64_t *out) {
  out[0] = g_gemm_calls.load();
  out[1] = g_gemm_ns.load();
  out[2] = g_gemm_flops.load();
  out[3] = g_elementwise_ns.load();
  out[4] = g_kernel_ns.load();
}

// Threads the kernels use (RELAYGR_KERNEL_THREADS, else the hardware's).
int64_t RelaygrKernelThreads() { return kernel_threads(); }

// Finds dnnl_sgemm in the oneDNN library at `path` (the one MindSpore ships); 1 on success.
int RelaygrInitGemm(const char *path) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return 0;
  auto fn = reinterpret_cast<SgemmFn>(dlsym(lib, "dnnl_sgemm"));
  if (fn == nullptr) return 0;
  g_sgemm.store(fn);
  return 1;
}

// A strided view of one operand: element (head h, row r, column c) is base[h * head_stride + r * row_stride + c].
struct View {
  const float *base;
  int64_t head_stride, row_stride, width;
};

// at = (offset of head 0 row 0, head stride, row stride, width) in elements; false if rows x heads overrun src.
bool make_view(const float *src, int64_t src_numel, const int64_t *at, int64_t heads, int64_t rows, View *view) {
  const int64_t offset = at[0], head_stride = at[1], row_stride = at[2], width = at[3];
  if (offset < 0 || head_stride < 0 || row_stride < width || width <= 0 || rows <= 0) return false;
  if (offset + (heads - 1) * head_stride + (rows - 1) * row_stride + width > src_numel) return false;
  *view = View{src + offset, head_stride, row_stride, width};
  return true;
}

// inputs: pool[R, d] f32 (written in place), ids[L * H * C] i32 (pool row of layer l, head g, token t at
//         (l * H + g) * C + t), at[5] i64 = (offset, head stride, row stride, width == d, H) of head 0 token 0
//         in each y_l, then y_0 .. y_{L-1}, each [n >= C, W] f32 (the layers' projection outputs)
// output: done[1] i32 = 1. MindSpore hands AOT kernels a Parameter's own buffer, so the rows land in the pool;
//         the graph makes its result depend on `done`, so the write always runs before the graph returns.
int ScatterViewRows(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                    void *extra) {
  const int layers = nparam - 4;
  if (layers < 1 || ndims[0] != 2 || numel(ndims[2], shapes[2]) != 5) return 1;
  float *pool = static_cast<float *>(params[0]);
  const int32_t *ids = static_cast<const int32_t *>(params[1]);
  const int64_t *at = static_cast<const int64_t *>(params[2]);
  const int64_t pool_rows = shapes[0][0], width = shapes[0][1], total = numel(ndims[1], shapes[1]);
  const int64_t offset = at[0], head_stride = at[1], row_stride = at[2], heads = at[4];
  if (at[3] != width || heads < 1 || total % (layers * heads) != 0) return 2;
  const int64_t tokens = total / (layers * heads);
  std::vector<const float *> ys(layers);
  for (int l = 0; l < layers; ++l) {
    if (ndims[3 + l] != 2 || shapes[3 + l][0] != shapes[3][0] || shapes[3 + l][1] != shapes[3][1]) return 3;
    ys[l] = static_cast<const float *>(params[3 + l]);
  }
  View view;
  if (tokens > 0 && !make_view(ys[0], numel(ndims[3], shapes[3]), at, heads, tokens, &view)) return 3;
  for (int64_t i = 0; i < total; ++i) {
    if (ids[i] < 0 || ids[i] >= pool_rows) return 4;
  }
  parallel_rows(total, width, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t l = i / (heads * tokens), g = (i / tokens) % heads, t = i % tokens;
      const float *src = ys[l] + offset + g * head_stride + t * row_stride;
      std::memcpy(pool + static_cast<int64_t>(ids[i]) * width, src, width * sizeof(float));
    }
  });
  static_cast<int32_t *>(params[nparam - 1])[0] = 1;
  return 0;
}

// inputs: q f32, q_at[4] i64, then one or more key segments, each k f32, k_at[4] i64, v f32, v_at[4] i64, idx[Bi, K]
//         i32, then table[H, T] f32 (last column is the mask entry), scales[2] f32 = (q scale, 1 / N_norm),
//         like[B, H * dv] (only its shape is read: the number of queries B).
//         Views: see make_view (q and k have width dq, v has width dv; q is scaled by scales[0] inside). In a
//         segment, 1 <= Bi <= B and query r uses index row min(r, Bi - 1) (Bi == B: a row each; Bi == 1: all
//         share one; else suffix rows, then candidates sharing the last row); K is the segment's key count.
// output: out[B, H * dv] f32 = the sum over segments (pointwise attention has no softmax normaliser, so keys
//         split into segments, e.g. the cached prefix and the new tokens, add up), token-major (head h in
//         columns [h * dv, (h + 1) * dv)).
int PointwiseAttention(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                       void *extra) {
  const SgemmFn sgemm = g_sgemm.load();
  if (nparam < 11 || (nparam - 6) % 5 != 0 || sgemm == nullptr) return 1;
  const int num_segments = (nparam - 6) / 5, tail = 2 + 5 * num_segments;
  const float *table = static_cast<const float *>(params[tail]);
  const float *scales = static_cast<const float *>(params[tail + 1]);
  float *out = static_cast<float *>(params[tail + 3]);
  const int64_t heads = shapes[tail][0], table_cols = shapes[tail][1];
  const int64_t rows = shapes[tail + 2][0];
  const int32_t mask = static_cast<int32_t>(table_cols - 1);
  struct Segment {
    View k, v;
    const int32_t *idx;
    int64_t idx_rows, keys;
  };
  std::vector<Segment> segments(num_segments);
  View qv;
  if (!make_view(static_cast<const float *>(params[0]), numel(ndims[0], shapes[0]),
                 static_cast<const int64_t *>(params[1]), heads, rows, &qv)) {
    return 2;
  }
  for (int s = 0; s < num_segments; ++s) {
    const int p = 2 + 5 * s;
    Segment &seg = segments[s];
    if (ndims[p + 4] != 2) return 3;
    seg.idx = static_cast<const int32_t *>(params[p + 4]);
    seg.idx_rows = shapes[p + 4][0];
    seg.keys = shapes[p + 4][1];
    if (seg.idx_rows < 1 || seg.idx_rows > rows) return 3;
    if (!make_view(static_cast<const float *>(params[p]), numel(ndims[p], shapes[p]),
                   static_cast<const int64_t *>(params[p + 1]), heads, seg.keys, &seg.k) ||
        !make_view(static_cast<const float *>(params[p + 2]), numel(ndims[p + 2], shapes[p + 2]),
                   static_cast<const int64_t *>(params[p + 3]), heads, seg.keys, &seg.v) ||
        seg.k.width != qv.width || seg.v.width != segments[0].v.width) {
      return 2;
    }
  }
  const int64_t dq = qv.width, dv = segments[0].v.width, out_ld = heads * dv;
  if (ndims[tail + 3] != 2 || shapes[tail + 3][1] != out_ld) return 4;
  const float q_scale = scales[0], inv_norm = scales[1];

  // A 64 x 512 score tile (128 KiB) stays in L2 between the two GEMMs; the fastest of 64-256 x 128-1024 here.
  // Up to 192 rows (candidates and suffix) form one tile, so each head streams its keys from memory once; such
  // a tile is 3x taller, and 256 keys per tile ran 3-10% faster than 512 there (160 rows x 4064 pool keys).
  const int64_t kTileQ = rows <= 192 ? rows : 64;
  const int64_t kTileK = rows <= 192 ? 256 : 512;
  const int64_t q_tiles = (rows + kTileQ - 1) / kTileQ;
  parallel_items(heads * q_tiles, [&](int64_t item) {
    thread_local std::vector<float> scores;
    scores.resize(kTileQ * kTileK);
    const int64_t h = item / q_tiles, q0 = (item % q_tiles) * kTileQ, qn = std::min(kTileQ, rows - q0);
    const float *qh = qv.base + h * qv.head_stride + q0 * qv.row_stride;
    const float *th = table + h * table_cols;
    float *oh = out + q0 * out_ld + h * dv;
    for (int64_t r = 0; r < qn; ++r) std::fill(oh + r * out_ld, oh + r * out_ld + dv, 0.0f);
    for (const Segment &seg : segments) {
      const float *kh = seg.k.base + h * seg.k.head_stride;
      const float *vh = seg.v.base + h * seg.v.head_stride;
      const int64_t keys = seg.keys;
      // Rows [0, own) of this tile have index rows of their own; rows [own, qn) share the last one.
      const int64_t own = std::min(std::max<int64_t>(seg.idx_rows - 1 - q0, 0), qn);
      const int32_t *own_ix = seg.idx + q0 * keys;
      const int32_t *shared_ix = seg.idx + (seg.idx_rows - 1) * keys;  // the index row of every query >= Bi - 1
      for (int64_t k0 = 0; k0 < keys; k0 += kTileK) {
        int64_t kn = std::min(kTileK, keys - k0);
        kn = std::max(own > 0 ? visible_cols(own_ix + k0, keys, own, kn, mask) : 0,
                      own < qn ? visible_cols(shared_ix + k0, 0, 1, kn, mask) : 0);
        if (kn == 0) continue;
        tile_gemm(sgemm, 'N', 'T', qn, kn, dq, q_scale, qh, qv.row_stride, kh + k0 * seg.k.row_stride,
                  seg.k.row_stride, 0.0f, scores.data(), kn);
        {
          ProfileScope scope(g_elementwise_ns);
          if (own > 0) bias_silu_tile(scores.data(), kn, own_ix + k0, keys, th, own, kn, mask);
          if (own < qn) bias_silu_tile(scores.data() + own * kn, kn, shared_ix + k0, 0, th, qn - own, kn, mask);
        }
        tile_gemm(sgemm, 'N', 'N', qn, dv, kn, inv_norm, scores.data(), kn, vh + k0 * seg.v.row_stride,
                  seg.v.row_stride, 1.0f, oh, out_ld);
      }
    }
  });
  return 0;
}

}  // extern "C"

// ---------------------------------------------------------------------------------------------------------
// The dense parts of an HSTU layer, tile by tile with a fused epilogue, so each [n, W] intermediate is written
// once instead of once per elementwise op (MindSpore: matmul, bias add, sigmoid, mul; layer norm, mul, matmul,
// bias add, add).

namespace {

// Row tiles of about 64 rows, as many per thread: [start, end) of tile t of `tiles`.
int64_t row_tiles(int64_t rows) {
  const int64_t threads = kernel_threads();
  const int64_t per_thread = (rows + 64 * threads - 1) / (64 * threads);
  return std::max<int64_t>(1, std::min(rows, threads * per_thread));
}

// Rows [r0, r0 + rn) of y = SiLU(x w + b): every column, or (ranges != nullptr) only the `count` ascending column
// ranges (start, end) listed in `ranges`, with zeros in the other columns.
void project_tile(SgemmFn sgemm, const float *x, const float *w, const float *b, float *y, int64_t d, int64_t width,
                  int64_t r0, int64_t rn, const int64_t *ranges, int64_t count) {
  const int64_t full[2] = {0, width};
  if (ranges == nullptr) ranges = full, count = 1;
  float *yt = y + r0 * width;
  int64_t done = 0;  // columns [0, done) of every row in the tile are written
  for (int64_t i = 0; i < count; ++i) {
    const int64_t lo = ranges[2 * i], hi = ranges[2 * i + 1];
    for (int64_t r = 0; r < rn; ++r) std::fill(yt + r * width + done, yt + r * width + lo, 0.0f);
    tile_gemm(sgemm, 'N', 'N', rn, hi - lo, d, 1.0f, x + r0 * d, d, w + lo, width, 0.0f, yt + lo, width);
    ProfileScope scope(g_elementwise_ns);
    for (int64_t r = 0; r < rn; ++r) add_silu_span(yt + r * width + lo, b + lo, nullptr, yt + r * width + lo, hi - lo);
    done = hi;
  }
  for (int64_t r = 0; r < rn; ++r) std::fill(yt + r * width + done, yt + (r + 1) * width, 0.0f);
}

// ProjectSilu's body: rows [0, first_full) get only the listed column ranges, rows [first_full, n) every column.
// Row tiles of the two kinds are separate: a tile never mixes them.
int project_silu(void **params, int *ndims, int64_t **shapes, float *y, int64_t first_full, const int64_t *ranges,
                 int64_t count) {
  const SgemmFn sgemm = g_sgemm.load();
  if (sgemm == nullptr) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  const float *b = static_cast<const float *>(params[2]);
  if (ndims[0] != 2 || ndims[1] != 2 || shapes[1][0] != shapes[0][1] || numel(ndims[2], shapes[2]) != shapes[1][1]) {
    return 2;
  }
  const int64_t n = shapes[0][0], d = shapes[0][1], width = shapes[1][1];
  for (int64_t i = 0, prev = 0; i < count; ++i) {
    const int64_t lo = ranges[2 * i], hi = ranges[2 * i + 1];
    if (lo < prev || hi <= lo || hi > width) return 3;
    prev = hi;
  }
  first_full = std::min(std::max<int64_t>(first_full, 0), n);
  const int64_t part_tiles = first_full > 0 ? row_tiles(first_full) : 0;
  const int64_t full_tiles = n > first_full ? row_tiles(n - first_full) : 0;
  const int64_t part_step = part_tiles ? (first_full + part_tiles - 1) / part_tiles : 0;
  const int64_t full_step = full_tiles ? (n - first_full + full_tiles - 1) / full_tiles : 0;
  parallel_items(part_tiles + full_tiles, [&](int64_t t) {
    const bool part = t < part_tiles;
    const int64_t r0 = part ? t * part_step : first_full + (t - part_tiles) * full_step;
    const int64_t rn = std::min(part ? part_step : full_step, (part ? first_full : n) - r0);
    if (rn > 0) project_tile(sgemm, x, w, b, y, d, width, r0, rn, part ? ranges : nullptr, count);
  });
  return 0;
}

}  // namespace

extern "C" {

// inputs: x[n, d] f32, w[d, W] f32, b[W] f32
// output: y[n, W] f32 = SiLU(x w + b)
int ProjectSilu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                void *extra) {
  if (nparam != 4) return 1;
  return project_silu(params, ndims, shapes, static_cast<float *>(params[3]), 0, nullptr, 0);
}

// ProjectSilu where rows [0, first_full) need only some columns (a last layer's token rows: only their K and V
// are read): those rows get the listed column ranges and zeros elsewhere; rows [first_full, n) get every column.
// inputs: x[n, d] f32, w[d, W] f32, b[W] f32, spec[1 + 2k] i64 = (first_full, start_0, end_0, ..., start_k-1,
//         end_k-1) with ascending, disjoint ranges inside [0, W)
// output: y[n, W] f32
int ProjectSiluColumns(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                       void *extra) {
  if (nparam != 5) return 1;
  const int64_t *spec = static_cast<const int64_t *>(params[3]);
  const int64_t spec_len = numel(ndims[3], shapes[3]);
  if (spec_len < 1 || spec_len % 2 != 1) return 3;
  return project_silu(params, ndims, shapes, static_cast<float *>(params[4]), spec[0], spec + 1, (spec_len - 1) / 2);
}

// inputs: x[n, d] f32, av[n, e] f32, u[n, e] f32, gamma[e] f32, beta[e] f32, w2[d, e] f32 (nn.Dense layout),
//         b2[d] f32, eps[1] f32
// output: x + (LayerNorm(av) * u) w2^T + b2, [n, d] (the layer's residual update)
int FinishRows(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
               void *extra) {
  const SgemmFn sgemm = g_sgemm.load();
  if (nparam != 9 || sgemm == nullptr) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const float *av = static_cast<const float *>(params[1]);
  const float *u = static_cast<const float *>(params[2]);
  const float *gamma = static_cast<const float *>(params[3]);
  const float *beta = static_cast<const float *>(params[4]);
  const float *w2 = static_cast<const float *>(params[5]);
  const float *b2 = static_cast<const float *>(params[6]);
  const float eps = static_cast<const float *>(params[7])[0];
  float *out = static_cast<float *>(params[8]);
  if (ndims[0] != 2 || ndims[1] != 2 || ndims[2] != 2 || ndims[5] != 2) return 2;
  const int64_t n = shapes[0][0], d = shapes[0][1], e = shapes[1][1];
  if (shapes[1][0] != n || shapes[2][0] != n || shapes[2][1] != e || shapes[5][0] != d || shapes[5][1] != e ||
      numel(ndims[3], shapes[3]) != e || numel(ndims[4], shapes[4]) != e || numel(ndims[6], shapes[6]) != d) {
    return 3;
  }
  const int64_t tiles = row_tiles(n), step = (n + tiles - 1) / tiles;
  parallel_items(tiles, [&](int64_t t) {
    const int64_t r0 = t * step, rn = std::min(step, n - r0);
    if (rn <= 0) return;
    thread_local std::vector<float> gated;
    gated.resize(rn * e);
    {
      ProfileScope scope(g_elementwise_ns);
      for (int64_t r = 0; r < rn; ++r) {
        const float *a = av + (r0 + r) * e;
        const float *g = u + (r0 + r) * e;
        double sum = 0.0, sq = 0.0;
        for (int64_t j = 0; j < e; ++j) sum += a[j];
        const float mean = static_cast<float>(sum / e);
        for (int64_t j = 0; j < e; ++j) sq += static_cast<double>(a[j] - mean) * (a[j] - mean);
        const float inv_std = 1.0f / std::sqrt(static_cast<float>(sq / e) + eps);
        float *__restrict z = gated.data() + r * e;
        for (int64_t j = 0; j < e; ++j) z[j] = ((a[j] - mean) * inv_std * gamma[j] + beta[j]) * g[j];
      }
    }
    float *ot = out + r0 * d;
    tile_gemm(sgemm, 'N', 'T', rn, d, e, 1.0f, gated.data(), e, w2, e, 0.0f, ot, d);
    ProfileScope scope(g_elementwise_ns);
    for (int64_t r = 0; r < rn; ++r) {
      const float *__restrict xr = x + (r0 + r) * d;
      float *__restrict o = ot + r * d;
      for (int64_t j = 0; j < d; ++j) o[j] = xr[j] + (o[j] + b2[j]);
    }
  });
  return 0;
}

}  // extern "C"
