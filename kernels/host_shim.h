// Compiles the CUDA C kernels of this folder as host C++ (tests: src/device/host_kernels.rs).
// The launch geometry is a set of globals the caller sets before calling a kernel once per
// (block, thread); kernels are grid-stride loops without shared memory, so a sequential
// walk over the threads computes exactly what the GPU does.
#include <math.h>
#include <stddef.h>
#include <type_traits>
#include <utility>
struct rr_dim3 { unsigned x, y, z; };
extern "C" { rr_dim3 threadIdx, blockIdx, blockDim, gridDim; }
#define __global__
#define __device__
#define __forceinline__ inline

// Calls kernel `f` with its arguments given as cuLaunchKernel takes them: an array of
// pointers, one to each argument's value.
template <typename... A, size_t... I>
static void rr_invoke_(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*static_cast<typename std::remove_reference<A>::type*>(args[I])...);
}
template <typename... A>
static void rr_invoke(void (*f)(A...), void** args) {
    rr_invoke_(f, args, std::index_sequence_for<A...>{});
}
// CUDA's correctly rounded single operations (kernels/cache.cu): plain IEEE operations in a
// host build, which compiles with -ffp-contract=off.
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
