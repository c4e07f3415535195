// SIMD helpers shared by our CPU kernels: GCC/Clang vector extensions, not intrinsics, so the same code
// compiles to AVX2 here and to NEON on ARM.
#pragma once

#include <torch/extension.h>

#include <cstring>

#ifdef __AVX2__
#include <immintrin.h>
#endif

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

// int8 weights, widened in registers: a sign extension and a conversion per vector.  The one intrinsic
// here: GCC turns __builtin_convertvector from int8 lanes into eight scalar conversions (3.5 GB/s).
template <>
inline vfloat load_lanes<int8_t>(const int8_t* source) {
#ifdef __AVX2__
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(source));
  const __m256 widened = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  vfloat v;
  std::memcpy(&v, &widened, sizeof(v));
  return v;
#else
  float values[kLanes];
  for (int64_t i = 0; i < kLanes; ++i) values[i] = source[i];
  vfloat v;
  std::memcpy(&v, values, sizeof(v));
  return v;
#endif
}

// 2 * kLanes consecutive values as two vectors, for dot products, which do not care in what order their
// terms come as long as both sides share it.  Floats come in order.  bf16 values come as the even- and
// the odd-indexed ones: a shift and a mask per vector, where widening them in order takes four shuffles,
// and a shuffle port that can run only one per cycle left our bf16 matrix product at half the bandwidth.
template <typename T>
inline void load_pair(const T* source, vfloat& first, vfloat& second) {
  first = load_lanes(source);
  second = load_lanes(source + kLanes);
}

template <>
inline void load_pair<c10::BFloat16>(const c10::BFloat16* source, vfloat& first, vfloat& second) {
  vword words;
  std::memcpy(&words, source, sizeof(words));
  const vword even = words << 16, odd = words & 0xffff0000u;  // little-endian: value 2i is word i's low half
  std::memcpy(&first, &even, sizeof(first));
  std::memcpy(&second, &odd, sizeof(second));
}

// A vector of floats into memory, any width.
template <typename V>
inline void store(float* target, V v) {
  std::memcpy(target, &v, sizeof(v));
}

// The widest vector of floats the CPU computes in one instruction, for kernels written for any width
// (decode attention): where AVX-512 is, half the instructions of kLanes for the same work.
#ifdef __AVX512F__
constexpr int64_t kWideLanes = 16;
#else
constexpr int64_t kWideLanes = kLanes;
#endif

typedef float vwide __attribute__((vector_size(kWideLanes * sizeof(float))));
typedef uint16_t vwide_halfword __attribute__((vector_size(kWideLanes * sizeof(uint16_t))));
typedef uint32_t vwide_word __attribute__((vector_size(kWideLanes * sizeof(uint32_t))));

template <typename T>
inline vwide load_wide(const T* source) {
  float values[kWideLanes];
  for (int64_t i = 0; i < kWideLanes; ++i) values[i] = static_cast<float>(source[i]);
  vwide v;
  std::memcpy(&v, values, sizeof(v));
  return v;
}

template <>
inline vwide load_wide<float>(const float* source) {
  vwide v;
  std::memcpy(&v, source, sizeof(v));
  return v;
}

template <>
inline vwide load_wide<c10::BFloat16>(const c10::BFloat16* source) {
  vwide_halfword bits;
  std::memcpy(&bits, source, sizeof(bits));
  const vwide_word widened = __builtin_convertvector(bits, vwide_word) << 16;
  vwide v;
  std::memcpy(&v, &widened, sizeof(v));
  return v;
}

template <>
inline vwide load_wide<int8_t>(const int8_t* source) {
#ifdef __AVX512F__
  const __m512 widened =
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(source))));
  vwide v;
  std::memcpy(&v, &widened, sizeof(v));
  return v;
#else
  const vfloat narrow = load_lanes(source);
  vwide v;
  std::memcpy(&v, &narrow, sizeof(v));
  return v;
#endif
}

typedef int32_t vwide_int __attribute__((vector_size(kWideLanes * sizeof(int32_t))));

