// One decoder layer of a decode-only step in one operator: RMSNorm, the QKV projection,
// rotary positions, the new keys and values written to the paged caches, attention over
// each row's blocks, the output projection and residual, RMSNorm, the SwiGLU MLP and
// residual. At decode a layer's arithmetic is small and its Paddle ops (some forty) cost
// more to launch than to run; here a layer is one launch. Beside it, RMSNorm and a residual
// add with the norm after it, each one operator, for the layers of other steps. The projections are int8
// (int8_gemm.h); the rest is float32, as the Paddle ops compute it.
//
// Layouts are the CPU attention ops' (stages/model/attention/ops_cpu.py): keys
// [blocks, kv_heads, head_dim, block_size] (each block's head transposed), values
// [blocks, kv_heads, block_size, head_dim]; q and k heads with each rotary pair's two dims
// side by side (pack_qkv's order), turned by (cos, sin) [rows, head_dim / 2]. The step's
// blocks are the decode metadata's flat list: block_list [NB], block_groups [NB] (each
// block's row), row_slots [NB] (a padding block's is rows * row_width or more) and
// block_bias [NB, block_size] (0 for a filled slot, a large negative number else).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "int8_gemm.h"
#include "paddle/extension.h"

namespace {

struct Int8Linear {
  const int8_t* q;
  const float* scale;
  const float* bias;  // nullptr: none
  int64_t in, out;
};

Int8Linear linear(const paddle::Tensor& q, const paddle::Tensor& scale,
                  const paddle::Tensor& bias) {
  PD_CHECK(q.dtype() == paddle::DataType::INT8, "decode_layer: weights must be int8");
  PD_CHECK(bias.numel() == 0 || bias.numel() == q.shape()[0], "decode_layer: bias size");
  return {q.data<int8_t>(), scale.data<float>(), bias.numel() ? bias.data<float>() : nullptr,
          q.shape()[1], q.shape()[0]};
}

void project(const Int8Linear& w, const float* x, int64_t rows, float* y, int threads) {
  int8_gemm::multiply(x, rows, w.in, w.q, w.scale, y, w.out, threads);
  if (w.bias)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < w.out; ++j) y[r * w.out + j] += w.bias[j];
}

void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t hidden,
              float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * hidden;
    double squares = 0.0;
    for (int64_t i = 0; i < hidden; ++i) squares += double{row[i]} * row[i];
    const float inverse = 1.f / std::sqrt(static_cast<float>(squares / hidden) + eps);
    for (int64_t i = 0; i < hidden; ++i) out[r * hidden + i] = row[i] * inverse * weight[i];
  }
}

void check(const paddle::Tensor& x, const paddle::Tensor& weight) {
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32, "rms_norm_rows: x must be float32");
  PD_CHECK(x.shape().size() == 2, "rms_norm_rows: x must be [rows, hidden]");
  PD_CHECK(weight.numel() == x.shape()[1], "rms_norm_rows: weight must have hidden values");
}

struct Heads {
  int64_t heads, kv_heads, dim;
};

struct Caches {
  float* keys;    // [blocks, kv_heads, dim, block_size]
  float* values;  // [blocks, kv_heads, block_size, dim]
  int64_t block_size;
};

// Each row's q and k heads turned by its (cos, sin), then its k and v written to its slot.
void rotate_and_store(float* qkv, int64_t rows, const Heads& h, const float* cos,
                      const float* sin, const int64_t* slot_blocks, const int64_t* slot_offsets,
                      const Caches& c) {
  const int64_t width = (h.heads + 2 * h.kv_heads) * h.dim, half = h.dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = qkv + r * width;
    for (int64_t head = 0; head < h.heads + h.kv_heads; ++head)
      for (int64_t i = 0; i < half; ++i) {
        float* pair = row + head * h.dim + 2 * i;
        const float a = pair[0], b = pair[1], turn_c = cos[r * half + i], turn_s = sin[r * half + i];
        pair[0] = a * turn_c - b * turn_s;
        pair[1] = a * turn_s + b * turn_c;
      }
    const int64_t block = slot_blocks[r], offset = slot_offsets[r], bs = c.block_size;
    const float* k = row + h.heads * h.dim;
    const float* v = k + h.kv_heads * h.dim;
    for (int64_t g = 0; g < h.kv_heads; ++g) {
      float* key_block = c.keys + (block * h.kv_heads + g) * h.dim * bs;
      float* value_row = c.values + ((block * h.kv_heads + g) * bs + offset) * h.dim;
      for (int64_t d = 0; d < h.dim; ++d) {
        key_block[d * bs + offset] = k[g * h.dim + d];
        value_row[d] = v[g * h.dim + d];
      }
    }
  }
}

struct Blocks {
  const int64_t* list;
  const int64_t* groups;
  const int64_t* places;
  const float* bias;  // [count, block_size]
  int64_t count, padding_place;
};

