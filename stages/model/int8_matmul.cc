// y[n, N] = (x[n, K] @ q[N, K]^T) * scale[N]: weights stored as int8 rows, one float32
// scale per output. Each int8 row is widened to float once, into a buffer that stays in
// L1, and multiplied with every input row there: the weights' bytes are read once a call,
// a quarter of float32's. Built at first use by stages/model/int8_weight.py.
#include <cstdint>
#include <vector>

#include "paddle/extension.h"

std::vector<paddle::Tensor> Int8MatmulForward(const paddle::Tensor& x, const paddle::Tensor& q,
                                              const paddle::Tensor& scale) {
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32, "int8_matmul: x must be float32");
  PD_CHECK(q.dtype() == paddle::DataType::INT8, "int8_matmul: q must be int8");
  PD_CHECK(x.shape().size() == 2 && q.shape().size() == 2, "int8_matmul: 2-D operands");
  const int64_t n = x.shape()[0], k = x.shape()[1], cols = q.shape()[0];
  PD_CHECK(q.shape()[1] == k, "int8_matmul: x's columns and q's differ");
  auto y = paddle::empty({n, cols}, paddle::DataType::FLOAT32, x.place());
  const float* xs = x.data<float>();
  const int8_t* qs = q.data<int8_t>();
  const float* scales = scale.data<float>();
  float* ys = y.data<float>();
  std::vector<float> row(k);
  for (int64_t j = 0; j < cols; ++j) {
    const int8_t* qr = qs + j * k;
    for (int64_t i = 0; i < k; ++i) row[i] = static_cast<float>(qr[i]);
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = xs + r * k;
      float acc = 0.f;
      for (int64_t i = 0; i < k; ++i) acc += xr[i] * row[i];
      ys[r * cols + j] = acc * scales[j];
    }
  }
  return {y};
}

PD_BUILD_OP(int8_matmul)
    .Inputs({"X", "Q", "Scale"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(Int8MatmulForward));
