//! The dense part of the CTR network on the CPU: an MLP (ReLU hidden layers) to one logit,
//! binary cross-entropy with logits.
//!
//! Parameters live in one flat `Vec<f32>` — per layer `W` (in x out, row-major) then `b`
//! (out) — so the dense gradient is one flat buffer; `forward_backward_with` hands out each
//! layer's range as soon as backward finished it.

use super::gemm::sgemm;

/// Shape of the MLP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlpShape {
    /// Input width (embedding dims x fields + dense features).
    pub input: usize,
    /// Hidden layer widths (ReLU after each).
    pub hidden: Vec<usize>,
}

impl MlpShape {
    /// Layer widths, input to the single output.
    pub fn widths(&self) -> Vec<usize> {
        let mut w = vec![self.input];
        w.extend(&self.hidden);
        w.push(1);
        w
    }
    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.widths().windows(2).map(|p| p[0] * p[1] + p[1]).sum()
    }
    /// Multiply-adds x 2 per sample for forward + backward (weights and inputs gradients).
    pub fn flops_per_sample(&self) -> f64 {
        let macs: usize = self.widths().windows(2).map(|p| p[0] * p[1]).sum();
        6.0 * macs as f64
    }
}

/// The MLP with its parameters and scratch buffers.
///
/// With `threads > 1` a batch is cut into `threads` contiguous slices, each run through
/// single-threaded SGEMMs on its own rayon worker with its own activations, and the
/// slices' parameter gradients are summed in slice order. Independent slices scale better
/// on few cores than one multi-threaded SGEMM per layer (measured: `ringrec bench gemm`),
/// and the grouping equals that of as many ranks with one thread each.
pub struct Mlp {
    shape: MlpShape,
    widths: Vec<usize>,
    /// (weight offset, bias offset) per layer in the flat parameter vector.
    offsets: Vec<(usize, usize)>,
    params: Vec<f32>,
    workers: Vec<Workspace>,
    threads: usize,
}

/// Activations, back-propagated deltas and a gradient buffer of one batch slice.
#[derive(Default)]
struct Workspace {
    acts: Vec<Vec<f32>>,
    deltas: Vec<Vec<f32>>,
    grad: Vec<f32>,
}

impl Workspace {
    fn ensure(&mut self, widths: &[usize], batch: usize) {
        if self.acts.len() != widths.len() {
            self.acts = vec![Vec::new(); widths.len()];
            self.deltas = vec![Vec::new(); widths.len()];
        }
        for (l, w) in widths.iter().enumerate() {
            if self.acts[l].len() < batch * w {
                self.acts[l].resize(batch * w, 0.0);
                self.deltas[l].resize(batch * w, 0.0);
            }
        }
    }
}

/// The parameters and their layout, shared read-only by the workers.
struct Net<'a> {
    widths: &'a [usize],
    offsets: &'a [(usize, usize)],
    params: &'a [f32],
}