// out[r, head] = softmax(q . keys / sqrt(dim) + bias) @ values over row r's blocks, with a
// running maximum (one pass over the blocks).
void attend(const float* qkv, int64_t rows, const Heads& h, const Caches& c, const Blocks& b,
            float* out, int threads) {
  const int64_t width = (h.heads + 2 * h.kv_heads) * h.dim, bs = c.block_size;
  const int64_t group = h.heads / h.kv_heads;
  const float scale = 1.f / std::sqrt(static_cast<float>(h.dim));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t task = 0; task < rows * h.heads; ++task) {
    const int64_t r = task / h.heads, head = task % h.heads, g = head / group;
    const float* q = qkv + r * width + head * h.dim;
    std::vector<float> acc(h.dim, 0.f), scores(bs);
    float peak = -INFINITY, total = 0.f;
    for (int64_t i = 0; i < b.count; ++i) {
      if (b.groups[i] != r || b.places[i] >= b.padding_place) continue;
      const int64_t block = b.list[i];
      const float* keys = c.keys + (block * h.kv_heads + g) * h.dim * bs;
      const float* values = c.values + (block * h.kv_heads + g) * bs * h.dim;
      for (int64_t s = 0; s < bs; ++s) scores[s] = 0.f;
      for (int64_t d = 0; d < h.dim; ++d)
        for (int64_t s = 0; s < bs; ++s) scores[s] += q[d] * keys[d * bs + s];
      float block_peak = -INFINITY;
      for (int64_t s = 0; s < bs; ++s) {
        scores[s] = scores[s] * scale + b.bias[i * bs + s];
        block_peak = std::max(block_peak, scores[s]);
      }
      const float new_peak = std::max(peak, block_peak);
      const float shrink = std::exp(peak - new_peak);
      total *= shrink;
      for (int64_t d = 0; d < h.dim; ++d) acc[d] *= shrink;
      for (int64_t s = 0; s < bs; ++s) {
        const float p = std::exp(scores[s] - new_peak);
        total += p;
        for (int64_t d = 0; d < h.dim; ++d) acc[d] += p * values[s * h.dim + d];
      }
      peak = new_peak;
    }
    float* o = out + r * h.heads * h.dim + head * h.dim;
    for (int64_t d = 0; d < h.dim; ++d) o[d] = total > 0.f ? acc[d] / total : 0.f;
  }
}

const int64_t* index_data(const paddle::Tensor& t, const char* name) {
  PD_CHECK(t.dtype() == paddle::DataType::INT64, "decode_layer: ", name, " must be int64");
  return t.data<int64_t>();
}

}  // namespace

