#include "dtypes.h"

#include <array>
#include <utility>

namespace etmlx::native {

namespace {

// Indexed by etmlx_ir::DType.
constexpr std::array<mx::Dtype, 10> kIrDtypes = {
    mx::bool_, mx::uint8,   mx::int8,     mx::int16,   mx::int32,
    mx::int64, mx::float16, mx::bfloat16, mx::float32, mx::uint32,
};
static_assert(kIrDtypes.size() == static_cast<size_t>(etmlx_ir::DType::MAX) + 1);

constexpr std::array<std::pair<ScalarType, mx::Dtype>, 9> kScalarTypes = {{
    {ScalarType::Bool, mx::bool_},
    {ScalarType::Byte, mx::uint8},
    {ScalarType::Char, mx::int8},
    {ScalarType::Short, mx::int16},
    {ScalarType::Int, mx::int32},
    {ScalarType::Long, mx::int64},
    {ScalarType::Half, mx::float16},
    {ScalarType::BFloat16, mx::bfloat16},
    {ScalarType::Float, mx::float32},
}};

}  // namespace

mx::Dtype mlx_dtype(etmlx_ir::DType dtype) {
  return kIrDtypes.at(static_cast<size_t>(dtype));
}

std::optional<mx::Dtype> mlx_dtype(ScalarType type) {
  for (const auto& [scalar_type, dtype] : kScalarTypes) {
    if (scalar_type == type) {
      return dtype;
    }
  }
  return std::nullopt;
}

std::optional<etmlx_ir::DType> ir_dtype(mx::Dtype dtype) {
  for (size_t i = 0; i < kIrDtypes.size(); ++i) {
    if (kIrDtypes[i] == dtype) {
      return static_cast<etmlx_ir::DType>(i);
    }
  }
  return std::nullopt;
}

std::string dtype_name(mx::Dtype dtype) {
  const auto known = ir_dtype(dtype);
  return known ? etmlx_ir::EnumNameDType(*known) : "dtype " + std::to_string(static_cast<int>(dtype.val()));
}

}  // namespace etmlx::native
