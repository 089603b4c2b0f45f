//! [`Net`]: the dense network of any [`ModelSpec`] on a [`Device`] — the flat parameters,
//! one gradient buffer per parameter group, and the model's parts: [`Layers`] for every MLP,
//! [`Dlrm`] (bottom MLP, dot interaction, top MLP), [`Dcn`] (cross network and deep MLP),
//! [`Fm`] (first order, factorisation machine, linear part and deep MLP).
//!
//! Forward reads the gathered input `x` (batch x [`ModelSpec::layout`] width) and the dense
//! features (batch x n) and leaves one logit per sample. Backward, from the logits'
//! gradient, hands each group's gradient out as soon as it is final, last group first
//! (`ready(g, gradient)`, as [`super::Mlp::backward`] hands out layers), and writes the
//! input gradient `dx` (batch x layout width: the embedding columns, and for deepfm /
//! wide-deep each field's first-order weight column) that the per-key sum reads.

use super::cross::Dcn;
use super::fm::Fm;
use super::interaction::Dlrm;
use super::layers::Layers;
use super::optim::Optimizer;
use super::spec::{Group, ModelKind, ModelSpec};
use crate::device::{Device, DeviceError, DeviceResult};

/// The gradient buffers of the groups; `None` while one is handed out.
pub struct Grads<D: Device>(Vec<Option<D::Buf<f32>>>);

impl<D: Device> Grads<D> {
    /// Takes group `g`'s buffer to fill (an error while it is handed out).
    pub fn take(&mut self, g: usize) -> DeviceResult<D::Buf<f32>> {
        self.0.get_mut(g).and_then(Option::take).ok_or_else(|| lent(g))
    }
    /// Group `g`'s buffer, unless it is handed out.
    pub fn get(&self, g: usize) -> Option<&D::Buf<f32>> {
        self.0.get(g).and_then(Option::as_ref)
    }
}

/// What a model part's backward works with: the device, the flat parameters, the groups'
/// gradient buffers, and where each finished group goes (`ready(g, gradient)`).
pub struct Backward<'a, D: Device> {
    /// The device.
    pub dev: &'a D,
    /// The flat parameters.
    pub params: &'a D::Buf<f32>,
    /// The groups' gradient buffers.
    pub grads: &'a mut Grads<D>,
    /// Takes each group's gradient as soon as it is final.
    pub ready: &'a mut dyn FnMut(usize, D::Buf<f32>) -> DeviceResult<()>,
}

impl<D: Device> Backward<'_, D> {
    /// Runs `layers`' backward with its layer `l` as group `first + l` (see
    /// [`Layers::backward`]).
    pub fn layers(&mut self, layers: &mut Layers<D>, first: usize, x: &D::Buf<f32>, dx: Option<&mut D::Buf<f32>>, batch: usize) -> DeviceResult<()> {
        let (grads, ready) = (&mut *self.grads, &mut *self.ready);
        layers.backward(self.dev, self.params, x, dx, batch, &mut |l| grads.take(first + l), &mut |l, g| ready(first + l, g))
    }
    /// Takes group `g`'s buffer to fill.
    pub fn take(&mut self, g: usize) -> DeviceResult<D::Buf<f32>> {
        self.grads.take(g)
    }
    /// Hands group `g`'s finished gradient out.
    pub fn done(&mut self, g: usize, grad: D::Buf<f32>) -> DeviceResult<()> {
        (self.ready)(g, grad)
    }
}

/// The MLP layers of `widths` (input first, the last width 1 added) from group `first` of
/// `groups`.
pub(super) fn mlp_at<D: Device>(dev: &D, groups: &[Group], first: usize, widths: Vec<usize>, relu_last: bool) -> DeviceResult<Layers<D>> {
    let base = groups.get(first).map(|g| g.offset).ok_or_else(|| DeviceError::refused("building the model", format!("no parameter group {first}")))?;
    Layers::new(dev, widths, base, relu_last)
}

