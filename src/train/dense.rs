//! The dense half of a training step behind one trait, [`DenseModel`]: on the CPU
//! ([`CpuDense`]: the MLP with SGEMM, gradients allreduced by the [`crate::engine`]) or on
//! a device ([`DeviceDense`]: [`DeviceMlp`] with the gradients allreduced by a
//! [`DeviceReducer`], NCCL on GPUs). The step loop in `train` calls the same methods in
//! the same order for both:
//!
//! `stage` (rows of the batch's unique keys from the host table into the model's input) ->
//! `step` (forward/backward; each layer's gradient allreduce starts as backward finishes it)
//! -> `key_grads` (the per-key embedding gradients for the sparse exchange, which runs while
//! the dense allreduce does) -> `wait_reduced` -> `apply` (the optimizer) -> `loss_sum` (read
//! after the next batch is staged, so on a GPU the staging overlaps the device's tail of the
//! step).

use anyhow::{anyhow, bail, Context};

use super::BatchKeys;
use crate::comm::{self, Backend};
use crate::cuda::device::{DeviceReducer, SingleRank};
use crate::cuda::host::HostReducer;
use crate::cuda::{CudaDevice, Device, DeviceChoice, DeviceMlp, HostDevice, NcclComm};
use crate::data::criteo::{NUM_DENSE, NUM_SPARSE};
use crate::dtype::ReduceOp;
use crate::embedding::HostTable;
use crate::engine::{Compression, Engine, EngineConfig, Handle, Tensor};
use crate::model::input::{self, InputLayout};
use crate::model::{DenseOptimState, Mlp};
use crate::topology::Topology;

/// The dense model of a training run (see the module docs).
pub trait DenseModel {
    /// Where it runs, in words.
    fn describe(&self) -> String;
    /// Looks up the rows of `batch`'s unique keys in `table` and builds the model's input.
    fn stage(&mut self, batch: &BatchKeys, table: &HostTable) -> anyhow::Result<()>;
    /// Forward and backward of the staged batch with the loss scaled by `loss_scale`;
    /// starts the allreduce of each layer's gradient as soon as it is final.
    fn step(&mut self, batch: &BatchKeys, loss_scale: f32) -> anyhow::Result<()>;
    /// The step's gradient rows of the batch's unique keys (keys x dim).
    fn key_grads(&mut self, batch: &BatchKeys) -> anyhow::Result<&[f32]>;
    /// Waits for the dense gradient allreduce.
    fn wait_reduced(&mut self) -> anyhow::Result<()>;
    /// The optimizer step on the allreduced gradient (every rank, identical inputs).
    fn apply(&mut self) -> anyhow::Result<()>;
    /// The global (all ranks) loss sum of the last step.
    fn loss_sum(&mut self) -> anyhow::Result<f64>;
    /// Logits of the staged batch.
    fn predict(&mut self, batch: &BatchKeys, out: &mut Vec<f32>) -> anyhow::Result<()>;
    /// The parameters (the CPU model's flat layout).
    fn params(&self) -> anyhow::Result<Vec<f32>>;
    /// The optimizer state.
    fn optim_state(&self) -> anyhow::Result<DenseOptimState>;
}

/// Where the dense model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The CPU path.
    Cpu,
    /// GPU `ordinal` (NCCL across ranks).
    Gpu(usize),
    /// The device path on the CPU ([`HostDevice`], tests).
    Host,
}

/// Resolves `--device` for this rank: the GPU is `machine_local_rank % visible GPUs`
/// (simulated hosts share the machine's GPUs), every failure says what is missing.
pub fn place(choice: DeviceChoice, topo: &Topology) -> anyhow::Result<Placement> {
    if choice == DeviceChoice::Host {
        return Ok(Placement::Host);
    }
    Ok(match crate::cuda::resolve(choice, topo.machine_local_rank, topo.machine_local_size, topo.size)? {
        Some(ordinal) => Placement::Gpu(ordinal),
        None => Placement::Cpu,
    })
}

/// The CPU path: [`Mlp`], the engine's allreduce, [`DenseOptimState`].
pub struct CpuDense {
    mlp: Mlp,
    opt: DenseOptimState,
    engine: Engine,
    dim: usize,
    emb: Vec<f32>,
    x: Vec<f32>,
    dx: Vec<f32>,
    grad: Vec<f32>,
    key_grads: Vec<f32>,
    pending: Vec<(usize, Handle)>,
    loss_handle: Option<Handle>,
    loss: f64,
}

impl CpuDense {
    /// The CPU model `mlp` with optimizer state `opt`; gradients go through `engine`.
    pub fn new(mlp: Mlp, opt: DenseOptimState, engine: Engine, dim: usize) -> CpuDense {
        let n = mlp.num_params();
        CpuDense { mlp, opt, engine, dim, emb: Vec::new(), x: Vec::new(), dx: Vec::new(), grad: vec![0.0; n], key_grads: Vec::new(), pending: Vec::new(), loss_handle: None, loss: 0.0 }
    }
}