std::vector<paddle::Tensor> DecodeLayer(
    const paddle::Tensor& h, const paddle::Tensor& attn_norm, const paddle::Tensor& qkv_q,
    const paddle::Tensor& qkv_scale, const paddle::Tensor& qkv_bias, const paddle::Tensor& out_q,
    const paddle::Tensor& out_scale, const paddle::Tensor& out_bias,
    const paddle::Tensor& mlp_norm, const paddle::Tensor& gate_up_q,
    const paddle::Tensor& gate_up_scale, const paddle::Tensor& gate_up_bias,
    const paddle::Tensor& down_q, const paddle::Tensor& down_scale,
    const paddle::Tensor& down_bias, const paddle::Tensor& cos, const paddle::Tensor& sin,
    paddle::Tensor& k_cache, paddle::Tensor& v_cache, const paddle::Tensor& slot_blocks,
    const paddle::Tensor& slot_offsets, const paddle::Tensor& block_list,
    const paddle::Tensor& block_groups, const paddle::Tensor& row_slots,
    const paddle::Tensor& block_bias, int heads, int kv_heads, int padding_place, float eps,
    int threads) {
  PD_CHECK(h.dtype() == paddle::DataType::FLOAT32 && h.shape().size() == 2,
           "decode_layer: h must be float32 [rows, hidden]");
  const int64_t rows = h.shape()[0], hidden = h.shape()[1];
  const Heads hd{heads, kv_heads, k_cache.shape()[2]};
  const Caches caches{k_cache.data<float>(), v_cache.data<float>(), k_cache.shape()[3]};
  const Int8Linear qkv = linear(qkv_q, qkv_scale, qkv_bias);
  const Int8Linear out = linear(out_q, out_scale, out_bias);
  const Int8Linear gate_up = linear(gate_up_q, gate_up_scale, gate_up_bias);
  const Int8Linear down = linear(down_q, down_scale, down_bias);
  PD_CHECK(qkv.out == (hd.heads + 2 * hd.kv_heads) * hd.dim && qkv.in == hidden,
           "decode_layer: QKV weight's shape");
  PD_CHECK(cos.numel() == rows * hd.dim / 2 && sin.numel() == cos.numel(),
           "decode_layer: cos and sin must be [rows, head_dim / 2]");
  const Blocks blocks{index_data(block_list, "block_list"), index_data(block_groups, "block_groups"),
                      index_data(row_slots, "row_slots"), block_bias.data<float>(),
                      block_list.numel(), padding_place};
  PD_CHECK(block_bias.numel() == blocks.count * caches.block_size, "decode_layer: block_bias");

  auto result = paddle::empty({rows, hidden}, paddle::DataType::FLOAT32, h.place());
  float* hs = result.data<float>();
  std::copy(h.data<float>(), h.data<float>() + rows * hidden, hs);
  const int64_t inter = gate_up.out / 2;
  std::vector<float> x(rows * hidden), qkv_rows(rows * qkv.out);
  std::vector<float> attended(rows * hd.heads * hd.dim), projected(rows * hidden);
  std::vector<float> gated(rows * gate_up.out), act(rows * inter);

  rms_norm(hs, attn_norm.data<float>(), x.data(), rows, hidden, eps);
  project(qkv, x.data(), rows, qkv_rows.data(), threads);
  rotate_and_store(qkv_rows.data(), rows, hd, cos.data<float>(), sin.data<float>(),
                   index_data(slot_blocks, "slot_blocks"), index_data(slot_offsets, "slot_offsets"),
                   caches);
  attend(qkv_rows.data(), rows, hd, caches, blocks, attended.data(), threads);
  project(out, attended.data(), rows, projected.data(), threads);
  for (int64_t i = 0; i < rows * hidden; ++i) hs[i] += projected[i];

  rms_norm(hs, mlp_norm.data<float>(), x.data(), rows, hidden, eps);
  project(gate_up, x.data(), rows, gated.data(), threads);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < inter; ++j) {
      const float gate = gated[r * gate_up.out + j], up = gated[r * gate_up.out + inter + j];
      act[r * inter + j] = gate / (1.f + std::exp(-gate)) * up;
    }
  project(down, act.data(), rows, projected.data(), threads);
  for (int64_t i = 0; i < rows * hidden; ++i) hs[i] += projected[i];
  return {result};
}

PD_BUILD_OP(decode_layer)
    .Inputs({"H", "AttnNorm", "QkvQ", "QkvScale", "QkvBias", "OutQ", "OutScale", "OutBias",
             "MlpNorm", "GateUpQ", "GateUpScale", "GateUpBias", "DownQ", "DownScale",
             "DownBias", "Cos", "Sin", "KCache", "VCache", "SlotBlocks", "SlotOffsets",
             "BlockList", "BlockGroups", "RowSlots", "BlockBias"})
    .Outputs({"Out", "KCacheOut", "VCacheOut"})
    .SetInplaceMap({{"KCache", "KCacheOut"}, {"VCache", "VCacheOut"}})
    .Attrs({"heads: int", "kv_heads: int", "padding_place: int", "eps: float", "threads: int"})
    .SetKernelFn(PD_KERNEL(DecodeLayer));

// The norms alone, for the steps decode_layer does not take (prefills, mixed steps).
std::vector<paddle::Tensor> RmsNorm(const paddle::Tensor& x, const paddle::Tensor& weight,
                                    float eps) {
  check(x, weight);
  auto out = paddle::empty(x.shape(), paddle::DataType::FLOAT32, x.place());
  rms_norm(x.data<float>(), weight.data<float>(), out.data<float>(), x.shape()[0],
            x.shape()[1], eps);
  return {out};
}

// (h + a, RMSNorm(h + a)): a layer's residual add and the next norm.
std::vector<paddle::Tensor> AddRmsNorm(const paddle::Tensor& h, const paddle::Tensor& a,
                                       const paddle::Tensor& weight, float eps) {
  check(h, weight);
  PD_CHECK(a.shape() == h.shape() && a.dtype() == h.dtype(), "add_rms_norm_rows: h and a differ");
  auto sum = paddle::empty(h.shape(), paddle::DataType::FLOAT32, h.place());
  auto out = paddle::empty(h.shape(), paddle::DataType::FLOAT32, h.place());
  const float* hs = h.data<float>();
  const float* as = a.data<float>();
  float* sums = sum.data<float>();
  for (int64_t i = 0; i < h.numel(); ++i) sums[i] = hs[i] + as[i];
  rms_norm(sums, weight.data<float>(), out.data<float>(), h.shape()[0], h.shape()[1], eps);
  return {sum, out};
}

PD_BUILD_OP(rms_norm_rows)
    .Inputs({"X", "Weight"})
    .Outputs({"Out"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(RmsNorm));

PD_BUILD_OP(add_rms_norm_rows)
    .Inputs({"H", "A", "Weight"})
    .Outputs({"Sum", "Out"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(AddRmsNorm));
