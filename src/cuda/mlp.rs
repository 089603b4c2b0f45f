//! [`DeviceMlp`]: the CTR model's dense part on a [`Device`] — parameters, activations,
//! gradients and optimizer state in device memory, GEMMs through cuBLAS, everything else in
//! the kernels of kernels/*.cu.
//!
//! It computes what [`crate::model::Mlp`] + [`crate::model::DenseOptimState`] compute on the
//! CPU, with the same parameter layout (per layer `W` (in x out, row-major) then `b`), so
//! checkpoints and the initial broadcast are interchangeable between the paths.
//!
//! **Embeddings across the bus.** A batch is *staged* in page-locked host memory: the
//! trainer looks the unique keys' rows up from the host-shared table straight into the
//! staging buffer ([`DeviceMlp::stage`]), with the batch's `inverse` map, labels and dense
//! features. [`DeviceMlp::step`] uploads it asynchronously, gathers the input on the
//! device, runs forward and backward, reduces the input gradient per unique key on the
//! device and starts copying those rows back. There are two staging slots used in turn,
//! so the next batch is staged (its lookup included) while the device still works on the
//! current one: waiting for a slot only waits for copies two steps old.
//!
//! **Gradients.** Each layer's gradient lives in its own device buffer, handed to the
//! caller's `ready` callback as soon as backward finished it (last layer first) so its
//! allreduce (NCCL, on its own stream) overlaps the layers below. Layer 0's buffer carries
//! one extra value, the batch's loss sum, so the allreduce that averages the gradient also
//! sums the loss: no extra collective per step.

use super::device::{Device, DeviceResult, Direction};
use super::plan::row_major;
use super::CudaError;
use crate::model::input::InputLayout;
use crate::model::optim::{adam_factors, BETA1, BETA2};
use crate::model::{DenseOptimState, DenseOptimizer, MlpShape};

/// What [`DeviceMlp::step`] calls with each layer's finished gradient: (the device, the
/// layer, its gradient buffer).
pub type LayerReady<'a, D> = dyn FnMut(&D, usize, &mut <D as Device>::F32) -> DeviceResult<()> + 'a;

/// One staging slot: the batch in page-locked host memory.
struct Stage<D: Device> {
    emb: D::HostF32,
    inverse: D::HostU32,
    dense: D::HostF32,
    labels: D::HostF32,
    offsets: D::HostU32,
    slots: D::HostU32,
    /// (samples, unique keys) staged here and not yet run.
    staged: Option<(usize, usize)>,
}

/// Host-side views of a staging slot, sized for the batch, for the caller to fill.
pub struct StageMut<'a> {
    /// Rows of the batch's unique keys (keys x dim): look them up into this.
    pub emb: &'a mut [f32],
    /// `inverse[s * fields + f]`: the row in `emb` of sample s's field f.
    pub inverse: &'a mut [u32],
    /// Dense features (batch x ndense).
    pub dense: &'a mut [f32],
    /// Labels (batch).
    pub labels: &'a mut [f32],
}

/// The dense model on a device (see the module docs).
pub struct DeviceMlp<D: Device> {
    dev: D,
    widths: Vec<usize>,
    /// (weight offset, bias offset) per layer in the flat parameter vector.
    offsets: Vec<(usize, usize)>,
    nparams: usize,
    fields: usize,
    dim: usize,
    ndense: usize,
    params: D::F32,
    /// Per layer: W gradient then b gradient; layer 0 has the loss sum after them.
    grads: Vec<D::F32>,
    opt: DenseOptimState,
    m: D::F32,
    v: D::F32,
    /// Samples and keys the buffers below hold.
    cap: (usize, usize),
    /// acts[0] = input x; acts[l] = layer l's output.
    acts: Vec<D::F32>,
    /// deltas[0] = input gradient dx; deltas[l] = gradient of layer l's output.
    deltas: Vec<D::F32>,
    loss: D::F32,
    emb: D::F32,
    inverse: D::U32,
    dense: D::F32,
    labels: D::F32,
    csr_offsets: D::U32,
    csr_slots: D::U32,
    key_grads: D::F32,
    key_grads_host: D::HostF32,
    stages: [Stage<D>; 2],
    /// The slot `stage` fills next.
    fill: usize,
    /// Samples and keys of the batch `step` ran last (what `key_grads` and `predict` refer to).
    last: (usize, usize),
    /// Scratch of the CSR build: each key's next free slot.
    csr_next: Vec<u32>,
}