impl Net<'_> {
    /// Forward of `batch` rows of `x`; the logits end in `ws.acts[last]`.
    fn forward(&self, ws: &mut Workspace, x: &[f32], batch: usize) {
        ws.ensure(self.widths, batch);
        let last = self.widths.len() - 2;
        for l in 0..=last {
            let (fan_in, fan_out) = (self.widths[l], self.widths[l + 1]);
            let (w, b) = self.offsets[l];
            let (lo, hi) = ws.acts.split_at_mut(l + 1);
            // Layer 0 reads the caller's input in place (no copy into acts[0]).
            let input = if l == 0 { &x[..batch * fan_in] } else { &lo[l][..batch * fan_in] };
            let z = &mut hi[0][..batch * fan_out];
            sgemm(batch, fan_out, fan_in, input, false, &self.params[w..w + fan_in * fan_out], false, z, false, 1);
            // Fused bias (+ ReLU on hidden layers): one pass over the output.
            let bias = &self.params[b..b + fan_out];
            for row in z.chunks_exact_mut(fan_out) {
                if l < last {
                    for (v, bb) in row.iter_mut().zip(bias) {
                        *v = (*v + bb).max(0.0);
                    }
                } else {
                    for (v, bb) in row.iter_mut().zip(bias) {
                        *v += bb;
                    }
                }
            }
        }
    }

    /// Forward + BCE of one slice, leaving the output delta in `ws`; returns the slice's
    /// loss sum.
    fn start(&self, ws: &mut Workspace, x: &[f32], labels: &[f32], batch: usize, loss_scale: f32) -> f64 {
        self.forward(ws, x, batch);
        let layers = self.widths.len();
        let mut loss = 0f64;
        let (acts, deltas) = (&ws.acts, &mut ws.deltas);
        let d = &mut deltas[layers - 1][..batch];
        let z = &acts[layers - 1][..batch];
        for i in 0..batch {
            loss += bce_with_logits(z[i], labels[i]) as f64;
            d[i] = (sigmoid(z[i]) - labels[i]) * loss_scale;
        }
        loss
    }

    /// Backward through layer `l` of one slice: its weight and bias gradients into their
    /// range of `grad`, the delta of the layer below (the input gradient `dx` for layer 0).
    #[allow(clippy::too_many_arguments)]
    fn backward_layer(&self, ws: &mut Workspace, l: usize, x: &[f32], batch: usize, grad: &mut [f32], dx: &mut [f32]) {
        let (fan_in, fan_out) = (self.widths[l], self.widths[l + 1]);
        let (w, b) = self.offsets[l];
        let delta = &ws.deltas[l + 1][..batch * fan_out];
        let input = if l == 0 { &x[..batch * fan_in] } else { &ws.acts[l][..batch * fan_in] };
        // dW = input^T * delta; db = column sums of delta.
        sgemm(fan_in, fan_out, batch, input, true, delta, false, &mut grad[w..w + fan_in * fan_out], false, 1);
        let db = &mut grad[b..b + fan_out];
        db.fill(0.0);
        for row in delta.chunks_exact(fan_out) {
            for (g, d) in db.iter_mut().zip(row) {
                *g += d;
            }
        }
        // d(input) = delta * W^T, then through the ReLU of the layer below.
        let (lo, hi) = ws.deltas.split_at_mut(l + 1);
        let target: &mut [f32] = if l == 0 { &mut dx[..batch * fan_in] } else { &mut lo[l][..batch * fan_in] };
        sgemm(batch, fan_in, fan_out, &hi[0][..batch * fan_out], false, &self.params[w..w + fan_in * fan_out], true, target, false, 1);
        if l > 0 {
            for (d, a) in target.iter_mut().zip(&ws.acts[l][..batch * fan_in]) {
                if *a <= 0.0 {
                    *d = 0.0;
                }
            }
        }
    }
}

