// The GPU hot-row cache (issue 30; src/embedding/cache.rs, src/train/gpu_cache.rs).

// The input's embedding blocks from the cache or the staged misses: for i < rows * per_row,
// the row of unique key index[i] goes to out[(i / per_row) * stride + (i % per_row) * dim ..],
// where unique key u's row is cache row source[u], or, when source[u] has its top bit set,
// row (source[u] & 0x7fffffff) of misses. gather_rows with one more indirection: copies only.
extern "C" __global__ void gather_sourced(const float* __restrict__ cache, const float* __restrict__ misses,
                                          const u32* __restrict__ source, const u32* __restrict__ index,
                                          float* __restrict__ out, int rows, int per_row, int dim, int stride) {
    long long n = (long long)rows * per_row * dim;
    for (long long t = RR_TID; t < n; t += RR_STRIDE) {
        long long i = t / dim, d = t % dim;
        u32 s = source[index[i]];
        float v = (s & 0x80000000u) ? misses[(long long)(s & 0x7fffffffu) * dim + d] : cache[(long long)s * dim + d];
        out[(i / per_row) * stride + (i % per_row) * dim + d] = v;
    }
}

// The host table's optimizer step (src/embedding/update.rs, step_row) on cached rows, bit
// for bit: entry e's gradient row grads[e * dim ..] updates cache row slots[e]. SGD
// (adagrad = 0): w -= lr * g. Row-wise Adagrad: acc += (sum of g^2 in order) / dim, then
// w -= lr * g / (sqrt(acc) + eps). Every operation is rounded on its own (no contraction
// into FMAs), in the host's order. Slots are distinct (a merged list has one row per key).
// With indexed, entry e's gradient row is grads[index[e] * dim ..] instead (rows already on
// the device: the step's own key gradients). An entry whose slot has its top bit set (a
// cache source that is a miss) is skipped: a batch's sources, one per unique key, serve as
// the slots of its own key gradients' update.
extern "C" __global__ void cache_update(float* __restrict__ rows, float* __restrict__ acc,
                                        const u32* __restrict__ slots, const float* __restrict__ grads,
                                        const u32* __restrict__ index, int indexed,
                                        int n, int dim, float lr, float eps, int adagrad) {
    for (long long e = RR_TID; e < n; e += RR_STRIDE) {
        if (slots[e] & 0x80000000u) continue;
        const float* g = grads + (indexed ? (long long)index[e] : e) * dim;
        float* w = rows + (long long)slots[e] * dim;
        if (adagrad) {
            float s = 0.0f;
            for (int j = 0; j < dim; j++) s = __fadd_rn(s, __fmul_rn(g[j], g[j]));
            float a = __fadd_rn(acc[slots[e]], __fdiv_rn(s, (float)dim));
            acc[slots[e]] = a;
            float denom = __fadd_rn(__fsqrt_rn(a), eps);
            for (int j = 0; j < dim; j++) w[j] = __fsub_rn(w[j], __fdiv_rn(__fmul_rn(lr, g[j]), denom));
        } else {
            for (int j = 0; j < dim; j++) w[j] = __fsub_rn(w[j], __fmul_rn(lr, g[j]));
        }
    }
}

// Rows (and Adagrad accumulators) put into cache slots: for e < n, values[e * dim ..] into
// cache row slots[e], and with has_acc, accs[e] into acc[slots[e]] (a refresh's entering keys).
extern "C" __global__ void cache_put(float* __restrict__ rows, float* __restrict__ acc, const u32* __restrict__ slots,
                                     const float* __restrict__ values, const float* __restrict__ accs, int n, int dim, int has_acc) {
    for (long long t = RR_TID; t < (long long)n * dim; t += RR_STRIDE) {
        long long e = t / dim, d = t % dim;
        rows[(long long)slots[e] * dim + d] = values[t];
        if (has_acc && d == 0) acc[slots[e]] = accs[e];
    }
}

// New keys' rows made on the device: a key absent from the host table reads as its initial
// row (src/hash.rs, init_row_f32), so only the key travels. For e < n, key
// keys[2e] | keys[2e+1] << 32 gets row at + e of out: element j is
// scale * (u / 2^23 - 1), u the top 24 bits of splitmix64(base + (j + 1) * golden),
// base = splitmix64(seed ^ splitmix64(key)). u / 2^23 - 1 is exact; the product is rounded
// once, on its own (no contraction), as on the host.
static __device__ __forceinline__ unsigned long long rr_splitmix64(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

extern "C" __global__ void init_rows(const u32* __restrict__ keys, float* __restrict__ out, int n, int dim, long long seed, float scale) {
    for (long long t = RR_TID; t < (long long)n * dim; t += RR_STRIDE) {
        long long e = t / dim, j = t % dim;
        unsigned long long key = (unsigned long long)keys[2 * e] | ((unsigned long long)keys[2 * e + 1] << 32);
        unsigned long long base = rr_splitmix64((unsigned long long)seed ^ rr_splitmix64(key));
        unsigned long long u = rr_splitmix64(base + (unsigned long long)(j + 1) * 0x9E3779B97F4A7C15ull) >> 40;
        out[t] = __fmul_rn(scale, __fsub_rn(__fmul_rn((float)u, 1.0f / 8388608.0f), 1.0f));
    }
}