impl DenseModel for CpuDense {
    fn describe(&self) -> String {
        "cpu".into()
    }

    fn stage(&mut self, batch: &BatchKeys, table: &HostTable) -> anyhow::Result<()> {
        let (dim, b) = (self.dim, batch.len());
        self.emb.resize(batch.uniq.len() * dim, 0.0);
        table.lookup(&batch.uniq, &mut self.emb)?;
        let width = NUM_SPARSE * dim + NUM_DENSE;
        self.x.resize(b * width, 0.0);
        let (emb, inverse, dense) = (&self.emb, &batch.inverse, &batch.dense);
        let fill = |(s, row): (usize, &mut [f32])| {
            input::fill_row(row, emb, &inverse[s * NUM_SPARSE..(s + 1) * NUM_SPARSE], &dense[s * NUM_DENSE..(s + 1) * NUM_DENSE], dim);
        };
        if b >= 256 && rayon::current_num_threads() > 1 {
            use rayon::prelude::*;
            self.x[..b * width].par_chunks_mut(width).enumerate().with_min_len(64).for_each(fill);
        } else {
            self.x[..b * width].chunks_mut(width).enumerate().for_each(fill);
        }
        self.dx.resize(b * width, 0.0);
        Ok(())
    }

    fn step(&mut self, batch: &BatchKeys, loss_scale: f32) -> anyhow::Result<()> {
        let engine = &self.engine;
        let pending = &mut self.pending;
        pending.clear();
        let loss = self.mlp.forward_backward_with(&self.x, &batch.labels, batch.len(), loss_scale, &mut self.grad, &mut self.dx, &mut |l, g| {
            pending.push((l, engine.allreduce_async(&format!("dense.layer{l}"), Tensor::from_slice(g), ReduceOp::Sum)));
        });
        self.loss_handle = Some(engine.allreduce_async("dense.loss", Tensor::from_vec(vec![loss as f32]), ReduceOp::Sum));
        Ok(())
    }

    fn key_grads(&mut self, batch: &BatchKeys) -> anyhow::Result<&[f32]> {
        let dim = self.dim;
        self.key_grads.resize(batch.uniq.len() * dim, 0.0);
        input::scatter_key_grads(&self.dx, &batch.inverse, batch.len(), NUM_SPARSE, dim, NUM_SPARSE * dim + NUM_DENSE, &mut self.key_grads);
        Ok(&self.key_grads)
    }

    fn wait_reduced(&mut self) -> anyhow::Result<()> {
        for (l, h) in self.pending.drain(..) {
            let t = h.wait()?;
            self.grad[self.mlp.layer_range(l)].copy_from_slice(t.as_slice::<f32>().ok_or_else(|| anyhow!("dense gradient came back as {}", t.dtype()))?);
        }
        let h = self.loss_handle.take().ok_or_else(|| anyhow!("no step to wait for"))?;
        self.loss = h.wait()?.as_slice::<f32>().map_or(f64::NAN, |v| v[0] as f64);
        Ok(())
    }

    fn apply(&mut self) -> anyhow::Result<()> {
        self.opt.step(self.mlp.params_mut(), &self.grad);
        Ok(())
    }

    fn loss_sum(&mut self) -> anyhow::Result<f64> {
        Ok(self.loss)
    }

    fn predict(&mut self, batch: &BatchKeys, out: &mut Vec<f32>) -> anyhow::Result<()> {
        out.resize(batch.len(), 0.0);
        self.mlp.forward(&self.x, batch.len(), out);
        Ok(())
    }

    fn params(&self) -> anyhow::Result<Vec<f32>> {
        Ok(self.mlp.params().to_vec())
    }

    fn optim_state(&self) -> anyhow::Result<DenseOptimState> {
        Ok(self.opt.clone())
    }
}

/// The device path: [`DeviceMlp`] on `D`, gradients reduced by `R` (optionally through
/// f16/bf16 copies, `RINGREC_COMPRESSION`).
pub struct DeviceDense<D: Device, R: DeviceReducer<D>> {
    mlp: DeviceMlp<D>,
    reducer: R,
    /// (bf16?, one half buffer per layer) when compressing.
    half: Option<(bool, Vec<D::U16>)>,
}

impl<D: Device, R: DeviceReducer<D>> DeviceDense<D, R> {
    /// `mlp` with its gradients reduced by `reducer`, compressed as `compression` says.
    pub fn new(mlp: DeviceMlp<D>, reducer: R, compression: Compression) -> anyhow::Result<DeviceDense<D, R>> {
        let bf16 = match compression {
            Compression::None => None,
            Compression::Fp16 => Some(false),
            Compression::Bf16 => Some(true),
            Compression::OneBit => bail!("RINGREC_COMPRESSION=1bit is not available on the GPU path; use fp16, bf16 or none"),
        };
        let half = match bf16 {
            Some(b) => Some((b, (0..mlp.num_layers()).map(|l| mlp.device().zeros_u16(mlp.grad_len(l))).collect::<Result<Vec<_>, _>>()?)),
            None => None,
        };
        Ok(DeviceDense { mlp, reducer, half })
    }
}