/// The parts of a model.
enum Body<D: Device> {
    Mlp(Layers<D>),
    Dlrm(Dlrm<D>),
    Dcn(Dcn<D>),
    Fm(Fm<D>),
}

/// A model's dense network (see the module docs).
pub struct Net<D: Device> {
    spec: ModelSpec,
    groups: Vec<Group>,
    params: D::Buf<f32>,
    grads: Grads<D>,
    body: Body<D>,
}

impl<D: Device> Net<D> {
    /// The network of `spec` with parameters `params` (the flat layout of
    /// [`ModelSpec::groups`]) on `dev`.
    pub fn new(dev: &D, spec: ModelSpec, params: &[f32]) -> DeviceResult<Net<D>> {
        if let Some(why) = spec.check() {
            return Err(DeviceError::refused("building the model", why));
        }
        if params.len() != spec.num_params() {
            return Err(DeviceError::refused("building the model", format!("{} parameters given, the model has {}", params.len(), spec.num_params())));
        }
        let groups = spec.groups();
        let body = match spec.kind {
            ModelKind::Mlp => Body::Mlp(mlp_at(dev, &groups, 0, spec.deep_widths(), false)?),
            ModelKind::Dlrm => Body::Dlrm(Dlrm::new(dev, &spec, &groups)?),
            ModelKind::Dcn => Body::Dcn(Dcn::new(dev, &spec, &groups)?),
            ModelKind::DeepFm | ModelKind::WideDeep => Body::Fm(Fm::new(dev, &spec, &groups)?),
        };
        let grads = Grads(groups.iter().map(|g| dev.alloc(g.len()).map(Some)).collect::<DeviceResult<_>>()?);
        Ok(Net { params: dev.buffer_from(params)?, grads, body, groups, spec })
    }

