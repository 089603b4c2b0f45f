// The kernels of the models of issue 31 (src/device/ops.rs: Op; src/model/{interaction,cross,
// fm}.rs): strided column copies, element-wise products and sums, DLRM's dot interaction,
// the first-order weights of DeepFM / Wide & Deep and the factorisation machine's second-order
// term, each with its backward. One thread owns one output and sums its inputs in a fixed
// order, the order of the CPU implementation (src/device/cpu.rs).

// out[r * stride + col + c] = src[r * src_stride + src_col + c] for c < cols.
extern "C" __global__ void copy_block(const float* __restrict__ src, int src_stride, int src_col, float* __restrict__ out,
                                      int stride, int col, int rows, int cols) {
    for (long long i = RR_TID; i < (long long)rows * cols; i += RR_STRIDE) {
        long long r = i / cols, c = i % cols;
        out[r * stride + col + c] = src[r * src_stride + src_col + c];
    }
}

// out[i] = a[i] * b[i], or out[i] += a[i] * b[i] when accumulate != 0.
extern "C" __global__ void mul(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out, long long n, int accumulate) {
    for (long long i = RR_TID; i < n; i += RR_STRIDE) {
        float p = a[i] * b[i];
        out[i] = accumulate ? out[i] + p : p;
    }
}

// out[i] += x[i].
extern "C" __global__ void add_into(const float* __restrict__ x, float* __restrict__ out, long long n) {
    for (long long i = RR_TID; i < n; i += RR_STRIDE) out[i] += x[i];
}

// The index of DLRM's pair (i, j), j < i (j <= i with self-interaction), in pair order.
static __device__ __forceinline__ long long rr_pair(long long i, long long j, int with_self) {
    return (with_self ? i * (i + 1) / 2 : i * (i - 1) / 2) + j;
}

// DLRM's dot interaction: z holds rows of `vectors` vectors of dim values (z_0 first); output
// row r is z_0, then dot(z_i, z_j) for every pair in pair order. One thread per output value.
extern "C" __global__ void interaction(const float* __restrict__ z, float* __restrict__ out, int rows, int vectors, int dim, int with_self) {
    long long pairs = with_self ? (long long)vectors * (vectors + 1) / 2 : (long long)vectors * (vectors - 1) / 2;
    long long width = dim + pairs;
    for (long long t = RR_TID; t < rows * width; t += RR_STRIDE) {
        long long r = t / width, c = t % width;
        const float* zr = z + r * vectors * dim;
        if (c < dim) {
            out[t] = zr[c];
            continue;
        }
        long long p = c - dim, i = 0;
        while (rr_pair(i + 1, 0, with_self) <= p) i++;
        long long j = p - rr_pair(i, 0, with_self);
        float acc = 0.0f;
        for (long long k = 0; k < dim; k++) acc += zr[i * dim + k] * zr[j * dim + k];
        out[t] = acc;
    }
}

// The backward of interaction: dz[r, i, k] = (dout[r, k] for i = 0) + sum over j in order of
// dout[r, dim + pair(i, j)] * z[r, j, k] (2 * z[r, i, k] for the pair of i with itself).
extern "C" __global__ void interaction_grad(const float* __restrict__ z, const float* __restrict__ dout, float* __restrict__ dz,
                                            int rows, int vectors, int dim, int with_self) {
    long long pairs = with_self ? (long long)vectors * (vectors + 1) / 2 : (long long)vectors * (vectors - 1) / 2;
    long long width = dim + pairs;
    for (long long t = RR_TID; t < (long long)rows * vectors * dim; t += RR_STRIDE) {
        long long r = t / ((long long)vectors * dim), i = (t / dim) % vectors, k = t % dim;
        const float* zr = z + r * vectors * dim;
        const float* g = dout + r * width;
        float acc = i == 0 ? g[k] : 0.0f;
        for (long long j = 0; j < vectors; j++) {
            if (j == i) {
                if (with_self) acc += 2.0f * g[dim + rr_pair(i, i, 1)] * zr[i * dim + k];
            } else {
                long long p = j < i ? rr_pair(i, j, with_self) : rr_pair(j, i, with_self);
                acc += g[dim + p] * zr[j * dim + k];
            }
        }
        dz[t] = acc;
    }
}

