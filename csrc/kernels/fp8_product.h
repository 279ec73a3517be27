// One scaled FP8 element: decode(w) * scale, ONE float32 multiply (the
// kernels are built with -ffp-contract=off). When both factors are NaN, IEEE
// leaves open which NaN the product is, and compilers may swap the operands
// of a multiply: the weight's NaN is returned then, so the scalar and vector
// paths (which multiply the decoded weight first: x86 and AArch64 return the
// first operand's NaN) write the same bits on every build.
#pragma once

namespace hf2q::kernels {
namespace {

inline float fp8_product(float w, float scale) { return w != w ? w : w * scale; }

}  // namespace
}  // namespace hf2q::kernels