    /// The model.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }
    /// The parameter groups.
    pub fn groups(&self) -> &[Group] {
        &self.groups
    }
    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.groups.last().map_or(0, |g| g.range().end)
    }
    /// Multiply-adds x 2 per sample for forward + backward (weights and inputs gradients)
    /// of the GEMMs: every group's matrices (all its rows but the biases).
    pub fn flops_per_sample(&self) -> f64 {
        6.0 * self.groups.iter().map(|g| ((g.rows - 1) * g.cols) as f64).sum::<f64>()
    }
    /// The flat parameters.
    pub fn params(&self) -> &D::Buf<f32> {
        &self.params
    }
    /// The flat parameters, to overwrite.
    pub fn params_mut(&mut self) -> &mut D::Buf<f32> {
        &mut self.params
    }
    /// The gradient buffers.
    pub fn grads(&self) -> &Grads<D> {
        &self.grads
    }
    /// Takes group `g`'s gradient buffer back after it was handed out; an error for a
    /// group the model does not have.
    pub fn put_grad(&mut self, g: usize, buf: D::Buf<f32>) -> DeviceResult<()> {
        match self.grads.0.get_mut(g) {
            Some(slot) => {
                *slot = Some(buf);
                Ok(())
            }
            None => Err(DeviceError::refused("taking a gradient back", format!("the model has no layer {g}"))),
        }
    }

    /// One step of `opt` on the parameters with every group's gradient, each group one
    /// range; an error while a gradient is handed out.
    pub fn update(&mut self, dev: &D, opt: &mut Optimizer<D>) -> DeviceResult<()> {
        let mut ranges = Vec::with_capacity(self.groups.len());
        for (g, group) in self.groups.iter().enumerate() {
            ranges.push((group.range(), self.grads.get(g).ok_or_else(|| lent(g))?));
        }
        opt.step(dev, &mut self.params, &ranges)
    }

    /// The logits of the last forward (batch values).
    pub fn output(&self) -> &D::Buf<f32> {
        match &self.body {
            Body::Mlp(l) => l.output(),
            Body::Dlrm(m) => m.output(),
            Body::Dcn(m) => m.output(),
            Body::Fm(m) => m.output(),
        }
    }
    /// The logits and their gradient's buffer (the loss writes it before [`Net::backward`]).
    pub fn output_and_delta(&mut self) -> (&D::Buf<f32>, &mut D::Buf<f32>) {
        match &mut self.body {
            Body::Mlp(l) => l.output_and_delta(),
            Body::Dlrm(m) => m.output_and_delta(),
            Body::Dcn(m) => m.output_and_delta(),
            Body::Fm(m) => m.output_and_delta(),
        }
    }

    /// Forward of `batch` samples: the gathered input `x` and the dense features `dense`.
    pub fn forward(&mut self, dev: &D, x: &D::Buf<f32>, dense: &D::Buf<f32>, batch: usize) -> DeviceResult<()> {
        let p = &self.params;
        match &mut self.body {
            Body::Mlp(l) => l.forward(dev, p, x, batch),
            Body::Dlrm(m) => m.forward(dev, p, x, dense, batch),
            Body::Dcn(m) => m.forward(dev, p, x, batch),
            Body::Fm(m) => m.forward(dev, p, x, dense, batch),
        }
    }

    /// Backward of the last forward from the logits' gradient (see the module docs).
    pub fn backward(&mut self, dev: &D, x: &D::Buf<f32>, dense: &D::Buf<f32>, dx: &mut D::Buf<f32>, batch: usize, ready: &mut dyn FnMut(usize, D::Buf<f32>) -> DeviceResult<()>) -> DeviceResult<()> {
        let mut bw = Backward { dev, params: &self.params, grads: &mut self.grads, ready };
        match &mut self.body {
            Body::Mlp(l) => bw.layers(l, 0, x, Some(dx), batch),
            Body::Dlrm(m) => m.backward(&mut bw, dense, dx, batch),
            Body::Dcn(m) => m.backward(&mut bw, x, dx, batch),
            Body::Fm(m) => m.backward(&mut bw, dense, dx, batch),
        }
    }
}

fn lent(g: usize) -> DeviceError {
    DeviceError::refused("a dense step", format!("the gradient of layer {g} is still being reduced (give it back before the next step)"))
}

