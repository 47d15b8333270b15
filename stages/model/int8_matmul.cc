// The int8 matmul operator: int8_gemm.h's product on a step's rows. Built at first use by
// stages/model/int8_weight.py, for the machine it runs on.
#include <cstdint>
#include <vector>

#include "int8_gemm.h"
#include "paddle/extension.h"

std::vector<paddle::Tensor> Int8MatmulForward(const paddle::Tensor& x, const paddle::Tensor& q,
                                              const paddle::Tensor& scale, int threads) {
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32, "int8_matmul: x must be float32");
  PD_CHECK(q.dtype() == paddle::DataType::INT8, "int8_matmul: q must be int8");
  PD_CHECK(x.shape().size() == 2 && q.shape().size() == 2, "int8_matmul: 2-D operands");
  const int64_t n = x.shape()[0], k = x.shape()[1], cols = q.shape()[0];
  PD_CHECK(q.shape()[1] == k, "int8_matmul: x's columns and q's differ");
  auto y = paddle::empty({n, cols}, paddle::DataType::FLOAT32, x.place());
  int8_gemm::multiply(x.data<float>(), n, k, q.data<int8_t>(), scale.data<float>(),
                      y.data<float>(), cols, threads);
  return {y};
}

PD_BUILD_OP(int8_matmul)
    .Inputs({"X", "Q", "Scale"})
    .Outputs({"Out"})
    .Attrs({"threads: int"})
    .SetKernelFn(PD_KERNEL(Int8MatmulForward));