impl<D: Device> DeviceMlp<D> {
    /// The model of `shape` over inputs laid out as `layout` on `dev`, with the parameters
    /// `params` (the CPU model's flat layout) and a fresh optimizer state.
    pub fn new(dev: D, shape: &MlpShape, layout: InputLayout, params: &[f32], optimizer: DenseOptimizer, lr: f32) -> DeviceResult<DeviceMlp<D>> {
        let InputLayout { fields, dim, ndense } = layout;
        let widths = shape.widths();
        if widths[0] != layout.width() {
            return Err(CudaError::Call { what: "building the GPU model".into(), detail: format!("input width {} is not {fields} fields x dim {dim} + {ndense} dense", widths[0]) });
        }
        let mut offsets = Vec::new();
        let mut at = 0;
        for p in widths.windows(2) {
            offsets.push((at, at + p[0] * p[1]));
            at += p[0] * p[1] + p[1];
        }
        if params.len() != at {
            return Err(CudaError::Call { what: "building the GPU model".into(), detail: format!("{} parameters given, the shape has {at}", params.len()) });
        }
        let mut p = dev.zeros_f32(at)?;
        dev.write_f32(params, &mut p, 0)?;
        let grads = widths.windows(2).enumerate().map(|(l, w)| dev.zeros_f32(w[0] * w[1] + w[1] + usize::from(l == 0))).collect::<DeviceResult<Vec<_>>>()?;
        let moments = if optimizer == DenseOptimizer::Adam { at } else { 0 };
        let stage = |dev: &D| -> DeviceResult<Stage<D>> {
            Ok(Stage {
                emb: dev.staging_f32(0, Direction::ToDevice)?,
                inverse: dev.staging_u32(0)?,
                dense: dev.staging_f32(0, Direction::ToDevice)?,
                labels: dev.staging_f32(0, Direction::ToDevice)?,
                offsets: dev.staging_u32(0)?,
                slots: dev.staging_u32(0)?,
                staged: None,
            })
        };
        let stages = [stage(&dev)?, stage(&dev)?];
        Ok(DeviceMlp {
            m: dev.zeros_f32(moments)?,
            v: dev.zeros_f32(moments)?,
            acts: Vec::new(),
            deltas: Vec::new(),
            loss: dev.zeros_f32(0)?,
            emb: dev.zeros_f32(0)?,
            inverse: dev.zeros_u32(0)?,
            dense: dev.zeros_f32(0)?,
            labels: dev.zeros_f32(0)?,
            csr_offsets: dev.zeros_u32(0)?,
            csr_slots: dev.zeros_u32(0)?,
            key_grads: dev.zeros_f32(0)?,
            key_grads_host: dev.staging_f32(0, Direction::FromDevice)?,
            stages,
            fill: 0,
            last: (0, 0),
            csr_next: Vec::new(),
            cap: (0, 0),
            params: p,
            grads,
            opt: DenseOptimState { kind: optimizer, lr, step: 0, m: Vec::new(), v: Vec::new() },
            widths,
            offsets,
            nparams: at,
            fields,
            dim,
            ndense,
            dev,
        })
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.dev
    }
    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.nparams
    }
    /// Number of layers (weight matrices).
    pub fn num_layers(&self) -> usize {
        self.offsets.len()
    }
    /// Values in layer `l`'s gradient buffer: its parameters, plus the loss sum on layer 0.
    pub fn grad_len(&self, l: usize) -> usize {
        self.layer_range(l).len() + usize::from(l == 0)
    }
    /// Layer `l`'s parameters in the flat vector: its weights, then its biases.
    pub fn layer_range(&self, l: usize) -> std::ops::Range<usize> {
        self.offsets[l].0..self.offsets[l].1 + self.widths[l + 1]
    }

    /// Grows the device buffers to hold `batch` samples with `keys` unique keys.
    fn ensure(&mut self, batch: usize, keys: usize) -> DeviceResult<()> {
        if batch <= self.cap.0 && keys <= self.cap.1 {
            return Ok(());
        }
        let (b, k) = (batch.max(self.cap.0), keys.max(self.cap.1));
        let dev = &self.dev;
        self.acts = self.widths.iter().map(|w| dev.zeros_f32(b * w)).collect::<DeviceResult<_>>()?;
        self.deltas = self.widths.iter().map(|w| dev.zeros_f32(b * w)).collect::<DeviceResult<_>>()?;
        self.loss = dev.zeros_f32(b)?;
        self.emb = dev.zeros_f32(k * self.dim)?;
        self.inverse = dev.zeros_u32(b * self.fields)?;
        self.dense = dev.zeros_f32(b * self.ndense)?;
        self.labels = dev.zeros_f32(b)?;
        self.csr_offsets = dev.zeros_u32(k + 1)?;
        self.csr_slots = dev.zeros_u32(b * self.fields)?;
        self.key_grads = dev.zeros_f32(k * self.dim)?;
        self.key_grads_host = dev.staging_f32(k * self.dim, Direction::FromDevice)?;
        self.cap = (b, k);
        Ok(())
    }

    /// The staging slot for the next batch of `batch` samples and `keys` unique keys, to
    /// fill. Waits only for copies out of this slot two batches ago.
    pub fn stage(&mut self, batch: usize, keys: usize) -> DeviceResult<StageMut<'_>> {
        let (fields, dim, ndense) = (self.fields, self.dim, self.ndense);
        let dev = &self.dev;
        let st = &mut self.stages[self.fill];
        let grow_f32 = |h: &mut D::HostF32, n: usize, dev: &D| -> DeviceResult<()> {
            if dev.host_f32(h)?.len() < n {
                *h = dev.staging_f32(n, Direction::ToDevice)?;
            }
            Ok(())
        };
        let grow_u32 = |h: &mut D::HostU32, n: usize, dev: &D| -> DeviceResult<()> {
            if dev.host_u32(h)?.len() < n {
                *h = dev.staging_u32(n)?;
            }
            Ok(())
        };
        grow_f32(&mut st.emb, keys * dim, dev)?;
        grow_u32(&mut st.inverse, batch * fields, dev)?;
        grow_f32(&mut st.dense, batch * ndense, dev)?;
        grow_f32(&mut st.labels, batch, dev)?;
        grow_u32(&mut st.offsets, keys + 1, dev)?;
        grow_u32(&mut st.slots, batch * fields, dev)?;
        st.staged = Some((batch, keys));
        Ok(StageMut {
            emb: &mut dev.host_f32(&mut st.emb)?[..keys * dim],
            inverse: &mut dev.host_u32(&mut st.inverse)?[..batch * fields],
            dense: &mut dev.host_f32(&mut st.dense)?[..batch * ndense],
            labels: &mut dev.host_f32(&mut st.labels)?[..batch],
        })
    }

    /// Uploads the staged batch (checking its inverse map and building the per-key CSR
    /// lists on the host) and flips to the other staging slot. Returns (samples, keys).
    fn upload_staged(&mut self) -> DeviceResult<(usize, usize)> {
        let slot = self.fill;
        let (batch, keys) = self.stages[slot].staged.take().ok_or_else(|| CudaError::Call { what: "a GPU step".into(), detail: "no batch was staged (call stage() first)".into() })?;
        self.ensure(batch, keys)?;
        let fields = self.fields;
        let dev = &self.dev;
        let st = &mut self.stages[slot];
        {
            // CSR of each key's (sample, field) slots, in slot order: the CPU path's
            // summation order (crate::model::input::scatter_key_grads).
            let inverse = &dev.host_u32(&mut st.inverse)?[..batch * fields];
            if let Some(bad) = inverse.iter().find(|u| **u as usize >= keys) {
                return Err(CudaError::Call { what: "staging a batch".into(), detail: format!("inverse names row {bad} of {keys} unique keys") });
            }
            let offsets = &mut dev.host_u32(&mut st.offsets)?[..keys + 1];
            offsets.fill(0);
            for u in inverse {
                offsets[*u as usize + 1] += 1;
            }
            for u in 0..keys {
                offsets[u + 1] += offsets[u];
            }
            let slots = &mut dev.host_u32(&mut st.slots)?[..batch * fields];
            let next = &mut self.csr_next;
            next.clear();
            next.extend_from_slice(&offsets[..keys]);
            for (p, u) in inverse.iter().enumerate() {
                let at = &mut next[*u as usize];
                slots[*at as usize] = p as u32;
                *at += 1;
            }
        }
        dev.upload_f32(&st.emb, keys * self.dim, &mut self.emb)?;
        dev.upload_u32(&st.inverse, batch * fields, &mut self.inverse)?;
        dev.upload_f32(&st.dense, batch * self.ndense, &mut self.dense)?;
        dev.upload_f32(&st.labels, batch, &mut self.labels)?;
        dev.upload_u32(&st.offsets, keys + 1, &mut self.csr_offsets)?;
        dev.upload_u32(&st.slots, batch * fields, &mut self.csr_slots)?;
        self.fill = 1 - slot;
        self.last = (batch, keys);
        Ok((batch, keys))
    }

    /// Input gather and forward of `batch` samples; the logits end in `acts[last]`.
    fn forward(&mut self, batch: usize) -> DeviceResult<()> {
        let dev = &self.dev;
        dev.gather_input(&self.emb, &self.inverse, &self.dense, &mut self.acts[0], batch, self.fields, self.dim, self.ndense)?;
        let last = self.offsets.len() - 1;
        for l in 0..=last {
            let (fan_in, fan_out) = (self.widths[l], self.widths[l + 1]);
            let (w, b) = self.offsets[l];
            let (lo, hi) = self.acts.split_at_mut(l + 1);
            // z = input * W (row-major), then bias (+ ReLU on hidden layers).
            dev.gemm(&row_major(batch, fan_out, fan_in, false, false), (&self.params, w), (&lo[l], 0), (&mut hi[0], 0))?;
            dev.bias_act(&mut hi[0], (&self.params, b), batch, fan_out, l < last)?;
        }
        Ok(())
    }

    /// One training step on the staged batch: upload, forward, loss (scaled by
    /// `loss_scale`, as [`crate::model::Mlp::forward_backward`]), backward. Calls
    /// `ready(l, gradient buffer of layer l)` as each layer's gradient is final, last layer
    /// first (layer 0's buffer ends with the batch's unscaled loss sum), with the device to
    /// queue work on; then reduces the
    /// input gradient per unique key and starts copying it to the host
    /// ([`DeviceMlp::key_grads`]). The optimizer runs in [`DeviceMlp::apply`].
    pub fn step(&mut self, loss_scale: f32, ready: &mut LayerReady<'_, D>) -> DeviceResult<()> {
        let (batch, keys) = self.upload_staged()?;
        self.forward(batch)?;
        let dev = &self.dev;
        let layers = self.offsets.len();
        let n0 = self.widths[0] * self.widths[1] + self.widths[1];
        dev.bce_loss(&self.acts[layers], &self.labels, &mut self.loss, &mut self.deltas[layers], batch, loss_scale)?;
        dev.loss_sum(&self.loss, batch, (&mut self.grads[0], n0))?;
        for l in (0..layers).rev() {
            let (fan_in, fan_out) = (self.widths[l], self.widths[l + 1]);
            let (w, _) = self.offsets[l];
            let (lo, hi) = self.deltas.split_at_mut(l + 1);
            let delta = &hi[0];
            // dW = input^T delta; db = column sums of delta.
            dev.gemm(&row_major(fan_in, fan_out, batch, true, false), (delta, 0), (&self.acts[l], 0), (&mut self.grads[l], 0))?;
            dev.bias_grad(delta, (&mut self.grads[l], fan_in * fan_out), batch, fan_out)?;
            // d(input) = delta W^T, through the ReLU of the layer below.
            dev.gemm(&row_major(batch, fan_in, fan_out, false, true), (&self.params, w), (delta, 0), (&mut lo[l], 0))?;
            if l > 0 {
                dev.relu_backward(&mut lo[l], &self.acts[l], batch * fan_in)?;
            }
            ready(dev, l, &mut self.grads[l])?;
        }
        let width = self.widths[0];
        dev.key_grad_reduce(&self.deltas[0], &self.csr_offsets, &self.csr_slots, &mut self.key_grads, keys, batch, self.fields, self.dim, width)?;
        dev.download_f32(&self.key_grads, keys * self.dim, &mut self.key_grads_host)
    }

    /// The last step's gradient rows of its unique keys (keys x dim, in the staged key
    /// order), once their copy to the host has finished.
    pub fn key_grads(&mut self) -> DeviceResult<&[f32]> {
        let n = self.last.1 * self.dim;
        Ok(&self.dev.host_f32(&mut self.key_grads_host)?[..n])
    }

    /// The last step's loss sum as it is now in layer 0's gradient buffer: the batch's own
    /// before the allreduce, the global one after. Waits for the device.
    pub fn loss_sum(&self) -> DeviceResult<f64> {
        let n0 = self.widths[0] * self.widths[1] + self.widths[1];
        let mut v = [0f32];
        self.dev.read_f32(&self.grads[0], n0, &mut v)?;
        Ok(v[0] as f64)
    }

    /// The device and layer `l`'s gradient buffer (W, then b; layer 0 then the loss sum),
    /// to reduce it across ranks after [`DeviceMlp::step`] other than in its callback.
    pub fn layer_grad_mut(&mut self, l: usize) -> (&D, &mut D::F32) {
        (&self.dev, &mut self.grads[l])
    }

    /// The optimizer step with the (allreduced) gradients, layer by layer, on the device.
    pub fn apply(&mut self) -> DeviceResult<()> {
        self.opt.step += 1;
        let (alpha, eps_hat) = adam_factors(self.opt.lr, self.opt.step);
        for l in 0..self.offsets.len() {
            let r = self.layer_range(l);
            match self.opt.kind {
                DenseOptimizer::Sgd => self.dev.sgd_update((&mut self.params, r.start), &self.grads[l], self.opt.lr, r.len())?,
                DenseOptimizer::Adam => self.dev.adam_update((&mut self.params, r.start), &self.grads[l], &mut self.m, &mut self.v, alpha, BETA1, BETA2, eps_hat, r.len())?,
            }
        }
        Ok(())
    }

    /// Logits of the staged batch (inference: no gradients), written into `out[..batch]`.
    pub fn predict(&mut self, out: &mut [f32]) -> DeviceResult<usize> {
        let (batch, _) = self.upload_staged()?;
        self.forward(batch)?;
        let last = self.offsets.len();
        self.dev.read_f32(&self.acts[last], 0, &mut out[..batch])?;
        Ok(batch)
    }

    /// The parameters, copied to the host (waits).
    pub fn params(&self) -> DeviceResult<Vec<f32>> {
        let mut p = vec![0f32; self.nparams];
        self.dev.read_f32(&self.params, 0, &mut p)?;
        Ok(p)
    }

    /// Replaces the parameters.
    pub fn set_params(&mut self, p: &[f32]) -> DeviceResult<()> {
        if p.len() != self.nparams {
            return Err(CudaError::Call { what: "setting the GPU model's parameters".into(), detail: format!("{} values for {} parameters", p.len(), self.nparams) });
        }
        self.dev.write_f32(p, &mut self.params, 0)
    }

    /// The optimizer state with its moments copied to the host (checkpoints).
    pub fn optim_state(&self) -> DeviceResult<DenseOptimState> {
        let mut s = self.opt.clone();
        if s.kind == DenseOptimizer::Adam {
            s.m = vec![0f32; self.nparams];
            s.v = vec![0f32; self.nparams];
            self.dev.read_f32(&self.m, 0, &mut s.m)?;
            self.dev.read_f32(&self.v, 0, &mut s.v)?;
        }
        Ok(s)
    }

    /// Replaces the optimizer state (resume).
    pub fn set_optim_state(&mut self, s: &DenseOptimState) -> DeviceResult<()> {
        if s.kind != self.opt.kind {
            return Err(CudaError::Call { what: "restoring the optimizer".into(), detail: format!("state of {:?}, model uses {:?}", s.kind, self.opt.kind) });
        }
        if s.kind == DenseOptimizer::Adam {
            if s.m.len() != self.nparams || s.v.len() != self.nparams {
                return Err(CudaError::Call { what: "restoring the optimizer".into(), detail: format!("moments of {} values for {} parameters", s.m.len(), self.nparams) });
            }
            self.dev.write_f32(&s.m, &mut self.m, 0)?;
            self.dev.write_f32(&s.v, &mut self.v, 0)?;
        }
        self.opt = DenseOptimState { kind: s.kind, lr: s.lr, step: s.step, m: Vec::new(), v: Vec::new() };
        Ok(())
    }
}