impl<D: Device, R: DeviceReducer<D>> DenseModel for DeviceDense<D, R> {
    fn describe(&self) -> String {
        self.mlp.device().describe()
    }

    fn stage(&mut self, batch: &BatchKeys, table: &HostTable) -> anyhow::Result<()> {
        let st = self.mlp.stage(batch.len(), batch.uniq.len())?;
        table.lookup(&batch.uniq, st.emb)?;
        st.inverse.copy_from_slice(&batch.inverse);
        st.dense.copy_from_slice(&batch.dense);
        st.labels.copy_from_slice(&batch.labels);
        Ok(())
    }

    fn step(&mut self, _batch: &BatchKeys, loss_scale: f32) -> anyhow::Result<()> {
        let (reducer, half) = (&mut self.reducer, &mut self.half);
        self.mlp
            .step(loss_scale, &mut |dev, l, g| match half {
                None => reducer.allreduce_sum(dev, g),
                Some((bf16, bufs)) => {
                    let n = dev.len_f32(g);
                    dev.cast_to_half(g, &mut bufs[l], n, *bf16)?;
                    reducer.allreduce_half_sum(dev, &mut bufs[l], *bf16)?;
                    dev.cast_from_half(&bufs[l], g, n, *bf16)
                }
            })
            .context("the dense step on the device")
    }

    fn key_grads(&mut self, _batch: &BatchKeys) -> anyhow::Result<&[f32]> {
        Ok(self.mlp.key_grads()?)
    }

    fn wait_reduced(&mut self) -> anyhow::Result<()> {
        Ok(self.reducer.wait()?)
    }

    fn apply(&mut self) -> anyhow::Result<()> {
        Ok(self.mlp.apply()?)
    }

    fn loss_sum(&mut self) -> anyhow::Result<f64> {
        Ok(self.mlp.loss_sum()?)
    }

    fn predict(&mut self, batch: &BatchKeys, out: &mut Vec<f32>) -> anyhow::Result<()> {
        out.resize(batch.len(), 0.0);
        self.mlp.predict(out)?;
        Ok(())
    }

    fn params(&self) -> anyhow::Result<Vec<f32>> {
        Ok(self.mlp.params()?)
    }

    fn optim_state(&self) -> anyhow::Result<DenseOptimState> {
        Ok(self.mlp.optim_state()?)
    }
}

/// Builds the dense model for `placement` from the initial CPU model (parameters already
/// the same on every rank) and optimizer state; collective over the world. The CPU path
/// reduces through an engine started with `engine` (RINGREC_* settings); a device path
/// reduces with NCCL, or (the host device) over `engine.backend`, compressed as
/// `engine.compression` says.
pub fn build(placement: Placement, topo: &Topology, mlp: Mlp, opt: DenseOptimState, engine: &EngineConfig, dim: usize) -> anyhow::Result<Box<dyn DenseModel>> {
    let layout = InputLayout { fields: NUM_SPARSE, dim, ndense: NUM_DENSE };
    let compression = engine.compression;
    let model: Box<dyn DenseModel> = match placement {
        Placement::Cpu => Box::new(CpuDense::new(mlp, opt, Engine::start(topo, engine)?, dim)),
        Placement::Host => {
            let dev = topo.agree(HostDevice::new().map_err(|e| format!("rank {}: {e}", topo.rank)))?;
            let backend = engine.backend.unwrap_or_else(|| Backend::auto(topo));
            Box::new(DeviceDense::new(on_device(dev, &mlp, &opt, layout)?, HostReducer::new(comm::build_tagged(backend, topo, "device")?), compression)?)
        }
        Placement::Gpu(ordinal) => {
            // Every rank has its GPU before any waits in NCCL's start-up.
            let dev = topo.agree(CudaDevice::new(ordinal).map_err(|e| format!("rank {} on GPU {ordinal} of {}: {e}", topo.rank, topo.hostname)))?;
            if topo.size == 1 {
                // One rank: nothing to reduce, so no NCCL (nor libnccl) needed.
                Box::new(DeviceDense::new(on_device(dev, &mlp, &opt, layout)?, SingleRank, compression)?)
            } else {
                let nccl = NcclComm::new(topo, &dev).with_context(|| format!("rank {} joining the NCCL communicator", topo.rank))?;
                Box::new(DeviceDense::new(on_device(dev, &mlp, &opt, layout)?, nccl, compression)?)
            }
        }
    };
    Ok(model)
}

/// The CPU model `mlp` and its optimizer state `opt` (fresh or resumed) moved to `dev`.
fn on_device<D: Device>(dev: D, mlp: &Mlp, opt: &DenseOptimState, layout: InputLayout) -> anyhow::Result<DeviceMlp<D>> {
    let mut m = DeviceMlp::new(dev, mlp.shape(), layout, mlp.params(), opt.kind, opt.lr)?;
    m.set_optim_state(opt)?;
    Ok(m)
}
