// 1-bit gradient compression with error feedback (design 001; src/engine/compression.rs is
// the host implementation and the reference): per tensor of n values, v = x + residual, a
// scale s (L1 form: ||v||_1 / n; L2 form: lambda * ||v||_2 / sqrt(n)), the signs of v as
// bits (bit i of word w is value 32 w + i, set when v >= 0), and residual = v - s sign(v).
// An encoding is one word holding the scale's f32 bits, then ceil(n / 32) words of bits.
// No shared memory: the norm is summed by `parts` threads (thread p sums values p, p +
// parts, ... in order, in double) and then by one thread over the parts in order.

// residual[i] += x[i] (v, kept in the residual) and each part's sum of |v| (l1 != 0) or
// v * v, as the bits of a double in two words: partial[2p] low, partial[2p + 1] high.
extern "C" __global__ void onebit_norms(const float* __restrict__ x, float* __restrict__ residual, u32* __restrict__ partial, int n, int parts, int l1) {
    for (long long p = RR_TID; p < parts; p += RR_STRIDE) {
        double acc = 0.0;
        for (long long i = p; i < n; i += parts) {
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

// One thread: the parts summed in order, the scale written as f32 bits into enc[0].
extern "C" __global__ void onebit_scale(const u32* __restrict__ partial, u32* __restrict__ enc, int n, int parts, int l1, float lambda) {
    if (RR_TID != 0) return;
    double sum = 0.0;
    for (int p = 0; p < parts; ++p) {
        union { double d; unsigned long long u; } c;
        c.u = (unsigned long long)partial[2 * p] | ((unsigned long long)partial[2 * p + 1] << 32);
        sum += c.d;
    }
    float s = 0.0f;
    if (n > 0) s = l1 ? (float)(sum / (double)n) : lambda * (float)sqrt(sum / (double)n);
    enc[0] = f32_bits(s);
}

// Word w of the signs (values 32 w .. 32 w + 31), and the residual of each value.
extern "C" __global__ void onebit_pack(float* __restrict__ residual, u32* __restrict__ enc, int n) {
    const float s = bits_f32(enc[0]);
    const long long words = ((long long)n + 31) / 32;
    for (long long w = RR_TID; w < words; w += RR_STRIDE) {
        u32 bits = 0;
        for (int b = 0; b < 32; ++b) {
            long long i = 32 * w + b;
            if (i >= n) break;
            float v = residual[i];
            if (v >= 0.0f) {
                bits |= 1u << b;
                residual[i] = v - s;
            } else {
                residual[i] = v + s;
            }
        }
        enc[1 + w] = bits;
    }
}

// x[i] = the sum over ranks r, in rank order from 0, of rank r's decoded value i, divided by
// `ranks` when `average`; rank r's encoding of this tensor starts at word r * stride + at of
// `gathered`.
extern "C" __global__ void onebit_unpack_sum(const u32* __restrict__ gathered, float* __restrict__ x, int n, int ranks, long long stride, long long at, int average) {
    for (long long i = RR_TID; i < n; i += RR_STRIDE) {
        float acc = 0.0f;
        for (int r = 0; r < ranks; ++r) {
            const u32* e = gathered + (long long)r * stride + at;
            float s = bits_f32(e[0]);
            if ((e[1 + i / 32] >> (i % 32)) & 1u) acc += s;
            else acc -= s;
        }
        x[i] = average ? acc / (float)ranks : acc;
    }
}
