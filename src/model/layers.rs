//! [`Layers`]: a stack of fully connected layers over a flat parameter buffer it does not
//! own — every MLP of every model (today's MLP, DLRM's bottom and top, DCN-v2's deep part,
//! DeepFM's and Wide & Deep's deep part) — written once over [`Device`].
//!
//! Layer `l` maps `widths[l]` to `widths[l + 1]` values: `y = act(x W + b)`, `W` (in x out,
//! row-major) then `b` (out) at the layer's offset of the flat vector. ReLU after every
//! layer but the last, and after the last too where the stack says so (DLRM's bottom MLP,
//! DCN-v2's parallel deep part). The stack keeps its activations and their gradients; the
//! caller owns the input, the parameters and the gradient buffers (one per layer).

use crate::device::{Activation, Device, DeviceResult, Epilogue, Gemm, Op};

/// A stack of layers (see the module docs).
pub struct Layers<D: Device> {
    widths: Vec<usize>,
    /// Per layer: (weight offset, bias offset) in the flat parameters.
    offsets: Vec<(usize, usize)>,
    /// ReLU after the last layer too.
    relu_last: bool,
    /// acts[l + 1] = layer l's output (batch x widths[l + 1]); acts[0] is unused.
    acts: Vec<D::Buf<f32>>,
    /// deltas[l] = gradient of acts[l]; deltas[0] is unused.
    deltas: Vec<D::Buf<f32>>,
    /// Samples the activations hold.
    cap: usize,
}

impl<D: Device> Layers<D> {
    /// Layers of `widths` (input first) whose parameters start at `base` of the flat vector.
    pub fn new(dev: &D, widths: Vec<usize>, base: usize, relu_last: bool) -> DeviceResult<Layers<D>> {
        let mut at = base;
        let offsets = widths
            .windows(2)
            .map(|p| {
                let o = (at, at + p[0] * p[1]);
                at += p[0] * p[1] + p[1];
                o
            })
            .collect();
        let empty = |_: &usize| dev.alloc(0);
        Ok(Layers { acts: widths.iter().map(empty).collect::<DeviceResult<_>>()?, deltas: widths.iter().map(empty).collect::<DeviceResult<_>>()?, cap: 0, offsets, widths, relu_last })
    }

    /// The widths, input first.
    pub fn widths(&self) -> &[usize] {
        &self.widths
    }
    /// Number of layers.
    pub fn len(&self) -> usize {
        self.offsets.len()
    }
    /// Whether there is no layer.
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }
    /// The output width.
    pub fn output_width(&self) -> usize {
        self.widths[self.widths.len() - 1]
    }
    /// Layer `l`'s parameters in the flat vector: its weights, then its biases.
    pub fn layer_range(&self, l: usize) -> std::ops::Range<usize> {
        self.offsets[l].0..self.offsets[l].1 + self.widths[l + 1]
    }
    /// The output of the last forward (batch x output width).
    pub fn output(&self) -> &D::Buf<f32> {
        &self.acts[self.widths.len() - 1]
    }
    /// The output and its gradient's buffer (the caller writes the gradient before
    /// [`Layers::backward`]).
    pub fn output_and_delta(&mut self) -> (&D::Buf<f32>, &mut D::Buf<f32>) {
        let last = self.widths.len() - 1;
        (&self.acts[last], &mut self.deltas[last])
    }

    /// Grows the activations to hold `batch` samples.
    fn ensure(&mut self, dev: &D, batch: usize) -> DeviceResult<()> {
        if batch <= self.cap {
            return Ok(());
        }
        for (l, w) in self.widths.iter().enumerate().skip(1) {
            self.acts[l] = dev.alloc(batch * w)?;
            self.deltas[l] = dev.alloc(batch * w)?;
        }
        self.cap = batch;
        Ok(())
    }

    /// Forward of `batch` rows of `x` (batch x input) with `params`; the result ends in
    /// [`Layers::output`].
    pub fn forward(&mut self, dev: &D, params: &D::Buf<f32>, x: &D::Buf<f32>, batch: usize) -> DeviceResult<()> {
        self.ensure(dev, batch)?;
        let last = self.offsets.len() - 1;
        for l in 0..=last {
            let (fan_in, fan_out) = (self.widths[l], self.widths[l + 1]);
            let (w, b) = self.offsets[l];
            let (lo, hi) = self.acts.split_at_mut(l + 1);
            // Layer 0 reads the caller's input in place.
            let input = if l == 0 { x } else { &lo[l] };
            let act = if l < last || self.relu_last { Activation::Relu } else { Activation::Identity };
            dev.gemm(&Gemm { m: batch, n: fan_out, k: fan_in, a_t: false, b_t: false }, (input, 0), (params, w), (&mut hi[0], 0), Epilogue::Bias { bias: params, at: b, act })?;
        }
        Ok(())
    }

    /// Backward of the last forward from the output's gradient (see
    /// [`Layers::output_and_delta`]): layer `l`'s weight and bias gradient is written into
    /// `grads(l)` and handed to `ready(l, ...)` as soon as it is final, last layer first; the
    /// input gradient goes to `dx` (batch x input) unless it is `None` (an input that learns
    /// nothing).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &mut self,
        dev: &D,
        params: &D::Buf<f32>,
        x: &D::Buf<f32>,
        mut dx: Option<&mut D::Buf<f32>>,
        batch: usize,
        grads: &mut dyn FnMut(usize) -> DeviceResult<D::Buf<f32>>,
        ready: &mut dyn FnMut(usize, D::Buf<f32>) -> DeviceResult<()>,
    ) -> DeviceResult<()> {
        let last = self.widths.len() - 1;
        if self.relu_last {
            let (act, delta) = (&self.acts[last], &mut self.deltas[last]);
            dev.exec(Op::ReluGrad { delta, act, n: batch * self.widths[last] })?;
        }
        for l in (0..self.offsets.len()).rev() {
            let (fan_in, fan_out) = (self.widths[l], self.widths[l + 1]);
            let (w, _) = self.offsets[l];
            let mut grad = grads(l)?;
            let (lo, hi) = self.deltas.split_at_mut(l + 1);
            let delta = &hi[0];
            let input = if l == 0 { x } else { &self.acts[l] };
            // dW = input^T delta, db = column sums of delta.
            dev.gemm(&Gemm { m: fan_in, n: fan_out, k: batch, a_t: true, b_t: false }, (input, 0), (delta, 0), (&mut grad, 0), Epilogue::BiasGrad { at: fan_in * fan_out })?;
            // d(input) = delta W^T, through the ReLU of the layer below.
            let target = match l {
                0 => dx.as_deref_mut().map(|d| (d, Epilogue::None)),
                _ => Some((&mut lo[l], Epilogue::ReluGrad { act: &self.acts[l] })),
            };
            if let Some((target, epi)) = target {
                dev.gemm(&Gemm { m: batch, n: fan_in, k: fan_out, a_t: false, b_t: true }, (delta, 0), (params, w), (target, 0), epi)?;
            }
            ready(l, grad)?;
        }
        Ok(())
    }
}
