// Prelude of every ringrec kernel source (prepended by src/device/kernels.rs before NVRTC
// compiles it). Kernels are plain CUDA C with no #include, so NVRTC needs no header
// search path, and grid-stride loops with no shared memory or __syncthreads, so the same
// sources also compile as C++ on the host (kernels/host_shim.h) where the tests run them
// thread by thread against the CPU implementation.
typedef unsigned short u16;
typedef unsigned int u32;

// The global thread index and the grid's thread count (grid-stride loops).
#define RR_TID ((long long)blockIdx.x * blockDim.x + threadIdx.x)
#define RR_STRIDE ((long long)blockDim.x * gridDim.x)
// An f32's bits and back (casts, 1-bit scales), for every source.
static __device__ __forceinline__ u32 f32_bits(float f) { union { float f; u32 u; } c; c.f = f; return c.u; }
static __device__ __forceinline__ float bits_f32(u32 u) { union { float f; u32 u; } c; c.u = u; return c.f; }
