// SIMD helpers shared by our CPU kernels: GCC/Clang vector extensions, not intrinsics, so the same code
// compiles to AVX2 here and to NEON on ARM.
#pragma once

#include <torch/extension.h>

#include <cstring>

namespace kvchat {

constexpr int64_t kLanes = 8;  // floats per vector: one AVX2 register (wider types compile to poor code)

typedef float vfloat __attribute__((vector_size(kLanes * sizeof(float))));

typedef uint16_t vhalfword __attribute__((vector_size(kLanes * sizeof(uint16_t))));
typedef uint32_t vword __attribute__((vector_size(kLanes * sizeof(uint32_t))));

// Loads straight into a vector: a copy through a scalar array would stall on store forwarding.
template <typename T>
inline vfloat load_lanes(const T* source) {
  float values[kLanes];
  for (int64_t i = 0; i < kLanes; ++i) values[i] = static_cast<float>(source[i]);
  vfloat v;
  std::memcpy(&v, values, sizeof(v));
  return v;
}

template <>
inline vfloat load_lanes<float>(const float* source) {
  vfloat v;
  std::memcpy(&v, source, sizeof(v));
  return v;
}

template <>
inline vfloat load_lanes<c10::BFloat16>(const c10::BFloat16* source) {
  vhalfword bits;
  std::memcpy(&bits, source, sizeof(bits));
  const vword widened = __builtin_convertvector(bits, vword) << 16;  // bf16 is a float's top half
  vfloat v;
  std::memcpy(&v, &widened, sizeof(v));
  return v;
}

inline float horizontal_sum(vfloat v) {
  float values[kLanes];
  std::memcpy(values, &v, sizeof(v));
  float sum = 0;
  for (int64_t i = 0; i < kLanes; ++i) sum += values[i];
  return sum;
}

}  // namespace kvchat
