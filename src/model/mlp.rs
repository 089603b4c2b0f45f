//! The MLP of the CTR network, written once over [`Device`]: ReLU hidden layers to one
//! logit.
//!
//! Parameters live in one device buffer — per layer `W` (in x out, row-major) then `b`
//! (out) — so checkpoints and the initial broadcast see one flat vector on every device.
//! Each layer's gradient (`W` then `b`) has its own buffer, so backward can hand it out (to
//! be reduced across ranks) as soon as it is final while the layers below are still
//! back-propagated.

use super::optim::Optimizer;
use super::layers::Layers;
use crate::device::{Device, DeviceError, DeviceResult};
use crate::hash::splitmix64_next;

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
    /// (weight offset, bias offset) of each layer in the flat parameter vector.
    pub fn offsets(&self) -> Vec<(usize, usize)> {
        let mut at = 0;
        self.widths()
            .windows(2)
            .map(|p| {
                let o = (at, at + p[0] * p[1]);
                at += p[0] * p[1] + p[1];
                o
            })
            .collect()
    }
    /// Glorot-uniform weights and zero biases drawn from `seed` (the same on every rank).
    pub fn init_params(&self, seed: u64) -> Vec<f32> {
        let widths = self.widths();
        let mut params = vec![0f32; self.num_params()];
        let mut rng = seed ^ 0xD1B5_4A32_D192_ED03;
        for ((w, _), p) in self.offsets().into_iter().zip(widths.windows(2)) {
            let limit = (6.0 / (p[0] + p[1]) as f64).sqrt();
            for x in &mut params[w..w + p[0] * p[1]] {
                let u = (splitmix64_next(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
                *x = ((2.0 * u - 1.0) * limit) as f32;
            }
        }
        params
    }
}

/// The MLP's parameters, gradients and activations on device `D` (see the module docs).
pub struct Mlp<D: Device> {
    shape: MlpShape,
    layers: Layers<D>,
    params: D::Buf<f32>,
    /// Per layer: its W gradient then its b gradient; `None` while handed out.
    grads: Vec<Option<D::Buf<f32>>>,
}

impl<D: Device> Mlp<D> {
    /// An MLP of `shape` with parameters `params` (flat layout) on `dev`.
    pub fn new(dev: &D, shape: MlpShape, params: &[f32]) -> DeviceResult<Mlp<D>> {
        if params.len() != shape.num_params() {
            return Err(DeviceError::refused("building the model", format!("{} parameters given, the shape has {}", params.len(), shape.num_params())));
        }
        let widths = shape.widths();
        let grads = widths.windows(2).map(|w| dev.alloc(w[0] * w[1] + w[1]).map(Some)).collect::<DeviceResult<_>>()?;
        Ok(Mlp { layers: Layers::new(dev, widths, 0, false)?, params: dev.buffer_from(params)?, grads, shape })
    }

    /// The shape.
    pub fn shape(&self) -> &MlpShape {
        &self.shape
    }
    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.shape.num_params()
    }
    /// Number of layers (weight matrices).
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }
    /// Layer `l`'s parameters in the flat vector: its weights, then its biases.
    pub fn layer_range(&self, l: usize) -> std::ops::Range<usize> {
        self.layers.layer_range(l)
    }
    /// Layer `l`'s outputs (its bias count): its parameters are `(inputs + 1) x outputs`.
    pub fn layer_outputs(&self, l: usize) -> usize {
        self.layers.widths()[l + 1]
    }
    /// The flat parameters.
    pub fn params(&self) -> &D::Buf<f32> {
        &self.params
    }
    /// Layer `l`'s gradient, unless it is handed out.
    pub fn grad(&self, l: usize) -> Option<&D::Buf<f32>> {
        self.grads[l].as_ref()
    }
    /// One step of `opt` on the parameters with every layer's gradient; an error while a
    /// gradient is handed out.
    pub fn update(&mut self, dev: &D, opt: &mut Optimizer<D>) -> DeviceResult<()> {
        let mut layers = Vec::with_capacity(self.grads.len());
        for (l, g) in self.grads.iter().enumerate() {
            layers.push((self.layers.layer_range(l), g.as_ref().ok_or_else(|| lent(l))?));
        }
        opt.step(dev, &mut self.params, &layers)
    }
    /// Takes layer `l`'s gradient buffer back after it was handed out.
    pub fn put_grad(&mut self, l: usize, g: D::Buf<f32>) {
        self.grads[l] = Some(g);
    }
    /// The logits of the last forward (batch values).
    pub fn output(&self) -> &D::Buf<f32> {
        self.layers.output()
    }
    /// The logits and their gradient's buffer (the loss writes it before [`Mlp::backward`]).
    pub fn output_and_delta(&mut self) -> (&D::Buf<f32>, &mut D::Buf<f32>) {
        self.layers.output_and_delta()
    }

    /// Forward of `batch` rows of `x` (batch x input); the logits end in [`Mlp::output`].
    pub fn forward(&mut self, dev: &D, x: &D::Buf<f32>, batch: usize) -> DeviceResult<()> {
        self.layers.forward(dev, &self.params, x, batch)
    }

    /// Backward of the last forward, from the output delta (see
    /// [`Mlp::output_and_delta`]): each layer's weight and bias gradients, last layer
    /// first, are handed to `ready(l, gradient)` as soon as they are final (take them back
    /// with [`Mlp::put_grad`]); the input gradient goes to `dx` (batch x input).
    pub fn backward(&mut self, dev: &D, x: &D::Buf<f32>, dx: &mut D::Buf<f32>, batch: usize, ready: &mut dyn FnMut(usize, D::Buf<f32>) -> DeviceResult<()>) -> DeviceResult<()> {
        let grads = &mut self.grads;
        self.layers.backward(dev, &self.params, x, Some(dx), batch, &mut |l| grads[l].take().ok_or_else(|| lent(l)), ready)
    }
}

