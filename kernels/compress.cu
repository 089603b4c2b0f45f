// 1-bit gradient compression with error feedback (design 001; src/engine/compression.rs is
// the host implementation and the reference): per block of `block` consecutive values (0:
// the whole tensor is one block), v = x + residual, a scale s (L1 form: ||v||_1 / d; L2
// form: lambda * ||v||_2 / sqrt(d), d the block's length), the signs of v as bits (bit b of
// word w is value 32 w + b, set when v >= 0), and residual = v - s sign(v). An encoding is
// `scales` words holding the scales' f32 bits, then ceil(n / 32) words of bits.
// No shared memory: with blocks, thread p sums block p in order; without, `parts` threads
// sum values p, p + parts, ... in order (in double) and one thread sums the parts in order.

// residual[i] += x[i] (v, kept in the residual) and each part's (block's) sum of |v|
// (l1 != 0) or v * v, as the bits of a double in two words: partial[2p] low, [2p + 1] high.
extern "C" __global__ void onebit_norms(const float* __restrict__ x, float* __restrict__ residual, u32* __restrict__ partial, int n, int parts, int l1, int block) {
    for (long long p = RR_TID; p < parts; p += RR_STRIDE) {
        double acc = 0.0;
        long long start = block > 0 ? p * block : p;
        long long end = block > 0 ? (start + block < n ? start + block : n) : n;
        long long step = block > 0 ? 1 : parts;
        for (long long i = start; i < end; i += step) {
            float v = residual[i] + x[i];
            residual[i] = v;
            acc += l1 ? (double)fabsf(v) : (double)v * (double)v;
        }
        union { double d; unsigned long long u; } c;
        c.d = acc;
        partial[2 * p] = (u32)(c.u & 0xffffffffull);
        partial[2 * p + 1] = (u32)(c.u >> 32);
    }
}

static __device__ __forceinline__ double rr_part(const u32* partial, long long p) {
    union { double d; unsigned long long u; } c;
    c.u = (unsigned long long)partial[2 * p] | ((unsigned long long)partial[2 * p + 1] << 32);
    return c.d;
}

// The scales, as f32 bits into enc[0 ..]: with blocks, scale t from part t (one thread
// each); without, one thread sums the parts in order.
extern "C" __global__ void onebit_scale(const u32* __restrict__ partial, u32* __restrict__ enc, int n, int parts, int l1, float lambda, int block) {
    const long long scales = block > 0 ? parts : 1;
    for (long long t = RR_TID; t < scales; t += RR_STRIDE) {
        double sum = 0.0;
        long long d = n;
        if (block > 0) {
            sum = rr_part(partial, t);
            d = n - t * block < block ? n - t * block : block;
        } else {
            for (int p = 0; p < parts; ++p) sum += rr_part(partial, p);
        }
        float s = 0.0f;
        if (d > 0) s = l1 ? (float)(sum / (double)d) : lambda * (float)sqrt(sum / (double)d);
        enc[t] = f32_bits(s);
    }
}

// Word w of the signs (values 32 w .. 32 w + 31) after the `scales` scale words, and the
// residual of each value.
extern "C" __global__ void onebit_pack(float* __restrict__ residual, u32* __restrict__ enc, int n, int block, int scales) {
    const long long words = ((long long)n + 31) / 32;
    for (long long w = RR_TID; w < words; w += RR_STRIDE) {
        u32 bits = 0;
        for (int b = 0; b < 32; ++b) {
            long long i = 32 * w + b;
            if (i >= n) break;
            const float s = bits_f32(enc[block > 0 ? i / block : 0]);
            float v = residual[i];
            if (v >= 0.0f) {
                bits |= 1u << b;
                residual[i] = v - s;
            } else {
                residual[i] = v + s;
            }
        }
        enc[scales + w] = bits;
    }
}

// x[i] = the sum over ranks r, in rank order from 0, of rank r's decoded value i, divided by
// `ranks` when `average`; rank r's encoding of this tensor starts at word r * stride + at of
// `gathered`.
extern "C" __global__ void onebit_unpack_sum(const u32* __restrict__ gathered, float* __restrict__ x, int n, int ranks, long long stride, long long at, int average, int block, int scales) {
    for (long long i = RR_TID; i < n; i += RR_STRIDE) {
        float acc = 0.0f;
        for (int r = 0; r < ranks; ++r) {
            const u32* e = gathered + (long long)r * stride + at;
            float s = bits_f32(e[block > 0 ? i / block : 0]);
            if ((e[scales + i / 32] >> (i % 32)) & 1u) acc += s;
            else acc -= s;
        }
        x[i] = average ? acc / (float)ranks : acc;
    }
}