/// splitmix64: a small, fast, well-mixed generator for deterministic initialisation.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Mlp {
    /// Glorot-uniform weights and zero biases drawn from `seed` (the same on every rank).
    pub fn new(shape: MlpShape, seed: u64, threads: usize) -> Mlp {
        let widths = shape.widths();
        let mut offsets = Vec::new();
        let mut at = 0;
        for p in widths.windows(2) {
            offsets.push((at, at + p[0] * p[1]));
            at += p[0] * p[1] + p[1];
        }
        let mut params = vec![0f32; at];
        let mut rng = seed ^ 0xD1B5_4A32_D192_ED03;
        for (l, p) in widths.windows(2).enumerate() {
            let limit = (6.0 / (p[0] + p[1]) as f64).sqrt();
            let w = offsets[l].0;
            for x in &mut params[w..w + p[0] * p[1]] {
                let u = (splitmix64(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
                *x = ((2.0 * u - 1.0) * limit) as f32;
            }
        }
        let threads = threads.max(1);
        Mlp { shape, widths, offsets, params, workers: (0..threads).map(|_| Workspace::default()).collect(), threads }
    }

    /// The shape.
    pub fn shape(&self) -> &MlpShape {
        &self.shape
    }
    /// Flat parameters.
    pub fn params(&self) -> &[f32] {
        &self.params
    }
    /// Flat parameters, to update or broadcast into.
    pub fn params_mut(&mut self) -> &mut [f32] {
        &mut self.params
    }
    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.params.len()
    }

    /// Rows of slice `i` of `parts` of a batch.
    fn slice(batch: usize, parts: usize, i: usize) -> std::ops::Range<usize> {
        (batch * i / parts)..(batch * (i + 1) / parts)
    }

    /// Forward pass of `batch` rows of `x` (batch x input); writes logits into `out`.
    pub fn forward(&mut self, x: &[f32], batch: usize, out: &mut [f32]) {
        let input = self.widths[0];
        let last = self.widths.len() - 1;
        let net = Net { widths: &self.widths, offsets: &self.offsets, params: &self.params };
        let parts = self.threads.min(batch.max(1));
        let mut outs: Vec<&mut [f32]> = Vec::with_capacity(parts);
        let mut rest = &mut out[..batch];
        for i in 0..parts {
            let r = Mlp::slice(batch, parts, i);
            let (a, b) = rest.split_at_mut(r.len());
            outs.push(a);
            rest = b;
        }
        let run = |(i, (ws, o)): (usize, (&mut Workspace, &mut [f32]))| {
            let r = Mlp::slice(batch, parts, i);
            net.forward(ws, &x[r.start * input..r.end * input], r.len());
            o.copy_from_slice(&ws.acts[last][..r.len()]);
        };
        if parts == 1 {
            run((0, (&mut self.workers[0], outs.pop().unwrap_or_default())));
        } else {
            use rayon::prelude::*;
            self.workers[..parts].par_iter_mut().zip(outs).enumerate().for_each(run);
        }
    }

    /// Number of layers (weight matrices).
    pub fn num_layers(&self) -> usize {
        self.offsets.len()
    }

    /// Layer `l`'s parameters in the flat vector: its weights, then its biases.
    pub fn layer_range(&self, l: usize) -> std::ops::Range<usize> {
        self.offsets[l].0..self.offsets[l].1 + self.widths[l + 1]
    }

    /// Forward, binary cross-entropy against `labels`, backward. Gradients are of
    /// `loss_scale * sum_i loss_i` (the trainer passes 1 / global batch, so summing the
    /// ranks' gradients gives the gradient of the global mean loss). Writes the parameter
    /// gradient into `grad` (overwritten) and the input gradient into `dx` (batch x input).
    /// Returns the unscaled sum of the per-sample losses.
    pub fn forward_backward(&mut self, x: &[f32], labels: &[f32], batch: usize, loss_scale: f32, grad: &mut [f32], dx: &mut [f32]) -> f64 {
        self.forward_backward_with(x, labels, batch, loss_scale, grad, dx, &mut |_, _| {})
    }

    /// [`Mlp::forward_backward`] that calls `ready(l, gradient of layer l)` as soon as a
    /// layer's gradient is final, last layer first, so its allreduce can start while the
    /// layers below are still back-propagated.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_backward_with(&mut self, x: &[f32], labels: &[f32], batch: usize, loss_scale: f32, grad: &mut [f32], dx: &mut [f32], ready: &mut dyn FnMut(usize, &[f32])) -> f64 {
        let input = self.widths[0];
        let n = self.params.len();
        let layers = self.offsets.len();
        let ranges: Vec<std::ops::Range<usize>> = (0..layers).map(|l| self.layer_range(l)).collect();
        let parts = self.threads.min(batch.max(1));
        let net = Net { widths: &self.widths, offsets: &self.offsets, params: &self.params };
        if parts == 1 {
            let ws = &mut self.workers[0];
            let loss = net.start(ws, x, labels, batch, loss_scale);
            for l in (0..layers).rev() {
                net.backward_layer(ws, l, x, batch, &mut grad[..n], dx);
                ready(l, &grad[ranges[l].clone()]);
            }
            return loss;
        }
        let mut dxs: Vec<&mut [f32]> = Vec::with_capacity(parts);
        let mut rest = &mut dx[..batch * input];
        for i in 0..parts {
            let r = Mlp::slice(batch, parts, i);
            let (a, b) = rest.split_at_mut(r.len() * input);
            dxs.push(a);
            rest = b;
        }
        use rayon::prelude::*;
        let workers = &mut self.workers[..parts];
        let losses: Vec<f64> = workers
            .par_iter_mut()
            .enumerate()
            .map(|(i, ws)| {
                let r = Mlp::slice(batch, parts, i);
                ws.grad.resize(n, 0.0);
                net.start(ws, &x[r.start * input..r.end * input], &labels[r.clone()], r.len(), loss_scale)
            })
            .collect();
        for l in (0..layers).rev() {
            workers.par_iter_mut().zip(dxs.par_iter_mut()).enumerate().for_each(|(i, (ws, d))| {
                let r = Mlp::slice(batch, parts, i);
                let mut g = std::mem::take(&mut ws.grad);
                net.backward_layer(ws, l, &x[r.start * input..r.end * input], r.len(), &mut g, d);
                ws.grad = g;
            });
            // Slice gradients summed in slice order: deterministic for a thread count.
            let range = ranges[l].clone();
            grad[range.clone()].copy_from_slice(&workers[0].grad[range.clone()]);
            for ws in &workers[1..] {
                for (a, b) in grad[range.clone()].iter_mut().zip(&ws.grad[range.clone()]) {
                    *a += b;
                }
            }
            ready(l, &grad[range]);
        }
        losses.iter().sum()
    }
}

