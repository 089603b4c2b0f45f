// f32 <-> f16 / bf16 casts on raw bits (no cuda_fp16.h, so NVRTC needs no include path):
// round to nearest, ties to even, NaN kept quiet, as the `half` crate converts on the CPU.
// Used for compressed gradient allreduce over NCCL (RINGREC_COMPRESSION=fp16|bf16).

static __device__ __forceinline__ u16 to_bf16(float f) {
    u32 u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

static __device__ __forceinline__ u16 to_f16(float f) {
    u32 x = f32_bits(f);
    u32 sign = (x >> 16) & 0x8000u;
    u32 exp = (x >> 23) & 0xffu;
    u32 man = x & 0x7fffffu;
    if (exp == 0xffu) return (u16)(sign | 0x7c00u | (man ? (0x0200u | (man >> 13)) : 0u));
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f) return (u16)(sign | 0x7c00u);
    if (e <= 0) {
        if (14 - e > 24) return (u16)sign;
        man |= 0x800000u;
        u32 shift = (u32)(14 - e);
        u32 half_man = man >> shift;
        u32 round_bit = 1u << (shift - 1);
        if ((man & round_bit) && (man & (3u * round_bit - 1u))) half_man++;
        return (u16)(sign | half_man);
    }
    u32 h = sign | ((u32)e << 10) | (man >> 13);
    if ((x & 0x1000u) && (x & 0x2fffu)) h++;
    return (u16)h;
}

static __device__ __forceinline__ float from_f16(u16 h) {
    u32 sign = ((u32)h & 0x8000u) << 16;
    u32 exp = ((u32)h >> 10) & 0x1fu;
    u32 man = (u32)h & 0x3ffu;
    if (exp == 0x1fu) return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);
        int e = -1;
        do { e++; man <<= 1; } while ((man & 0x400u) == 0);
        return bits_f32(sign | ((u32)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13));
    }
    return bits_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

extern "C" __global__ void f32_to_f16(const float* __restrict__ src, u16* __restrict__ dst, long long n) {
    for (long long i = RR_TID; i < n; i += RR_STRIDE) dst[i] = to_f16(src[i]);
}
extern "C" __global__ void f32_to_bf16(const float* __restrict__ src, u16* __restrict__ dst, long long n) {
    for (long long i = RR_TID; i < n; i += RR_STRIDE) dst[i] = to_bf16(src[i]);
}
extern "C" __global__ void f16_to_f32(const u16* __restrict__ src, float* __restrict__ dst, long long n) {
    for (long long i = RR_TID; i < n; i += RR_STRIDE) dst[i] = from_f16(src[i]);
}
extern "C" __global__ void bf16_to_f32(const u16* __restrict__ src, float* __restrict__ dst, long long n) {
    for (long long i = RR_TID; i < n; i += RR_STRIDE) dst[i] = bits_f32((u32)src[i] << 16);
}