fn lent(l: usize) -> DeviceError {
    DeviceError::refused("a dense step", format!("the gradient of layer {l} is still being reduced (give it back before the next step)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{CpuDevice, Op};

    /// Forward + BCE (gradient of `scale * sum(loss)`) + backward on the CPU device;
    /// returns (loss sum, flat gradient, input gradient).
    fn step(dev: &CpuDevice, m: &mut Mlp<CpuDevice>, x: &[f32], y: &[f32], batch: usize, scale: f32) -> (f64, Vec<f32>, Vec<f32>) {
        m.forward(dev, &x.to_vec(), batch).unwrap();
        let (mut loss, mut sum) = (vec![0f32; batch], vec![0f32; 1]);
        let (z, delta) = m.output_and_delta();
        dev.exec(Op::BceWithLogits { z, y: &y.to_vec(), loss: &mut loss, delta, n: batch, scale }).unwrap();
        dev.exec(Op::Sum { x: &loss, n: batch, out: &mut sum, at: 0 }).unwrap();
        let mut dx = vec![0f32; x.len()];
        let mut grads = vec![Vec::new(); m.num_layers()];
        m.backward(dev, &x.to_vec(), &mut dx, batch, &mut |l, g| {
            grads[l] = g;
            Ok(())
        })
        .unwrap();
        let mut flat = Vec::new();
        for (l, g) in grads.into_iter().enumerate() {
            flat.extend_from_slice(&g);
            m.put_grad(l, g);
        }
        (sum[0] as f64, flat, dx)
    }

    fn loss_of(dev: &CpuDevice, shape: &MlpShape, p: &[f32], x: &[f32], y: &[f32], batch: usize) -> f64 {
        let mut m = Mlp::new(dev, shape.clone(), p).unwrap();
        step(dev, &mut m, x, y, batch, 1.0).0
    }

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = seed;
        (0..n).map(|_| (splitmix64_next(&mut rng) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0).collect()
    }

    #[test]
    fn gradients_match_finite_differences() {
        let dev = CpuDevice::new(1);
        let shape = MlpShape { input: 7, hidden: vec![5, 4] };
        let params = shape.init_params(42);
        assert_eq!(shape.num_params(), 7 * 5 + 5 + 5 * 4 + 4 + 4 + 1);
        let mut m = Mlp::new(&dev, shape.clone(), &params).unwrap();
        let batch = 6;
        let x = random(batch * 7, 99);
        let y: Vec<f32> = (0..batch).map(|i| (i % 2) as f32).collect();
        let (_, g, dx) = step(&dev, &mut m, &x, &y, batch, 1.0);
        // Central differences at two step sizes; where they disagree a ReLU kink lies in
        // between and the point is skipped (at most a few).
        let mut skipped = 0;
        let mut p = params.clone();
        for (i, want) in g.iter().enumerate() {
            let orig = p[i];
            let mut fds = [0f32; 2];
            for (j, h) in [1e-2f32, 5e-3].into_iter().enumerate() {
                p[i] = orig + h;
                let up = loss_of(&dev, &shape, &p, &x, &y, batch);
                p[i] = orig - h;
                let down = loss_of(&dev, &shape, &p, &x, &y, batch);
                fds[j] = ((up - down) / (2.0 * h as f64)) as f32;
            }
            p[i] = orig;
            if (fds[0] - fds[1]).abs() > 1e-3 * (1.0 + fds[1].abs()) {
                skipped += 1;
                continue;
            }
            assert!((fds[1] - want).abs() <= 2e-3 * (1.0 + fds[1].abs()), "param {i}: fd {fds:?} vs {want}");
        }
        assert!(skipped <= shape.num_params() / 10, "{skipped} kinks");
        let h = 1e-3f32;
        let mut xp = x.clone();
        for i in (0..x.len()).step_by(5) {
            xp[i] = x[i] + h;
            let up = loss_of(&dev, &shape, &params, &xp, &y, batch);
            xp[i] = x[i] - h;
            let down = loss_of(&dev, &shape, &params, &xp, &y, batch);
            xp[i] = x[i];
            let fd = ((up - down) / (2.0 * h as f64)) as f32;
            assert!((fd - dx[i]).abs() <= 2e-3 * (1.0 + fd.abs()), "input {i}: fd {fd} vs {}", dx[i]);
        }
    }

    #[test]
    fn batch_slices_on_threads_agree_with_one_thread() {
        let shape = MlpShape { input: 29, hidden: vec![16, 8] };
        let params = shape.init_params(3);
        let (d1, d3) = (CpuDevice::new(1), CpuDevice::new(3));
        let mut one = Mlp::new(&d1, shape.clone(), &params).unwrap();
        let mut three = Mlp::new(&d3, shape.clone(), &params).unwrap();
        let batch = 50;
        let x: Vec<f32> = random(batch * 29, 5).iter().map(|v| v * 0.5).collect();
        let y: Vec<f32> = (0..batch).map(|i| (i % 3 == 0) as u8 as f32).collect();
        let (l1, g1, dx1) = step(&d1, &mut one, &x, &y, batch, 0.02);
        let (l3, g3, dx3) = step(&d3, &mut three, &x, &y, batch, 0.02);
        assert!((l1 - l3).abs() < 1e-4, "{l1} vs {l3}");
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(p, q)| (p - q).abs() <= 1e-5 * (1.0 + p.abs()));
        assert!(close(&g1, &g3), "parameter gradients differ");
        assert!(close(&dx1, &dx3), "input gradients differ");
        one.forward(&d1, &x, batch).unwrap();
        three.forward(&d3, &x, batch).unwrap();
        assert!(close(&one.output()[..batch], &three.output()[..batch]));
        // A batch smaller than the thread count, and an empty one.
        step(&d3, &mut three, &x, &y, 2, 1.0);
        let (_, g, _) = step(&d3, &mut three, &x, &y, 0, 1.0);
        assert!(g.iter().all(|g| *g == 0.0), "an empty batch has a zero gradient");
    }

    #[test]
    fn layers_are_handed_out_last_first_with_their_final_gradient() {
        let shape = MlpShape { input: 29, hidden: vec![16, 8] };
        for threads in [1, 3] {
            let dev = CpuDevice::new(threads);
            let mut m = Mlp::new(&dev, shape.clone(), &shape.init_params(3)).unwrap();
            let batch = 40;
            let x: Vec<f32> = (0..batch * 29).map(|i| ((i * 7) % 13) as f32 / 13.0 - 0.5).collect();
            m.forward(&dev, &x, batch).unwrap();
            let (_, delta) = m.output_and_delta();
            delta[..batch].iter_mut().enumerate().for_each(|(i, d)| *d = 0.1 * (i % 2) as f32 - 0.05);
            let mut seen: Vec<(usize, Vec<f32>)> = Vec::new();
            let mut dx = vec![0f32; x.len()];
            m.backward(&dev, &x, &mut dx, batch, &mut |l, g| {
                seen.push((l, g));
                Ok(())
            })
            .unwrap();
            assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), vec![2, 1, 0]);
            // A step (or an update) while a gradient is handed out is refused; given back, it works.
            assert!(m.backward(&dev, &x, &mut dx, batch, &mut |_, _| Ok(())).unwrap_err().to_string().contains("layer 2 is still being reduced"));
            let mut cover = 0;
            for (l, g) in seen {
                assert_eq!(g.len(), m.layer_range(l).len(), "threads {threads} layer {l}");
                cover += g.len();
                m.put_grad(l, g);
            }
            assert_eq!(cover, m.num_params());
            let mut sgd = Optimizer::new(&dev, &crate::model::DenseOptimState::new(crate::model::DenseOptimizer::Sgd, 0.1, cover), cover).unwrap();
            assert!(m.update(&dev, &mut sgd).is_ok());
        }
    }

    #[test]
    fn same_seed_same_params_and_shape_counts() {
        let s = MlpShape { input: 429, hidden: vec![256, 128] };
        assert_eq!(s.num_params(), 429 * 256 + 256 + 256 * 128 + 128 + 128 + 1);
        assert_eq!(s.init_params(7), s.init_params(7));
        assert_ne!(s.init_params(7), s.init_params(8));
        assert_eq!(s.offsets(), vec![(0, 429 * 256), (429 * 256 + 256, 429 * 256 + 256 + 256 * 128), (429 * 256 + 256 + 256 * 128 + 128, 429 * 256 + 256 + 256 * 128 + 128 + 128)]);
        assert!(Mlp::new(&CpuDevice::new(1), s.clone(), &[0.0; 3]).err().unwrap().to_string().contains("3 parameters given"));
    }
}
