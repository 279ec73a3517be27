// AVX2 helpers shared by the translation units compiled with -mavx2 -mf16c
// (x86_avx2.cpp, fp8_avx2.cpp); include it from those files only.
#pragma once

#include <immintrin.h>

namespace hf2q::kernels::avx2_common {

// Horizontal max of each of eight vectors, as one vector: element k = max(m[k]).
inline __m256 hmax8(const __m256 m[8]) {
  const __m256 a01 = _mm256_max_ps(_mm256_unpacklo_ps(m[0], m[1]), _mm256_unpackhi_ps(m[0], m[1]));
  const __m256 a23 = _mm256_max_ps(_mm256_unpacklo_ps(m[2], m[3]), _mm256_unpackhi_ps(m[2], m[3]));
  const __m256 a45 = _mm256_max_ps(_mm256_unpacklo_ps(m[4], m[5]), _mm256_unpackhi_ps(m[4], m[5]));
  const __m256 a67 = _mm256_max_ps(_mm256_unpacklo_ps(m[6], m[7]), _mm256_unpackhi_ps(m[6], m[7]));
  const __m256 b03 = _mm256_max_ps(_mm256_shuffle_ps(a01, a23, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(a01, a23, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 b47 = _mm256_max_ps(_mm256_shuffle_ps(a45, a67, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(a45, a67, _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_max_ps(_mm256_permute2f128_ps(b03, b47, 0x20), _mm256_permute2f128_ps(b03, b47, 0x31));
}

}  // namespace hf2q::kernels::avx2_common
