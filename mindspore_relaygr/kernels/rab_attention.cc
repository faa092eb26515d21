// Fused CPU kernels for HSTU pointwise attention, called through MindSpore ops.Custom (func_type="aot").
//
// RabIndex: the relative (position, time) bucket of every (query, key) pair, or the mask index, in one
//           pass (MindSpore would need ~12 elementwise kernels, each a full pass over B x K).
// BiasSilu: out = SiLU(scores + table[head, index]) with masked pairs set to exactly 0, in one pass
//           (instead of gather + add + sigmoid + mul).
// Both follow the reference ops in mindspore_relaygr/model/hstu.py exactly: time buckets are defined
// by thresholds (bucket = number of thresholds <= dt), found here with a fast log estimate plus an
// exact +-1 correction against the same thresholds. Build with -ffp-contract=off so hi * 65536 + lo is
// rounded exactly like the reference (no fused multiply-add). Threads are plain std::threads joined
// before returning: OpenMP's spinning workers would steal the cores MindSpore's own kernels use.
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

template <typename F>
void parallel_rows(int64_t rows, int64_t work_per_row, F fn) {
  const int64_t hw = static_cast<int64_t>(std::thread::hardware_concurrency());
  int64_t threads = hw > 0 ? hw : 1;
  if (std::getenv("RELAYGR_KERNEL_THREADS")) threads = std::atoi(std::getenv("RELAYGR_KERNEL_THREADS"));
  const int64_t min_work = 1 << 16;  // below this a thread costs more than it saves
  if (threads > rows) threads = rows;
  if (threads > 1 && rows * work_per_row < min_work * threads) threads = std::max<int64_t>(1, rows * work_per_row / min_work);
  if (threads <= 1) {
    fn(0, rows);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t step = (rows + threads - 1) / threads;
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t lo = t * step, hi = std::min(rows, lo + step);
    if (lo < hi) pool.emplace_back(fn, lo, hi);
  }
  fn(0, std::min(rows, step));
  for (auto &th : pool) th.join();
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

// exp(z) for z in [-87, 87] within ~2 ulp; branch-free (round via the 1.5 * 2^23 trick) so loops vectorize.
inline float exp_clamped(float z) {
  const float k = z * 1.44269504088896341f;
  const float n = (k + 12582912.0f) - 12582912.0f;
  const float r = (z - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
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

void bias_silu_row(const float *__restrict s, const int32_t *__restrict ix, const float *__restrict t,
                   float *__restrict o, int64_t cols, int32_t mask) {
  // Two passes over an L1-sized chunk: the table gather is scalar, the SiLU pass vectorizes.
  constexpr int64_t kChunk = 512;
  float x[kChunk], keep[kChunk];
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t n = std::min(kChunk, cols - c0);
    for (int64_t j = 0; j < n; ++j) {
      const int32_t k = ix[c0 + j];
      x[j] = s[c0 + j] + t[k];
      keep[j] = static_cast<float>(k != mask);  // masked pairs are exactly 0
    }
    for (int64_t j = 0; j < n; ++j) o[c0 + j] = keep[j] * silu(x[j]);
  }
}

// Rows that share one bias row (candidates): bias and mask were looked up once for the whole block.
void bias_silu_shared_row(const float *__restrict s, const float *__restrict bias, const float *__restrict keep,
                          float *__restrict o, int64_t cols) {
  for (int64_t j = 0; j < cols; ++j) o[j] = keep[j] * silu(s[j] + bias[j]);
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
                   const float *__restrict k_lo, const bool *__restrict k_valid, const RabParams &prm,
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
    tb -= static_cast<int32_t>(dt < thr[tb]);  // exact correction: thresholds define the bucket
    tb += static_cast<int32_t>(dt >= thr[tb + 1]);
    const int32_t pb = lut[std::min(std::max(rel, 0), max_rel)];
    const int32_t visible = static_cast<int32_t>(k_valid[j]) & static_cast<int32_t>(rel >= 0);
    out[j] = visible * (tb * num_pos + pb) + (1 - visible) * mask;
  }
}

int64_t numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
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
  const int32_t *q_pos = static_cast<const int32_t *>(params[0]);
  const float *q_hi = static_cast<const float *>(params[1]);
  const float *q_lo = static_cast<const float *>(params[2]);
  const int32_t *k_pos = static_cast<const int32_t *>(params[3]);
  const float *k_hi = static_cast<const float *>(params[4]);
  const float *k_lo = static_cast<const float *>(params[5]);
  const bool *k_valid = static_cast<const bool *>(params[6]);
  const int32_t *pos_lut = static_cast<const int32_t *>(params[7]);
  const float *thr = static_cast<const float *>(params[8]);
  const float *p = static_cast<const float *>(params[9]);
  int32_t *idx = static_cast<int32_t *>(params[10]);
  const int64_t rows = numel(ndims[0], shapes[0]);
  const int64_t cols = numel(ndims[3], shapes[3]);
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
      for (int64_t hr = r0; hr < r1; ++hr) {
        bias_silu_shared_row(scores + hr * cols, bias.data() + (hr / rows) * cols, keep.data(), out + hr * cols,
                             cols);
      }
    });
    return 0;
  }
  parallel_rows(heads * rows, cols, [&](int64_t r0, int64_t r1) {
    for (int64_t hr = r0; hr < r1; ++hr) {
      const int64_t h = hr / rows, r = hr % rows;
      bias_silu_row(scores + hr * cols, idx + r * cols, table + h * table_cols, out + hr * cols, cols, mask);
    }
  });
  return 0;
}

}  // extern "C"