/// Logistic function.
pub fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

/// Numerically stable binary cross-entropy of a logit `z` against a 0/1 label `y`.
pub fn bce_with_logits(z: f32, y: f32) -> f32 {
    z.max(0.0) - z * y + (-z.abs()).exp().ln_1p()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loss_of(m: &mut Mlp, x: &[f32], y: &[f32], batch: usize) -> f64 {
        let mut g = vec![0f32; m.num_params()];
        let mut dx = vec![0f32; x.len()];
        m.forward_backward(x, y, batch, 1.0, &mut g, &mut dx)
    }

    #[test]
    fn gradients_match_finite_differences() {
        let shape = MlpShape { input: 7, hidden: vec![5, 4] };
        let mut m = Mlp::new(shape.clone(), 42, 1);
        assert_eq!(m.num_params(), 7 * 5 + 5 + 5 * 4 + 4 + 4 + 1);
        let batch = 6;
        let mut rng = 99u64;
        let x: Vec<f32> = (0..batch * 7).map(|_| (splitmix64(&mut rng) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0).collect();
        let y: Vec<f32> = (0..batch).map(|i| (i % 2) as f32).collect();
        let mut g = vec![0f32; m.num_params()];
        let mut dx = vec![0f32; x.len()];
        m.forward_backward(&x, &y, batch, 1.0, &mut g, &mut dx);
        // Central differences at two step sizes; where they disagree a ReLU kink lies in
        // between and the point is skipped (at most a few).
        let mut skipped = 0;
        for (p, want) in g.iter().enumerate() {
            let orig = m.params[p];
            let mut fds = [0f32; 2];
            for (j, h) in [1e-2f32, 5e-3].into_iter().enumerate() {
                m.params[p] = orig + h;
                let up = loss_of(&mut m, &x, &y, batch);
                m.params[p] = orig - h;
                let down = loss_of(&mut m, &x, &y, batch);
                fds[j] = ((up - down) / (2.0 * h as f64)) as f32;
            }
            m.params[p] = orig;
            if (fds[0] - fds[1]).abs() > 1e-3 * (1.0 + fds[1].abs()) {
                skipped += 1;
                continue;
            }
            assert!((fds[1] - want).abs() <= 2e-3 * (1.0 + fds[1].abs()), "param {p}: fd {fds:?} vs {want}");
        }
        assert!(skipped <= m.num_params() / 10, "{skipped} kinks");
        let h = 1e-3f32;
        let mut xp = x.clone();
        for i in (0..x.len()).step_by(5) {
            xp[i] = x[i] + h;
            let up = loss_of(&mut m, &xp, &y, batch);
            xp[i] = x[i] - h;
            let down = loss_of(&mut m, &xp, &y, batch);
            xp[i] = x[i];
            let fd = ((up - down) / (2.0 * h as f64)) as f32;
            assert!((fd - dx[i]).abs() <= 2e-3 * (1.0 + fd.abs()), "input {i}: fd {fd} vs {}", dx[i]);
        }
    }

    #[test]
    fn batch_slices_on_threads_agree_with_one_thread() {
        let shape = MlpShape { input: 29, hidden: vec![16, 8] };
        let mut one = Mlp::new(shape.clone(), 3, 1);
        let mut three = Mlp::new(shape, 3, 3);
        let batch = 50;
        let mut rng = 5u64;
        let x: Vec<f32> = (0..batch * 29).map(|_| (splitmix64(&mut rng) >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect();
        let y: Vec<f32> = (0..batch).map(|i| (i % 3 == 0) as u8 as f32).collect();
        let (mut g1, mut g3) = (vec![0f32; one.num_params()], vec![0f32; one.num_params()]);
        let (mut d1, mut d3) = (vec![0f32; x.len()], vec![0f32; x.len()]);
        let l1 = one.forward_backward(&x, &y, batch, 0.02, &mut g1, &mut d1);
        let l3 = three.forward_backward(&x, &y, batch, 0.02, &mut g3, &mut d3);
        assert!((l1 - l3).abs() < 1e-4, "{l1} vs {l3}");
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(p, q)| (p - q).abs() <= 1e-5 * (1.0 + p.abs()));
        assert!(close(&g1, &g3), "parameter gradients differ");
        assert!(close(&d1, &d3), "input gradients differ");
        let (mut o1, mut o3) = (vec![0f32; batch], vec![0f32; batch]);
        one.forward(&x, batch, &mut o1);
        three.forward(&x, batch, &mut o3);
        assert!(close(&o1, &o3));
        // A batch smaller than the thread count, and an empty one.
        three.forward_backward(&x, &y, 2, 1.0, &mut g3, &mut d3);
        three.forward_backward(&x, &y, 0, 1.0, &mut g3, &mut d3);
        assert!(g3.iter().all(|g| *g == 0.0), "an empty batch has a zero gradient");
    }

    #[test]
    fn layers_are_handed_out_last_first_with_their_final_gradient() {
        let shape = MlpShape { input: 29, hidden: vec![16, 8] };
        for threads in [1, 3] {
            let mut m = Mlp::new(shape.clone(), 3, threads);
            let batch = 40;
            let x: Vec<f32> = (0..batch * 29).map(|i| ((i * 7) % 13) as f32 / 13.0 - 0.5).collect();
            let y: Vec<f32> = (0..batch).map(|i| (i % 2) as f32).collect();
            let mut g = vec![0f32; m.num_params()];
            let mut dx = vec![0f32; x.len()];
            let mut seen: Vec<(usize, Vec<f32>)> = Vec::new();
            m.forward_backward_with(&x, &y, batch, 0.1, &mut g, &mut dx, &mut |l, grad| seen.push((l, grad.to_vec())));
            assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), vec![2, 1, 0]);
            // What was handed out is exactly the final gradient of that layer's range.
            let mut cover = 0;
            for (l, grad) in &seen {
                assert_eq!(&g[m.layer_range(*l)], &grad[..], "threads {threads} layer {l}");
                cover += grad.len();
            }
            assert_eq!(cover, m.num_params());
        }
    }

    #[test]
    fn bce_is_stable_and_correct() {
        assert!((bce_with_logits(0.0, 1.0) - std::f32::consts::LN_2).abs() < 1e-7);
        assert!((bce_with_logits(100.0, 1.0)).abs() < 1e-6);
        assert!((bce_with_logits(-100.0, 1.0) - 100.0).abs() < 1e-3);
        assert!(bce_with_logits(-100.0, 0.0).is_finite());
    }

    #[test]
    fn same_seed_same_params_and_shape_counts() {
        let s = MlpShape { input: 429, hidden: vec![256, 128] };
        assert_eq!(s.num_params(), 429 * 256 + 256 + 256 * 128 + 128 + 128 + 1);
        assert_eq!(Mlp::new(s.clone(), 7, 1).params(), Mlp::new(s.clone(), 7, 2).params());
        assert_ne!(Mlp::new(s.clone(), 7, 1).params(), Mlp::new(s, 8, 1).params());
    }
}
