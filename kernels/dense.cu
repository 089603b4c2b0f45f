// The generic tensor kernels of the device layer (src/device/ops.rs: Op). Row-major
// matrices. Reductions run in a fixed order (one thread owns one output and walks its
// inputs in order), so results do not depend on scheduling.

// Embedding lookup into row blocks: for i < rows * per_row, row index[i] of table (dim values)
// goes to out[(i / per_row) * stride + (i % per_row) * dim ..]; one thread per output value.
extern "C" __global__ void gather_rows(const float* __restrict__ table, const u32* __restrict__ index,
                                       float* __restrict__ out, int rows, int per_row, int dim, int stride) {
    long long n = (long long)rows * per_row * dim;
    for (long long t = RR_TID; t < n; t += RR_STRIDE) {
        long long i = t / dim, d = t % dim;
        out[(i / per_row) * stride + (i % per_row) * dim + d] = table[(long long)index[i] * dim + d];
    }
}

// Columns appended to rows: out[r * stride + col + c] = src[r * cols + c].
extern "C" __global__ void copy_columns(const float* __restrict__ src, float* __restrict__ out, int rows, int cols, int stride, int col) {
    for (long long i = RR_TID; i < (long long)rows * cols; i += RR_STRIDE) {
        long long r = i / cols, c = i % cols;
        out[r * stride + col + c] = src[i];
    }
}

// z[r, c] = act(z[r, c] + bias[c]); act is max(., 0) when relu != 0.
extern "C" __global__ void bias_act(float* __restrict__ z, const float* __restrict__ bias, int rows, int cols, int relu) {
    for (long long i = RR_TID; i < (long long)rows * cols; i += RR_STRIDE) {
        float v = z[i] + bias[i % cols];
        z[i] = relu ? fmaxf(v, 0.0f) : v;
    }
}

// The ReLU's backward: delta = 0 where the layer's output was not positive.
extern "C" __global__ void relu_grad(float* __restrict__ delta, const float* __restrict__ act, long long n) {
    for (long long i = RR_TID; i < n; i += RR_STRIDE) {
        if (act[i] <= 0.0f) delta[i] = 0.0f;
    }
}

// out[c] = sum over rows of x[r, c], rows in order (one thread per column).
extern "C" __global__ void column_sum(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
    for (long long c = RR_TID; c < cols; c += RR_STRIDE) {
        float acc = 0.0f;
        for (long long r = 0; r < rows; r++) acc += x[r * cols + c];
        out[c] = acc;
    }
}

// Binary cross-entropy with logits, numerically stable: loss[i] = max(z,0) - z*y + log1p(exp(-|z|));
// delta[i] = (sigmoid(z) - y) * scale, the gradient of scale * sum(loss).
extern "C" __global__ void bce_with_logits(const float* __restrict__ z, const float* __restrict__ y,
                                           float* __restrict__ loss, float* __restrict__ delta, int n, float scale) {
    for (long long i = RR_TID; i < n; i += RR_STRIDE) {
        float v = z[i], t = y[i];
        loss[i] = fmaxf(v, 0.0f) - v * t + log1pf(expf(-fabsf(v)));
        delta[i] = (1.0f / (1.0f + expf(-v)) - t) * scale;
    }
}

// The same with a weight per sample: loss[i] = w[i] * bce(z[i], y[i]);
// delta[i] = w[i] * (sigmoid(z) - y) * scale, the gradient of scale * sum(loss).
extern "C" __global__ void weighted_bce(const float* __restrict__ z, const float* __restrict__ y,
                                        const float* __restrict__ w, float* __restrict__ loss,
                                        float* __restrict__ delta, int n, float scale) {
    for (long long i = RR_TID; i < n; i += RR_STRIDE) {
        float v = z[i], t = y[i], wi = w[i];
        loss[i] = wi * (fmaxf(v, 0.0f) - v * t + log1pf(expf(-fabsf(v))));
        delta[i] = wi * (1.0f / (1.0f + expf(-v)) - t) * scale;
    }
}

// Segmented sum, the backward of gather_rows: out[u, d] = sum of src[(p / per_row) * stride +
// (p % per_row) * dim + d] over the blocks p listed in slots[offsets[u] .. offsets[u+1]], in
// list order (the host lists a key's slots in sample order, as the CPU sums them).
extern "C" __global__ void segment_sum(const float* __restrict__ src, const u32* __restrict__ offsets,
                                       const u32* __restrict__ slots, float* __restrict__ out,
                                       int segments, int per_row, int dim, int stride) {
    for (long long i = RR_TID; i < (long long)segments * dim; i += RR_STRIDE) {
        long long u = i / dim, d = i % dim;
        float acc = 0.0f;
        for (u32 j = offsets[u]; j < offsets[u + 1]; j++) {
            long long p = slots[j];
            acc += src[(p / per_row) * stride + (p % per_row) * dim + d];
        }
        out[i] = acc;
    }
}

// out[0] = the sum of x[0..n) in order, accumulated in double (one thread: a batch's loss is
// a few thousand values).
extern "C" __global__ void sum(const float* __restrict__ x, float* __restrict__ out, int n) {
    if (RR_TID != 0) return;
    double acc = 0.0;
    for (int i = 0; i < n; i++) acc += (double)x[i];
    out[0] = (float)acc;
}