// The deep input of a model with first-order weights: rows of `fields` blocks of dim + 1 values
// (embedding, weight) then ndense features become rows of the embeddings then the features.
extern "C" __global__ void strip_first_order(const float* __restrict__ x, float* __restrict__ out, int rows, int fields, int dim, int ndense) {
    long long in_w = (long long)fields * (dim + 1) + ndense, out_w = (long long)fields * dim + ndense;
    for (long long t = RR_TID; t < rows * out_w; t += RR_STRIDE) {
        long long r = t / out_w, c = t % out_w;
        long long from = c < (long long)fields * dim ? (c / dim) * (dim + 1) + c % dim : c + fields;
        out[t] = x[r * in_w + from];
    }
}

// out[r] = the sum over the fields in order of row r's first-order weights.
extern "C" __global__ void first_order_sum(const float* __restrict__ x, float* __restrict__ out, int rows, int fields, int dim, int ndense) {
    long long in_w = (long long)fields * (dim + 1) + ndense;
    for (long long r = RR_TID; r < rows; r += RR_STRIDE) {
        float acc = 0.0f;
        for (long long f = 0; f < fields; f++) acc += x[r * in_w + f * (dim + 1) + dim];
        out[r] = acc;
    }
}

// The backward of both: dx's embedding and feature columns from ddeep, its weight columns from
// dsum.
extern "C" __global__ void strip_first_order_grad(const float* __restrict__ ddeep, const float* __restrict__ dsum, float* __restrict__ dx,
                                                  int rows, int fields, int dim, int ndense) {
    long long in_w = (long long)fields * (dim + 1) + ndense, out_w = (long long)fields * dim + ndense;
    for (long long t = RR_TID; t < rows * in_w; t += RR_STRIDE) {
        long long r = t / in_w, c = t % in_w;
        if (c >= (long long)fields * (dim + 1)) {
            dx[t] = ddeep[r * out_w + c - fields];
        } else if (c % (dim + 1) == dim) {
            dx[t] = dsum[r];
        } else {
            dx[t] = ddeep[r * out_w + (c / (dim + 1)) * dim + c % (dim + 1)];
        }
    }
}

// The factorisation machine's second-order term: out[r] = 0.5 * sum over k of
// ((sum_f e[f, k])^2 - sum_f e[f, k]^2), fields and k in order.
extern "C" __global__ void fm_second_order(const float* __restrict__ emb, float* __restrict__ out, int rows, int fields, int dim, int stride) {
    for (long long r = RR_TID; r < rows; r += RR_STRIDE) {
        const float* e = emb + r * stride;
        float acc = 0.0f;
        for (long long k = 0; k < dim; k++) {
            float s = 0.0f, sq = 0.0f;
            for (long long f = 0; f < fields; f++) {
                float v = e[f * dim + k];
                s += v;
                sq += v * v;
            }
            acc += s * s - sq;
        }
        out[r] = 0.5f * acc;
    }
}

// Its backward, added into demb: demb[r, f, k] += dout[r] * (sum_g e[g, k] - e[f, k]). One
// thread per (r, k).
extern "C" __global__ void fm_second_order_grad(const float* __restrict__ emb, const float* __restrict__ dout, float* __restrict__ demb,
                                                int rows, int fields, int dim, int stride) {
    for (long long t = RR_TID; t < (long long)rows * dim; t += RR_STRIDE) {
        long long r = t / dim, k = t % dim;
        const float* e = emb + r * stride;
        float s = 0.0f;
        for (long long f = 0; f < fields; f++) s += e[f * dim + k];
        for (long long f = 0; f < fields; f++) demb[r * stride + f * dim + k] += dout[r] * (s - e[f * dim + k]);
    }
}