/// Replaces device buffer `b` with a zeroed one of `n` elements when it holds fewer.
pub(super) fn grow<D: Device>(dev: &D, b: &mut D::Buf<f32>, n: usize) -> DeviceResult<()> {
    if dev.len(b) < n {
        *b = dev.alloc(n)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{CpuDevice, Op};
    use crate::hash::splitmix64_next;
    use crate::model::spec::CrossStructure;

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = seed;
        (0..n).map(|_| (splitmix64_next(&mut rng) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0).collect()
    }

    /// Small versions of every model (and every DCN variant, DLRM with self-interaction).
    pub(crate) fn small_specs() -> Vec<ModelSpec> {
        let base = ModelSpec { bottom: vec![3], cross_layers: 2, ..ModelSpec::mlp(3, 2, 2, vec![4]) };
        let mut v = vec![base.clone()];
        v.push(ModelSpec { kind: ModelKind::Dlrm, ..base.clone() });
        v.push(ModelSpec { kind: ModelKind::Dlrm, interaction_self: true, ..base.clone() });
        for (rank, structure) in [(0, CrossStructure::Stacked), (2, CrossStructure::Stacked), (0, CrossStructure::Parallel), (2, CrossStructure::Parallel)] {
            v.push(ModelSpec { kind: ModelKind::Dcn, cross_rank: rank, cross_structure: structure, ..base.clone() });
        }
        v.push(ModelSpec { kind: ModelKind::DeepFm, ..base.clone() });
        v.push(ModelSpec { kind: ModelKind::WideDeep, ..base.clone() });
        v.push(ModelSpec { kind: ModelKind::WideDeep, fields: 1, dim: 5, field_dims: vec![2, 3], ..base });
        v
    }

    /// A batch's input rows (dense features in their columns too) and dense features.
    fn inputs(spec: &ModelSpec, batch: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let width = spec.layout().width();
        let dense = random(batch * spec.ndense, seed + 1);
        let mut x: Vec<f32> = random(batch * width, seed).iter().map(|v| v * 0.8).collect();
        let at = width - spec.ndense;
        for r in 0..batch {
            x[r * width + at..(r + 1) * width].copy_from_slice(&dense[r * spec.ndense..(r + 1) * spec.ndense]);
        }
        (x, dense)
    }

    /// Forward + BCE sum + backward: (loss, the groups' gradients in flat order, dx, the
    /// order the groups were handed out in).
    fn step(dev: &CpuDevice, net: &mut Net<CpuDevice>, x: &[f32], dense: &[f32], y: &[f32], batch: usize) -> (f64, Vec<f32>, Vec<f32>, Vec<usize>) {
        let (x, dense) = (x.to_vec(), dense.to_vec());
        net.forward(dev, &x, &dense, batch).unwrap();
        let (mut loss, mut sum) = (vec![0f32; batch], vec![0f32; 1]);
        let (z, delta) = net.output_and_delta();
        dev.exec(Op::BceWithLogits { z, y: &y.to_vec(), loss: &mut loss, delta, n: batch, scale: 1.0 }).unwrap();
        dev.exec(Op::Sum { x: &loss, n: batch, out: &mut sum, at: 0 }).unwrap();
        let mut dx = vec![0f32; x.len()];
        let mut got = vec![Vec::new(); net.groups().len()];
        let mut order = Vec::new();
        net.backward(dev, &x, &dense, &mut dx, batch, &mut |g, buf| {
            order.push(g);
            got[g] = buf;
            Ok(())
        })
        .unwrap();
        let mut flat = Vec::new();
        for (g, buf) in got.into_iter().enumerate() {
            flat.extend_from_slice(&buf);
            net.put_grad(g, buf).unwrap();
        }
        (sum[0] as f64, flat, dx, order)
    }

    fn loss_of(dev: &CpuDevice, spec: &ModelSpec, p: &[f32], x: &[f32], dense: &[f32], y: &[f32], batch: usize) -> f64 {
        let mut net = Net::new(dev, spec.clone(), p).unwrap();
        step(dev, &mut net, x, dense, y, batch).0
    }

    /// Central differences at two step sizes; where they disagree a ReLU kink lies in
    /// between and the point is skipped. Returns the points skipped.
    fn check(what: &str, values: &mut [f32], at: &[usize], want: &[f32], loss: &mut dyn FnMut(&[f32]) -> f64) -> usize {
        let mut skipped = 0;
        for (&i, &want) in at.iter().zip(want) {
            let orig = values[i];
            let mut fds = [0f32; 2];
            for (j, h) in [1e-2f32, 5e-3].into_iter().enumerate() {
                values[i] = orig + h;
                let up = loss(values);
                values[i] = orig - h;
                let down = loss(values);
                fds[j] = ((up - down) / (2.0 * h as f64)) as f32;
            }
            values[i] = orig;
            if (fds[0] - fds[1]).abs() > 1e-3 * (1.0 + fds[1].abs()) {
                skipped += 1;
                continue;
            }
            assert!((fds[1] - want).abs() <= 3e-3 * (1.0 + fds[1].abs()), "{what} {i}: fd {fds:?} vs {want}");
        }
        skipped
    }

    #[test]
    fn every_model_s_gradients_match_finite_differences() {
        let dev = CpuDevice::new(1);
        let batch = 5;
        let y: Vec<f32> = (0..batch).map(|i| (i % 2) as f32).collect();
        for spec in small_specs() {
            let what = spec.describe();
            // Biases and the linear part away from zero, so every term is exercised.
            let params: Vec<f32> = spec.init_params(11).iter().zip(random(spec.num_params(), 12)).map(|(p, r)| p + 0.1 * r).collect();
            let (x, dense) = inputs(&spec, batch, 21);
            let mut net = Net::new(&dev, spec.clone(), &params).unwrap();
            let (_, g, dx, order) = step(&dev, &mut net, &x, &dense, &y, batch);
            let groups = spec.groups().len();
            assert_eq!(order, (0..groups).rev().collect::<Vec<_>>(), "{what}: groups handed out last first");
            let all: Vec<usize> = (0..params.len()).collect();
            let mut p = params.clone();
            let skipped = check(&format!("{what}: param"), &mut p, &all, &g, &mut |p| loss_of(&dev, &spec, p, &x, &dense, &y, batch));
            assert!(skipped <= params.len() / 10, "{what}: {skipped} kinks");
            // The embedding (and first-order) columns of the input: what the table learns.
            let width = spec.layout().width();
            let emb = width - spec.ndense;
            let cols: Vec<usize> = (0..x.len()).filter(|i| i % width < emb).collect();
            let want: Vec<f32> = cols.iter().map(|i| dx[*i]).collect();
            let mut xp = x.clone();
            let skipped = check(&format!("{what}: input"), &mut xp, &cols, &want, &mut |x| loss_of(&dev, &spec, &params, x, &dense, &y, batch));
            assert!(skipped <= cols.len() / 10, "{what}: {skipped} input kinks");
        }
    }

    #[test]
    fn threads_agree_with_one_thread_for_every_model() {
        let (d1, d3) = (CpuDevice::new(1), CpuDevice::new(3));
        let batch = 40;
        let y: Vec<f32> = (0..batch).map(|i| (i % 3 == 0) as u8 as f32).collect();
        for spec in small_specs() {
            let params = spec.init_params(3);
            let (x, dense) = inputs(&spec, batch, 5);
            let mut one = Net::new(&d1, spec.clone(), &params).unwrap();
            let mut three = Net::new(&d3, spec.clone(), &params).unwrap();
            let (l1, g1, dx1, _) = step(&d1, &mut one, &x, &dense, &y, batch);
            let (l3, g3, dx3, _) = step(&d3, &mut three, &x, &dense, &y, batch);
            let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(p, q)| (p - q).abs() <= 1e-5 * (1.0 + p.abs()));
            assert!((l1 - l3).abs() < 1e-4 && close(&g1, &g3) && close(&dx1, &dx3), "{}", spec.describe());
        }
    }

    #[test]
    fn the_mlp_net_is_the_mlp() {
        let dev = CpuDevice::new(2);
        let spec = ModelSpec::mlp(3, 2, 2, vec![5, 4]);
        let params = spec.init_params(9);
        let (batch, y) = (7, vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]);
        let (x, dense) = inputs(&spec, batch, 1);
        let mut net = Net::new(&dev, spec.clone(), &params).unwrap();
        let (_, g, dx, _) = step(&dev, &mut net, &x, &dense, &y, batch);
        let mut mlp = crate::model::Mlp::new(&dev, crate::model::MlpShape { input: spec.concat_width(), hidden: spec.hidden.clone() }, &params).unwrap();
        mlp.forward(&dev, &x, batch).unwrap();
        let (mut loss, (z, delta)) = (vec![0f32; batch], mlp.output_and_delta());
        dev.exec(Op::BceWithLogits { z, y: &y, loss: &mut loss, delta, n: batch, scale: 1.0 }).unwrap();
        let (mut dx2, mut g2) = (vec![0f32; x.len()], vec![Vec::new(); 3]);
        mlp.backward(&dev, &x, &mut dx2, batch, &mut |l, b| {
            g2[l] = b;
            Ok(())
        })
        .unwrap();
        assert_eq!((g, dx), (g2.concat(), dx2));
    }
}
