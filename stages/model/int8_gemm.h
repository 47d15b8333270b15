// The int8 weight-only matrix product shared by the operators (int8_matmul.cc,
// decode_layer.cc): y[n, N] = (x[n, K] @ q[N, K]^T) * scale[N], weights stored as int8
// rows with one float32 scale per output. A decode step reads every weight once and does
// little arithmetic with it, so its time follows the weights' bytes: int8 reads a quarter
// of float32's. Each input row is rounded to 16-bit levels and the products summed in
// integers (AVX512-VNNI's vpdpwssd: 32 products and sums an instruction, no conversion of
// the weights to float). The outputs are split between `threads` threads; each takes four
// weight rows at a time and multiplies them with up to four input rows at once, so that a
// step of several rows reads the weights once, not once a row. A scalar path, where the
// machine lacks AVX512-VNNI or K is no multiple of 32, computes the same integers.
#pragma once

#include <omp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace int8_gemm {

constexpr int kRowsPerTile = 4;    // weight rows widened together
constexpr int kInputsPerTile = 4;  // input rows multiplied with them at once
constexpr int kLanes = 32;         // 16-bit values in a 512-bit register
constexpr int kPrefetchTiles = 8;  // how far ahead the weights are fetched
constexpr int64_t kInputBlock = 64;  // input rows multiplied with every weight row in turn

struct Operands {
  const int16_t* x;     // [n, k]: the inputs rounded to 16-bit levels
  const float* x_step;  // [n]: each input row's level
  const int8_t* q;      // [cols, k]
  const float* scale;   // [cols]
  float* y;             // [n, cols]
  int64_t k, cols;
};

// The largest level an input takes: an int32 lane of the integer dot product sums k / 16
// products of an int8 weight and a level, and must not overflow.
inline int32_t input_levels(int64_t k) {
  const int64_t bound = (int64_t{INT32_MAX} * 16) / (127 * std::max<int64_t>(k, 16));
  return static_cast<int32_t>(std::min<int64_t>(32767, bound));
}

// Each row of x rounded to the nearest of 2 * levels + 1 steps spanning its largest magnitude.
inline void round_inputs(const float* x, int64_t n, int64_t k, int16_t* levels, float* steps) {
  const float top = static_cast<float>(input_levels(k));
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x + r * k;
    float peak = 0.f;
    for (int64_t i = 0; i < k; ++i) peak = std::max(peak, std::fabs(row[i]));
    const float step = peak > 0.f ? peak / top : 1.f, inverse = 1.f / step;
    for (int64_t i = 0; i < k; ++i)
      levels[r * k + i] = static_cast<int16_t>(std::nearbyint(row[i] * inverse));
    steps[r] = step;
  }
}

// One output of one row, in exact integers: the path where k is no multiple of the vector's
// lanes or the machine has no AVX512-VNNI (the vector path sums the same integers).
inline void output(const Operands& o, int64_t j, int64_t r) {
  int64_t dot = 0;
  for (int64_t i = 0; i < o.k; ++i) dot += int64_t{o.q[j * o.k + i]} * o.x[r * o.k + i];
  o.y[r * o.cols + j] = static_cast<float>(dot) * o.x_step[r] * o.scale[j];
}

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
// Outputs j..j+J-1 of input rows r..r+R-1: J * R integer accumulators in registers (the
// loops fully unrolled, so that GCC keeps the arrays out of memory); 32 weights widened to
// 16 bits with one instruction, multiplied and summed in pairs into the accumulators with
// another (AVX512-VNNI), each widened weight used for all R rows.
template <int J, int R>
void tile(const Operands& o, int64_t j, int64_t r) {
  const int64_t k = o.k;  // a multiple of kLanes (int8_matmul takes the other path else)
  const int8_t* qr = o.q + j * k;
  const int16_t* xr = o.x + r * k;
  __m512i acc[J * R];
#pragma GCC unroll 16
  for (int c = 0; c < J * R; ++c) acc[c] = _mm512_setzero_si512();
  // The weights' rows are one stream, but a tile's rows are too short for the hardware
  // to see it: the tile kPrefetchTiles ahead is asked for meanwhile, J / 2 lines a step.
  const char* ahead = reinterpret_cast<const char*>(qr + kPrefetchTiles * J * k);
  for (int64_t i = 0; i < k; i += kLanes, ahead += J * kLanes) {
#pragma GCC unroll 16
    for (int line = 0; line < J * kLanes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T2);
    __m512i w[J];
#pragma GCC unroll 16
    for (int a = 0; a < J; ++a)
      w[a] = _mm512_cvtepi8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qr + a * k + i)));
