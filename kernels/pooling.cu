// Multi-hot pooling (issue 33), EmbeddingBag's semantics (src/device/ops.rs: Op::PoolBags,
// Op::PoolBagsGrad). Bag b < rows * bags is field b % bags of row b / bags; its ids are
// index[offsets[b] .. offsets[b+1]] (rows of the batch's unique keys). A field whose bit is
// set in `mean` is pooled by its mean, the others by their sum; an empty bag gives zeros.
// One thread owns one output and walks its inputs in list order (the CPU's order).

// Value d of bag b pooled: the rows of its ids summed in list order, divided by the bag's
// length for a field whose bit is set in `mean` (an empty bag: zero). Unique key u's row is
// table[u * dim ..]; with `source` (the GPU hot-row cache, pool_bags_sourced) it is row
// source[u] of `table` (the cache), or row (source[u] & 0x7fffffff) of `misses` when the top
// bit is set: the same additions over the same values.
static __device__ __forceinline__ float rr_pool_bag(const float* table, const float* misses, const u32* source,
                                                    const u32* index, const u32* offsets, long long b, long long d,
                                                    int bags, int dim, int mean) {
    u32 lo = offsets[b], hi = offsets[b + 1];
    float acc = 0.0f;
    for (u32 j = lo; j < hi; j++) {
        u32 u = index[j], s = source ? source[u] : u;
        acc += (source && (s & 0x80000000u)) ? misses[(long long)(s & 0x7fffffffu) * dim + d] : table[(long long)s * dim + d];
    }
    if ((((u32)mean) >> (b % bags)) & 1u && hi > lo) acc /= (float)(hi - lo);
    return acc;
}

// out[(b / bags) * stride + col + (b % bags) * dim + d] = sum over the bag's ids of
// table[id * dim + d], in order (divided by the bag's length for a mean field).
extern "C" __global__ void pool_bags(const float* __restrict__ table, const u32* __restrict__ index,
                                     const u32* __restrict__ offsets, float* __restrict__ out,
                                     int rows, int bags, int dim, int stride, int col, int mean) {
    long long n = (long long)rows * bags * dim;
    for (long long t = RR_TID; t < n; t += RR_STRIDE) {
        long long b = t / dim, d = t % dim;
        out[(b / bags) * stride + col + (b % bags) * dim + d] = rr_pool_bag(table, table, 0, index, offsets, b, d, bags, dim, mean);
    }
}

// pool_bags through the GPU hot-row cache (src/device/ops.rs: Op::PoolBagsSourced): each id's
// row read where gather_sourced (kernels/cache.cu) reads it, cache row or staged miss.
extern "C" __global__ void pool_bags_sourced(const float* __restrict__ cache, const float* __restrict__ misses,
                                             const u32* __restrict__ source, const u32* __restrict__ index,
                                             const u32* __restrict__ offsets, float* __restrict__ out,
                                             int rows, int bags, int dim, int stride, int col, int mean) {
    long long n = (long long)rows * bags * dim;
    for (long long t = RR_TID; t < n; t += RR_STRIDE) {
        long long b = t / dim, d = t % dim;
        out[(b / bags) * stride + col + (b % bags) * dim + d] = rr_pool_bag(cache, misses, source, index, offsets, b, d, bags, dim, mean);
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

// Fields of several tables (`--table`; src/model/fields.rs, Op::GatherFields and
// Op::GatherFieldsGrad): each field has its own width. Unique key u's row is
// emb[key_at[u] .. key_at[u + 1]] (the keys grouped by table, each row its table's width).
// Field f's columns in a sample's input are field_col[f] .. field_col[f + 1], and col_field[c]
// names the field of column c < cols. Fields below `single` are single-hot: sample r's field
// f is key inverse[r * single + f]. The others are multi-hot: field single + g of sample r is
// bag r * bags + g (bags = fields - single), as pool_bags, its mean bit g of `mean`.

// out[r * stride + c] for c < cols: the single-hot field's row value, or the bag's pooled
// one (its rows summed in list order, divided by the bag's length for a mean field; an empty
// bag gives zero): pool_bags's arithmetic.
extern "C" __global__ void gather_fields(const float* __restrict__ emb, const u32* __restrict__ key_at,
                                         const u32* __restrict__ inverse, const u32* __restrict__ bag_index,
                                         const u32* __restrict__ bag_offsets, const u32* __restrict__ field_col,
                                         const u32* __restrict__ col_field, float* __restrict__ out,
                                         int rows, int cols, int fields, int single, int stride, int mean) {
    int bags = fields - single;
    for (long long t = RR_TID; t < (long long)rows * cols; t += RR_STRIDE) {
        long long r = t / cols, c = t % cols;
        u32 f = col_field[c], d = (u32)c - field_col[f];
        float v;
        if ((int)f < single) {
            v = emb[(long long)key_at[inverse[r * single + f]] + d];
        } else {
            long long b = r * bags + (f - single);
            u32 lo = bag_offsets[b], hi = bag_offsets[b + 1];
            v = 0.0f;
            for (u32 j = lo; j < hi; j++) v += emb[(long long)key_at[bag_index[j]] + d];
            if ((((u32)mean) >> (f - single)) & 1u && hi > lo) v /= (float)(hi - lo);
        }
        out[r * stride + c] = v;
    }
}

// The backward, one key's value d per thread (d < widest; a key's row is key_at[u + 1] -
// key_at[u] values): out[key_at[u] + d] = the gradient src[r * stride + field_col[f] + d]
// summed over the key's single-hot slots p = r * single + f in slots[offsets[u] ..
// offsets[u+1]] in list order, then over its bags b in bag_slots[key_bag_offsets[u] ..] in
// list order (each divided by its bag's length for a mean field): segment_sum then
// pool_bags_grad, the same additions.
extern "C" __global__ void gather_fields_grad(const float* __restrict__ src, const u32* __restrict__ key_at,
                                              const u32* __restrict__ offsets, const u32* __restrict__ slots,
                                              const u32* __restrict__ bag_offsets, const u32* __restrict__ key_bag_offsets,
                                              const u32* __restrict__ bag_slots, const u32* __restrict__ field_col,
                                              float* __restrict__ out, int keys, int widest, int fields, int single,
                                              int stride, int mean) {
    int bags = fields - single;
    for (long long i = RR_TID; i < (long long)keys * widest; i += RR_STRIDE) {
        long long u = i / widest;
        u32 d = (u32)(i % widest), at = key_at[u];
        if (d >= key_at[u + 1] - at) continue;
        float acc = 0.0f;
        for (u32 j = offsets[u]; j < offsets[u + 1]; j++) {
            long long p = slots[j];
            acc += src[(p / single) * stride + field_col[p % single] + d];
        }
        for (u32 j = key_bag_offsets[u]; j < key_bag_offsets[u + 1]; j++) {
            long long b = bag_slots[j];
            long long g = b % bags;
            float v = src[(b / bags) * stride + field_col[single + g] + d];
            if ((((u32)mean) >> g) & 1u) v /= (float)(bag_offsets[b + 1] - bag_offsets[b]);
            acc += v;
        }
        out[(long long)at + d] = acc;
    }
}
