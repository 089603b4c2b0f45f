// Multi-hot pooling (issue 33), EmbeddingBag's semantics (src/device/ops.rs: Op::PoolBags,
// Op::PoolBagsGrad). Bag b < rows * bags is field b % bags of row b / bags; its ids are
// index[offsets[b] .. offsets[b+1]] (rows of the batch's unique keys). A field whose bit is
// set in `mean` is pooled by its mean, the others by their sum; an empty bag gives zeros.
// One thread owns one output and walks its inputs in list order (the CPU's order).

// out[(b / bags) * stride + col + (b % bags) * dim + d] = sum over the bag's ids of
// table[id * dim + d], in order (divided by the bag's length for a mean field).
extern "C" __global__ void pool_bags(const float* __restrict__ table, const u32* __restrict__ index,
                                     const u32* __restrict__ offsets, float* __restrict__ out,
                                     int rows, int bags, int dim, int stride, int col, int mean) {
    long long n = (long long)rows * bags * dim;
    for (long long t = RR_TID; t < n; t += RR_STRIDE) {
        long long b = t / dim, d = t % dim;
        u32 lo = offsets[b], hi = offsets[b + 1];
        float acc = 0.0f;
        for (u32 j = lo; j < hi; j++) acc += table[(long long)index[j] * dim + d];
        if ((((u32)mean) >> (b % bags)) & 1u && hi > lo) acc /= (float)(hi - lo);
        out[(b / bags) * stride + col + (b % bags) * dim + d] = acc;
    }
}

// The backward, added into the key gradients: out[u * dim + d] += the pooled gradient
// src[(b / bags) * stride + col + (b % bags) * dim + d] (divided by the bag's length for a
// mean field) over the bags b listed in slots[key_offsets[u] .. key_offsets[u+1]], in list
// order (a key's bags in bag order, once per occurrence).
extern "C" __global__ void pool_bags_grad(const float* __restrict__ src, const u32* __restrict__ offsets,
                                          const u32* __restrict__ key_offsets, const u32* __restrict__ slots,
                                          float* __restrict__ out, int segments, int bags, int dim, int stride,
                                          int col, int mean) {
    for (long long i = RR_TID; i < (long long)segments * dim; i += RR_STRIDE) {
        long long u = i / dim, d = i % dim;
        float acc = out[i];
        for (u32 j = key_offsets[u]; j < key_offsets[u + 1]; j++) {
            long long b = slots[j];
            float g = src[(b / bags) * stride + col + (b % bags) * dim + d];
            if ((((u32)mean) >> (b % bags)) & 1u) g /= (float)(offsets[b + 1] - offsets[b]);
            acc += g;
        }
        out[i] = acc;
    }
}