// v rounded to bf16 (to nearest, ties to even, as c10::BFloat16 rounds a finite float), still as floats.
inline vwide round_to_bf16(vwide v) {
  vwide_word bits;
  std::memcpy(&bits, &v, sizeof(v));
  bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000u;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

template <typename T>
inline void store_wide(T* target, vwide v);

template <>
inline void store_wide<float>(float* target, vwide v) {
  std::memcpy(target, &v, sizeof(v));
}

template <>
inline void store_wide<c10::BFloat16>(c10::BFloat16* target, vwide v) {
  vwide_word bits;
  v = round_to_bf16(v);
  std::memcpy(&bits, &v, sizeof(v));
  const vwide_halfword top = __builtin_convertvector(bits >> 16, vwide_halfword);
  std::memcpy(target, &top, sizeof(top));
}

inline vwide splat_wide(float x) { return vwide{} + x; }

// e^x for x <= 0 (softmax after subtracting the row maximum), within 2 ulp of std::exp; exactly 0 below
// -87, where float32's normal range ends, so masked (-inf) scores get no weight at all.
inline vwide exp_wide(vwide x) {
  const vwide_int underflow = x < splat_wide(-87.0f);
  x = underflow ? splat_wide(-87.0f) : x;
  // x = n ln2 + r with |r| <= ln2 / 2; the constant rounds x / ln2 to the nearest integer.
  const vwide round = splat_wide(12582912.0f);  // 1.5 * 2^23
  const vwide n = (x * splat_wide(1.44269504f) + round) - round;
  const vwide r = (x - n * splat_wide(0.693359375f)) + n * splat_wide(2.12194440e-4f);
  // Cephes' expf polynomial for e^r.
  vwide p = splat_wide(1.9875691500e-4f);
  p = p * r + splat_wide(1.3981999507e-3f);
  p = p * r + splat_wide(8.3334519073e-3f);
  p = p * r + splat_wide(4.1665795894e-2f);
  p = p * r + splat_wide(1.6666665459e-1f);
  p = p * r + splat_wide(5.0000001201e-1f);
  p = p * r * r + r + splat_wide(1.0f);
  const vwide_int two_to_n = (__builtin_convertvector(n, vwide_int) + 127) << 23;  // a float's exponent bits
  const vwide result = p * (vwide)two_to_n;  // a cast between vector types keeps the bits
  return (vwide)((vwide_int)result & ~underflow);
}

// Calls fn(std::integral_constant<int, n>) with n clamped to [1, MAX], so that a count known only at run
// time can size arrays of accumulators, which stay in registers only when their size is a constant.
template <int MAX, typename Fn>
void with_constant(int64_t n, Fn fn) {
  if constexpr (MAX > 1) {
    if (n < MAX) return with_constant<MAX - 1>(n, fn);
  }
  fn(std::integral_constant<int, MAX>{});
}

// The sum of a vector's lanes, in lane order; V: vfloat or vwide.
template <typename V>
inline float horizontal_sum(V v) {
  float sum = 0;
  for (size_t i = 0; i < sizeof(V) / sizeof(float); ++i) sum += v[i];
  return sum;
}

// The largest of a vector's lanes (NaN lanes aside); V: vfloat or vwide.
template <typename V>
inline float horizontal_max(V v) {
  float largest = -INFINITY;
  for (size_t i = 0; i < sizeof(V) / sizeof(float); ++i) largest = std::max(largest, v[i]);
  return largest;
}

// exp(s - max) in place over s[0:length], and 0 in s[length:padded]; returns the sum, by which the
// caller divides the few products that need normalised probabilities rather than every probability.
// In the widest vectors, with four running maxima: one waited on each comparison before the next, and
// with 8 lanes the softmax took most of prefill attention's time once its products ran on AMX tiles.
inline float softmax_numerators(float* s, int64_t length, int64_t padded) {
  constexpr int kMaxima = 4;
  const int64_t whole = length / kWideLanes * kWideLanes;
  vwide tail = splat_wide(-INFINITY);  // past `length`: exp gives exactly 0
  std::memcpy(&tail, s + whole, (length - whole) * sizeof(float));
  vwide top[kMaxima] = {tail, tail, tail, tail};
  int64_t j = 0;
  for (; j + kMaxima * kWideLanes <= whole; j += kMaxima * kWideLanes)
    for (int i = 0; i < kMaxima; ++i) {
      const vwide v = load_wide(s + j + i * kWideLanes);
      top[i] = v > top[i] ? v : top[i];
    }
  for (; j < whole; j += kWideLanes) {
    const vwide v = load_wide(s + j);
    top[0] = v > top[0] ? v : top[0];
  }
  for (int i = 1; i < kMaxima; ++i) top[0] = top[i] > top[0] ? top[i] : top[0];
  const float maximum = horizontal_max(top[0]);
  vwide sums = {};
  for (j = 0; j < whole; j += kWideLanes) {
    const vwide e = exp_wide(load_wide(s + j) - maximum);
    store(s + j, e);
    sums += e;
  }
  tail = exp_wide(tail - maximum);
  sums += tail;
  std::memcpy(s + whole, &tail, (length - whole) * sizeof(float));
  std::fill(s + length, s + padded, 0.0f);
  return horizontal_sum(sums);
}

}  // namespace kvchat