#pragma GCC unroll 16
    for (int b = 0; b < R; ++b) {
      const __m512i xv = _mm512_loadu_si512(xr + b * k + i);
#pragma GCC unroll 16
      for (int a = 0; a < J; ++a) acc[a * R + b] = _mm512_dpwssd_epi32(acc[a * R + b], w[a], xv);
    }
  }
#pragma GCC unroll 16
  for (int c = 0; c < J * R; ++c) {
    const int64_t a = c / R, b = c % R;
    const float dot = _mm512_reduce_add_ps(_mm512_cvtepi32_ps(acc[c]));
    o.y[(r + b) * o.cols + j + a] = dot * o.x_step[r + b] * o.scale[j + a];
  }
}
constexpr bool kVectorised = true;
#else
template <int J, int R>
void tile(const Operands& o, int64_t j, int64_t r) {
  for (int a = 0; a < J; ++a)
    for (int b = 0; b < R; ++b) output(o, j + a, r + b);
}
constexpr bool kVectorised = false;
#endif

// Outputs j..j+J-1 of input rows [first, end).
template <int J>
void rows_tile(const Operands& o, int64_t j, int64_t first, int64_t end) {
  int64_t r = first;
  for (; r + kInputsPerTile <= end; r += kInputsPerTile) tile<J, kInputsPerTile>(o, j, r);
  switch (end - r) {
    case 3: tile<J, 3>(o, j, r); break;
    case 2: tile<J, 2>(o, j, r); break;
    case 1: tile<J, 1>(o, j, r); break;
    default: break;
  }
}

// Outputs [first, end) of every input row, kInputBlock rows at a time: a block's inputs
// stay in cache while every weight row passes (a prefill's thousands of rows would not).
inline void outputs(const Operands& o, int64_t n, int64_t first, int64_t end) {
  if (!kVectorised || o.k % kLanes) {
    for (int64_t j = first; j < end; ++j)
      for (int64_t r = 0; r < n; ++r) output(o, j, r);
    return;
  }
  for (int64_t block = 0; block < n; block += kInputBlock) {
    const int64_t block_end = std::min(n, block + kInputBlock);
    int64_t j = first;
    for (; j + kRowsPerTile <= end; j += kRowsPerTile)
      rows_tile<kRowsPerTile>(o, j, block, block_end);
    for (; j < end; ++j) rows_tile<1>(o, j, block, block_end);
  }
}

// y = x @ (q * scale)^T for x [n, k] float32, on `threads` threads.
inline void multiply(const float* x, int64_t n, int64_t k, const int8_t* q, const float* scale,
                     float* y, int64_t cols, int threads) {
  std::vector<int16_t> levels(n * k);
  std::vector<float> steps(n);
  round_inputs(x, n, k, levels.data(), steps.data());
  const Operands o{levels.data(), steps.data(), q, scale, y, k, cols};
  // Each thread's share of the outputs is a whole number of tiles.
  const int64_t tiles = (cols + kRowsPerTile - 1) / kRowsPerTile;
  const int workers = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, tiles)));
#pragma omp parallel num_threads(workers)
  {
    const int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
    const int64_t first = std::min(cols, tiles * t / count * kRowsPerTile);
    const int64_t end = std::min(cols, tiles * (t + 1) / count * kRowsPerTile);
    outputs(o, n, first, end);
  }
}

}  // namespace int8_gemm

