// Dense optimizer updates, the same arithmetic as the CPU device (src/device/cpu.rs).

// SGD: p -= lr * g.
extern "C" __global__ void sgd_update(float* __restrict__ p, const float* __restrict__ g, float lr, long long n) {
    for (long long i = RR_TID; i < n; i += RR_STRIDE) p[i] -= lr * g[i];
}

// Adam with bias correction folded into alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t) and
// eps_hat = eps * sqrt(1 - beta2^t) (computed on the host, as the CPU path does).
extern "C" __global__ void adam_update(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                       float* __restrict__ v, float alpha, float beta1, float beta2,
                                       float eps_hat, long long n) {
    for (long long i = RR_TID; i < n; i += RR_STRIDE) {
        float gi = g[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= alpha * mi / (sqrtf(vi) + eps_hat);
    }
}
