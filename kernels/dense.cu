// Kernels of the dense CTR model on the GPU (src/cuda/mlp.rs). Row-major matrices; one
// sample per row. Reductions run in a fixed order (one thread owns one output and walks
// its inputs in order), so results do not depend on scheduling.

// x[s, f*dim + d] = emb[inverse[s*fields + f]*dim + d]; x[s, fields*dim + j] = dense[s*ndense + j].
extern "C" __global__ void gather_input(const float* __restrict__ emb, const u32* __restrict__ inverse,
                                        const float* __restrict__ dense, float* __restrict__ x,
                                        int batch, int fields, int dim, int ndense) {
    long long width = (long long)fields * dim + ndense;
    for (long long i = RR_TID; i < batch * width; i += RR_STRIDE) {
        long long s = i / width, c = i % width;
        if (c < (long long)fields * dim) {
            long long f = c / dim, d = c % dim;
            x[i] = emb[(long long)inverse[s * fields + f] * dim + d];
        } else {
            x[i] = dense[s * ndense + (c - (long long)fields * dim)];
        }
    }
}

// z[r, c] += bias[c], then max(z, 0) when relu != 0 (hidden layers).
extern "C" __global__ void bias_act(float* __restrict__ z, const float* __restrict__ bias, int rows, int cols, int relu) {
    for (long long i = RR_TID; i < (long long)rows * cols; i += RR_STRIDE) {
        float v = z[i] + bias[i % cols];
        z[i] = relu ? fmaxf(v, 0.0f) : v;
    }
}

// The ReLU's backward: delta = 0 where the layer's output was not positive.
extern "C" __global__ void relu_backward(float* __restrict__ delta, const float* __restrict__ act, long long n) {
    for (long long i = RR_TID; i < n; i += RR_STRIDE) {
        if (act[i] <= 0.0f) delta[i] = 0.0f;
    }
}

// db[c] = sum over rows of delta[r, c], rows in order (one thread per column).
extern "C" __global__ void bias_grad(const float* __restrict__ delta, float* __restrict__ db, int rows, int cols) {
    for (long long c = RR_TID; c < cols; c += RR_STRIDE) {
        float acc = 0.0f;
        for (long long r = 0; r < rows; r++) acc += delta[r * cols + c];
        db[c] = acc;
    }
}

// Binary cross-entropy with logits, numerically stable: loss[i] = max(z,0) - z*y + log1p(exp(-|z|));
// delta[i] = (sigmoid(z) - y) * scale, the output gradient of scale * sum(loss).
extern "C" __global__ void bce_loss(const float* __restrict__ z, const float* __restrict__ y,
                                    float* __restrict__ loss, float* __restrict__ delta, int n, float scale) {
    for (long long i = RR_TID; i < n; i += RR_STRIDE) {
        float v = z[i], t = y[i];
        loss[i] = fmaxf(v, 0.0f) - v * t + log1pf(expf(-fabsf(v)));
        delta[i] = (1.0f / (1.0f + expf(-v)) - t) * scale;
    }
}

// Per-key reduction of embedding-row gradients: out[u, d] = sum of dx[s, f*dim + d] over the
// (sample, field) slots p = s*fields + f listed in slots[offsets[u] .. offsets[u+1]], in
// list order (the host lists them in sample order, as the CPU path sums them).
extern "C" __global__ void key_grad_reduce(const float* __restrict__ dx, const u32* __restrict__ offsets,
                                           const u32* __restrict__ slots, float* __restrict__ out,
                                           int keys, int fields, int dim, int width) {
    for (long long i = RR_TID; i < (long long)keys * dim; i += RR_STRIDE) {
        long long u = i / dim, d = i % dim;
        float acc = 0.0f;
        for (u32 j = offsets[u]; j < offsets[u + 1]; j++) {
            long long p = slots[j];
            acc += dx[(p / fields) * width + (p % fields) * dim + d];
        }
        out[i] = acc;
    }
}

// out[0] = the sum of loss[0..n) in order, accumulated in double (one thread: the batch's
// loss is a few thousand values), so the allreduced loss rides in the gradient buffer.
extern "C" __global__ void loss_sum(const float* __restrict__ loss, float* __restrict__ out, int n) {
    if (RR_TID != 0) return;
    double acc = 0.0;
    for (int i = 0; i < n; i++) acc += (double)loss[i];
    out[0] = (float)acc;
}
