//! [`DenseModel`]: the dense half of the CTR model on a [`Device`] — the input assembled
//! from embedding rows and dense features, the [`Mlp`], binary cross-entropy, the
//! per-key gradient of the embedding rows, and the dense optimizer — written once for the
//! CPU, the GPU and the host-kernels test device.
//!
//! **A batch crosses to the device through staging.** The trainer looks the batch's unique
//! keys' rows up from the host-shared table straight into a staging slot
//! ([`DenseModel::stage`]), with the batch's `inverse` map, labels and dense features.
//! [`DenseModel::load`] moves it to the device (asynchronously on a GPU; a swap of vectors
//! on the CPU) and gathers the input there; [`DenseModel::step`] runs forward and backward;
//! [`DenseModel::key_grads`] sums the input gradient per unique key and moves those rows
//! back. Two staging slots are used in turn, so the next batch is staged while a GPU
//! still works on the current one.
//!
//! **Gradients leave as tensors.** Each layer's gradient (last layer first, as soon as
//! backward finished it) and the batch's loss sum are handed to the caller as engine
//! [`Tensor`]s ([`Device::lend`]: host memory for the CPU device, device tensors
//! elsewhere) to be summed over the ranks; [`DenseModel::give_back`] takes the reduced
//! ones back before [`DenseModel::apply`] runs the optimizer.
//!
//! **Multi-hot fields are the last `bags` of the layout's fields**
//! ([`DenseModel::set_multi_hot`]): the staged `inverse` names the single-hot fields only,
//! and each batch's bags ([`DenseModel::stage_bags`], CSR over the same unique keys) are
//! pooled into the last fields' columns ([`Op::PoolBags`]); the key gradients add the bags'
//! spread gradient after the single-hot slots' ([`Op::PoolBagsGrad`]). So every model that
//! only counts fields takes the pooled vectors unchanged. Without bags nothing of this runs.
//! With a hot-row cache ([`DenseModel::load_cached`]) each bag id's row is read where the
//! single-hot gather reads it, the cache slot or the staged miss ([`Op::PoolBagsSourced`]);
//! the key gradients are the same per-key sums, which the cache's update reads.
//!
//! **Fields of several tables** ([`DenseModel::set_fields`], `--table`): each field has its
//! own width; the batch's rows are staged per key at offsets ([`DenseModel::stage_tables`])
//! and gathered, pooled and summed back per key by [`super::fields`]' ops instead.

use super::fields::{FieldWidths, FieldsOnDevice, KeyLists};
use super::input::InputLayout;
use super::net::Net;
use super::optim::{DenseOptimState, Optimizer};
use super::pooling::{build_bag_csr, mean_mask, Pooling};
use super::spec::ModelSpec;
use crate::device::{CsrScratch, Device, DeviceError, DeviceResult, Direction, Op, Scalar};
use crate::tensor::Tensor;

/// Rows per GEMM tile when scoring ([`DenseModel::predict`]): small enough that a one-row
/// request pays little for its padding, large enough to keep the kernels efficient.
pub const SCORING_ROW_TILE: usize = 16;

/// What a tensor handed out by [`DenseModel::step`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Layer `l`'s gradient (its W, then its b).
    Layer(usize),
    /// The batch's loss sum (one value).
    Loss,
}

impl Part {
    /// The tensor's name in the engine (`dense.layer<l>`, `dense.loss`).
    pub fn name(self) -> String {
        match self {
            Part::Layer(l) => format!("dense.layer{l}"),
            Part::Loss => "dense.loss".into(),
        }
    }
}

/// The arrays of a batch as the host stages them, in staging memory (`F`/`U` are a
/// device's staging types) or, once loaded, in device memory (its buffer types).
struct Arrays<F, U> {
    emb: F,
    inverse: U,
    dense: F,
    labels: F,
    /// Multi-hot bags (empty without): where each bag's ids start, the ids (rows among the
    /// unique keys), each key's bags ([`build_bag_csr`]).
    bag_offsets: U,
    bag_index: U,
    key_offsets: U,
    bag_slots: U,
    /// Fields of several widths (empty without): where each key's row starts in `emb`.
    key_at: U,
}

/// One staging slot: a batch in (page-locked) host memory.
struct Stage<D: Device> {
    arrays: Arrays<D::Staging<f32>, D::Staging<u32>>,
    /// Per-sample weights ([`DenseModel::stage_weights`]); allocated on first use.
    weights: Option<D::Staging<f32>>,
    /// Whether the staged batch has weights.
    weighted: bool,
    /// (samples, unique keys) staged here and not yet loaded.
    staged: Option<(usize, usize)>,
    /// Each unique key's source in a hot-row cache ([`DenseModel::stage_sourced`]);
    /// allocated on first use.
    source: Option<D::Staging<u32>>,
    /// The misses staged in `emb` when the staged batch has sources.
    misses: Option<usize>,
    /// Keys absent from the host table, whose rows the device makes
    /// ([`DenseModel::stage_new_rows`]; allocated on first use): each key as two `u32`s.
    new_keys: Option<D::Staging<u32>>,
    /// The staged batch's new rows: (keys, seed, init scale); `None`: no new rows.
    new_rows: Option<(usize, u64, f32)>,
    /// Ids in the staged batch's bags ([`DenseModel::stage_bags`]; `None`: not staged).
    bag_ids: Option<usize>,
    /// Values of the rows staged by [`DenseModel::stage_tables`] (`None`: not so staged).
    floats: Option<usize>,
    /// Of those, the values uploaded (the first ones; [`DenseModel::stage_uploaded`]); the
    /// others come from device buffers at load ([`DenseModel::load_with_rows`]).
    uploaded: Option<usize>,
}

impl<D: Device> Stage<D> {
    fn new(dev: &D) -> DeviceResult<Stage<D>> {
        let (f, u) = (|dir| dev.staging(0, dir), |dir| dev.staging(0, dir));
        let (to, from) = (Direction::ToDevice, Direction::FromDevice);
        let arrays = Arrays { emb: f(to)?, inverse: u(from)?, dense: f(to)?, labels: f(to)?, bag_offsets: u(to)?, bag_index: u(to)?, key_offsets: u(to)?, bag_slots: u(to)?, key_at: u(to)? };
        Ok(Stage { arrays, weights: None, weighted: false, staged: None, source: None, misses: None, new_keys: None, new_rows: None, bag_ids: None, floats: None, uploaded: None })
    }
}

/// Host views of a staging slot, sized for the batch, for the caller to fill.
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

/// [`DenseModel::last_key_grads`]: the device, the key gradients' host copy and device
/// buffer, and the batch's cache sources on the device if it was loaded with them.
pub type LastKeyGrads<'a, D> = (&'a D, &'a [f32], &'a <D as Device>::Buf<f32>, Option<&'a <D as Device>::Buf<u32>>);

/// The batch on the device: its arrays, the per-key lists built from its inverse map,
/// the input, and what a step computes.
struct Batch<D: Device> {
    arrays: Arrays<D::Buf<f32>, D::Buf<u32>>,
    /// Each unique key's slots ([`Op::BuildCsr`]): where its list starts, the lists.
    offsets: D::Buf<u32>,
    slots: D::Buf<u32>,
    csr: CsrScratch<D>,
    x: D::Buf<f32>,
    dx: D::Buf<f32>,
    loss: D::Buf<f32>,
    key_grads: D::Buf<f32>,
    /// Per-sample weights of a weighted batch (`None`: every sample weighs 1).
    weights: Option<D::Buf<f32>>,
    /// The sources of a batch staged with them (allocated on first use).
    source: Option<D::Buf<u32>>,
    /// Whether the loaded batch's sources are in `source`.
    sourced: bool,
    /// The new keys of a batch staged with them (allocated on first use).
    new_keys: Option<D::Buf<u32>>,
}

impl<D: Device> Batch<D> {
    /// Empty buffers.
    fn new(dev: &D) -> DeviceResult<Batch<D>> {
        let (f, u) = (|| dev.alloc(0), || dev.alloc(0));
        let arrays = Arrays { emb: f()?, inverse: u()?, dense: f()?, labels: f()?, bag_offsets: u()?, bag_index: u()?, key_offsets: u()?, bag_slots: u()?, key_at: u()? };
        Ok(Batch { arrays, offsets: u()?, slots: u()?, csr: CsrScratch::new(dev)?, x: f()?, dx: f()?, loss: f()?, key_grads: f()?, weights: None, source: None, sourced: false, new_keys: None })
    }

    /// Grows every buffer that holds fewer elements than `batch` samples with `keys` unique
    /// keys need, their rows `floats` values and `single` single-hot fields a sample.
    /// Lengths are checked one by one: the CPU device moves batches in by swapping buffers
    /// with the staging slots, so they need not share a capacity.
    fn fit(&mut self, dev: &D, layout: &InputLayout, batch: usize, keys: usize, floats: usize, single: usize) -> DeviceResult<()> {
        let (width, a) = (layout.width(), &mut self.arrays);
        grow(dev, &mut a.emb, floats)?;
        grow(dev, &mut a.inverse, batch * single)?;
        grow(dev, &mut a.dense, batch * layout.ndense)?;
        grow(dev, &mut a.labels, batch)?;
        grow(dev, &mut self.offsets, keys + 1)?;
        grow(dev, &mut self.slots, batch * single)?;
        self.csr.fit(dev, batch * single)?;
        grow(dev, &mut self.x, batch * width)?;
        grow(dev, &mut self.dx, batch * width)?;
        grow(dev, &mut self.loss, batch)?;
        grow(dev, &mut self.key_grads, floats)
    }
}

/// Replaces device buffer `b` with a zeroed one of `n` elements when it holds fewer.
fn grow<D: Device, T: Scalar>(dev: &D, b: &mut D::Buf<T>, n: usize) -> DeviceResult<()> {
    if dev.len(b) < n {
        *b = dev.alloc(n)?;
    }
    Ok(())
}

/// Replaces staging buffer `h` with one of `n` elements when it holds fewer; its first `n`
/// elements.
fn grow_staging<'h, D: Device, T: Scalar>(dev: &D, h: &'h mut D::Staging<T>, n: usize, dir: Direction) -> DeviceResult<&'h mut [T]> {
    if dev.host(h)?.len() < n {
        *h = dev.staging(n, dir)?;
    }
    Ok(&mut dev.host(h)?[..n])
}

/// The dense model on device `D` (see the module docs).
pub struct DenseModel<D: Device> {
    dev: D,
    spec: ModelSpec,
    layout: InputLayout,
    net: Net<D>,
    opt: Optimizer<D>,
    batch: Batch<D>,
    stages: [Stage<D>; 2],
    /// The slot `stage` fills next.
    fill: usize,
    /// (samples, keys) of the batch on the device, once [`DenseModel::load`]ed.
    loaded: Option<(usize, usize)>,
    /// The loss sum's one-value buffer; `None` while handed out.
    loss_sum: Option<D::Buf<f32>>,
    /// The gradient check's buffers (allocated on first use).
    check: Option<GradCheck<D>>,
    key_grads_host: D::Staging<f32>,
    /// Bytes copied to and from the device so far ([`DenseModel::bytes_moved`]).
    moved: std::cell::Cell<(u64, u64)>,
    /// Scratch of the CSR build.
    csr_next: Vec<u32>,
    /// Multi-hot fields (the layout's last ones) and their `mean` mask.
    bags: usize,
    mean: u32,
    /// Fields of several widths ([`DenseModel::set_fields`]; `None`: one width).
    fields: Option<FieldsOnDevice<D>>,
    /// Values of the loaded batch's key rows (and key gradients).
    floats: usize,
}

/// Buffers of [`DenseModel::non_finite_gradient`].
struct GradCheck<D: Device> {
    /// Per layer, its gradient's column sums (one per output).
    cols: Vec<D::Buf<f32>>,
    /// One value per layer: the sum of its column sums.
    sums: D::Buf<f32>,
}

impl<D: Device> DenseModel<D> {
    /// The model `spec` (its input layout is [`ModelSpec::layout`]), with parameters
    /// `params` (the flat layout of [`ModelSpec::groups`]) and optimizer state `opt` (fresh
    /// or resumed), on `dev`.
    pub fn new(dev: D, spec: ModelSpec, params: &[f32], opt: &DenseOptimState) -> DeviceResult<DenseModel<D>> {
        let layout = spec.layout();
        let net = Net::new(&dev, spec.clone(), params)?;
        let opt = Optimizer::new(&dev, opt, net.num_params())?;
        Ok(DenseModel {
            batch: Batch::new(&dev)?,
            stages: [Stage::new(&dev)?, Stage::new(&dev)?],
            loss_sum: Some(dev.alloc(1)?),
            check: None,
            key_grads_host: dev.staging(0, Direction::FromDevice)?,
            fill: 0,
            loaded: None,
            moved: std::cell::Cell::new((0, 0)),
            csr_next: Vec::new(),
            bags: 0,
            mean: 0,
            fields: None,
            floats: 0,
            layout,
            spec,
            net,
            opt,
            dev,
        })
    }

    /// Makes the layout's last `modes.len()` fields multi-hot, each pooled as its mode
    /// says (see the module docs); every batch after it is staged with
    /// [`DenseModel::stage_bags`]. An error when there are more than the layout's fields.
    pub fn set_multi_hot(&mut self, modes: &[Pooling]) -> DeviceResult<()> {
        if modes.len() > self.layout.fields {
            return Err(DeviceError::refused("multi-hot fields", format!("{} multi-hot fields, but the model takes {} fields in all", modes.len(), self.layout.fields)));
        }
        self.mean = mean_mask(modes).map_err(|e| DeviceError::refused("multi-hot fields", e))?;
        self.bags = modes.len();
        Ok(())
    }

    /// Makes the model's input fields of several widths (`--table`, [`super::fields`]):
    /// `widths` (their columns the layout's embedding columns), the last `modes.len()`
    /// multi-hot, pooled as their modes say. Every batch after it is staged with
    /// [`DenseModel::stage_tables`] (and [`DenseModel::stage_bags`] with multi-hot fields).
    pub fn set_fields(&mut self, widths: &[usize], modes: &[Pooling]) -> DeviceResult<()> {
        let single = widths.len().checked_sub(modes.len()).ok_or_else(|| DeviceError::refused("fields of several widths", format!("{} multi-hot fields of {} fields", modes.len(), widths.len())))?;
        let mean = mean_mask(modes).map_err(|e| DeviceError::refused("multi-hot fields", e))?;
        let cols = self.layout.fields * self.layout.dim;
        self.fields = Some(FieldsOnDevice::new(&self.dev, FieldWidths { widths: widths.to_vec(), single }, cols, mean)?);
        (self.bags, self.mean) = (modes.len(), mean);
        Ok(())
    }

    /// The fields' widths [`DenseModel::set_fields`] gave (`None`: one width).
    pub fn field_widths(&self) -> Option<&FieldWidths> {
        self.fields.as_ref().map(FieldsOnDevice::widths)
    }

    /// Multi-hot fields per sample ([`DenseModel::set_multi_hot`]; 0 without).
    pub fn multi_hot_fields(&self) -> usize {
        self.bags
    }

    /// Single-hot fields per sample: the layout's fields less the multi-hot ones (with
    /// [`DenseModel::set_fields`], its single-hot fields).
    pub fn single_fields(&self) -> usize {
        match &self.fields {
            Some(f) => f.single(),
            None => self.layout.fields - self.bags,
        }
    }

    /// Host views of the staged batch's bags, for the caller to fill after
    /// [`DenseModel::stage`] (`batch` samples, `ids` ids in all their bags): where each bag
    /// starts (`batch * bags + 1` values, from 0, bag `s * bags + g` = multi-hot field `g`
    /// of sample `s`) and the ids (rows among the staged unique keys).
    pub fn stage_bags(&mut self, batch: usize, ids: usize) -> DeviceResult<(&mut [u32], &mut [u32])> {
        let (dev, bags) = (&self.dev, self.bags);
        let st = &mut self.stages[self.fill];
        if bags == 0 || st.staged.map(|s| s.0) != Some(batch) {
            return Err(DeviceError::refused("staging bags", format!("no multi-hot fields, or the staged batch does not have {batch} samples (call set_multi_hot() and stage() first)")));
        }
        st.bag_ids = Some(ids);
        let a = &mut st.arrays;
        grow_staging(dev, &mut a.bag_slots, ids, Direction::ToDevice)?;
        let offsets = grow_staging(dev, &mut a.bag_offsets, batch * bags + 1, Direction::ToDevice)?;
        Ok((offsets, grow_staging(dev, &mut a.bag_index, ids, Direction::ToDevice)?))
    }

    /// The model it is.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.dev
    }
    /// The network.
    pub fn net(&self) -> &Net<D> {
        &self.net
    }
    /// Number of dense parameters.
    pub fn num_params(&self) -> usize {
        self.net.num_params()
    }
    /// Number of parameter groups (the tensors a step hands out besides the loss).
    pub fn num_groups(&self) -> usize {
        self.net.groups().len()
    }

    /// The staging slot for the next batch of `batch` samples and `keys` unique keys, to
    /// fill. On a GPU it waits only for copies out of this slot two batches ago. That wait
    /// alone makes refilling the slot safe: the trainer's per-step `key_grads` download
    /// happens to wait past those copies too, but a caller that stages ahead without reading
    /// anything back relies on it (tests/device.rs: the run-ahead comparison, which fails
    /// with `RINGREC_HOST_FAULT=no-staging-wait`).
    pub fn stage(&mut self, batch: usize, keys: usize) -> DeviceResult<StageMut<'_>> {
        self.stage_rows(batch, keys, keys * self.layout.dim)
    }

    /// [`DenseModel::stage`] for a model of fields of several widths
    /// ([`DenseModel::set_fields`]): `emb` holds `floats` values, unique key `u`'s row at
    /// `key_at[u]..key_at[u + 1]` (the second slice, `keys + 1` values, for the caller to
    /// fill), each row its fields' width; `inverse` names the single-hot fields' keys.
    pub fn stage_tables(&mut self, batch: usize, keys: usize, floats: usize) -> DeviceResult<(StageMut<'_>, &mut [u32])> {
        if self.fields.is_none() {
            return Err(DeviceError::refused("staging tables' rows", "the model's fields have one width (call set_fields() first)"));
        }
        self.stage_rows(batch, keys, floats)?;
        let (single, ndense) = (self.single_fields(), self.layout.ndense);
        let (dev, st) = (&self.dev, &mut self.stages[self.fill]);
        st.floats = Some(floats);
        let a = &mut st.arrays;
        grow_staging(dev, &mut a.key_at, keys + 1, Direction::ToDevice)?;
        let stage = StageMut {
            emb: &mut dev.host(&mut a.emb)?[..floats],
            inverse: &mut dev.host(&mut a.inverse)?[..batch * single],
            dense: &mut dev.host(&mut a.dense)?[..batch * ndense],
            labels: &mut dev.host(&mut a.labels)?[..batch],
        };
        Ok((stage, &mut dev.host(&mut a.key_at)?[..keys + 1]))
    }

    /// After [`DenseModel::stage_tables`]: only the first `n` of the staged values are filled
    /// and uploaded; the rows after them are copied from device buffers when the batch loads
    /// ([`DenseModel::load_with_rows`]: the per-table hot-row caches' hits).
    pub fn stage_uploaded(&mut self, n: usize) -> DeviceResult<()> {
        let st = &mut self.stages[self.fill];
        match st.floats {
            Some(f) if n <= f => st.uploaded = Some(n),
            _ => return Err(DeviceError::refused("staging uploaded rows", format!("{n} uploaded values, but the staged batch has fewer or was not staged by stage_tables()"))),
        }
        Ok(())
    }

    /// [`DenseModel::stage`] for a batch whose rows come from a hot-row cache (issue 30):
    /// `emb` holds the rows of its `misses` only (misses x dim), and the second slice, one
    /// value per unique key, each key's source: its cache row, or [`crate::device::CACHE_MISS`]
    /// | its row in `emb`. Load it with [`DenseModel::load_cached`].
    pub fn stage_sourced(&mut self, batch: usize, keys: usize, misses: usize) -> DeviceResult<(StageMut<'_>, &mut [u32])> {
        let st = &mut self.stages[self.fill];
        if st.source.is_none() {
            st.source = Some(self.dev.staging(0, Direction::ToDevice)?);
        }
        if let Some(source) = st.source.as_mut() {
            grow_staging(&self.dev, source, keys, Direction::ToDevice)?;
        }
        self.stage_rows(batch, keys, misses * self.layout.dim)?;
        let InputLayout { dim, ndense, .. } = self.layout;
        let fields = self.single_fields();
        let st = &mut self.stages[self.fill];
        st.misses = Some(misses);
        let dev = &self.dev;
        let a = &mut st.arrays;
        let source = st.source.as_mut().ok_or_else(|| DeviceError::refused("staging sources", "no staging buffer"))?;
        let stage = StageMut {
            emb: &mut dev.host(&mut a.emb)?[..misses * dim],
            inverse: &mut dev.host(&mut a.inverse)?[..batch * fields],
            dense: &mut dev.host(&mut a.dense)?[..batch * ndense],
            labels: &mut dev.host(&mut a.labels)?[..batch],
        };
        Ok((stage, &mut dev.host(source)?[..keys]))
    }

    /// After [`DenseModel::stage_sourced`]: the last `new` of its misses are keys absent
    /// from the host table, made on the device ([`Op::InitRows`], the table's `seed` and
    /// `init_scale`) instead of uploaded. Returns the host view to fill with those keys,
    /// each as its low and high `u32`; the misses' rows then fill only the first
    /// `misses - new` rows of `emb`.
    pub fn stage_new_rows(&mut self, new: usize, seed: u64, init_scale: f32) -> DeviceResult<&mut [u32]> {
        let st = &mut self.stages[self.fill];
        match st.misses {
            Some(m) if new <= m => {}
            _ => return Err(DeviceError::refused("staging new rows", format!("{new} new rows, but the staged batch has fewer misses or no sources (call stage_sourced() first)"))),
        }
        st.new_rows = Some((new, seed, init_scale));
        if st.new_keys.is_none() {
            st.new_keys = Some(self.dev.staging(0, Direction::ToDevice)?);
        }
        let keys = st.new_keys.as_mut().ok_or_else(|| DeviceError::refused("staging new rows", "no staging buffer"))?;
        grow_staging(&self.dev, keys, 2 * new, Direction::ToDevice)
    }

    /// The staging slot for `batch` samples, `keys` unique keys and `floats` staged row values.
    fn stage_rows(&mut self, batch: usize, keys: usize, floats: usize) -> DeviceResult<StageMut<'_>> {
        let ndense = self.layout.ndense;
        let fields = self.single_fields();
        let dev = &self.dev;
        let st = &mut self.stages[self.fill];
        st.staged = Some((batch, keys));
        st.bag_ids = None;
        st.weighted = false;
        st.misses = None;
        st.floats = None;
        st.uploaded = None;
        st.new_rows = None;
        let a = &mut st.arrays;
        let (to, from) = (Direction::ToDevice, Direction::FromDevice);
        Ok(StageMut {
            emb: grow_staging(dev, &mut a.emb, floats, to)?,
            inverse: grow_staging(dev, &mut a.inverse, batch * fields, from)?,
            dense: grow_staging(dev, &mut a.dense, batch * ndense, to)?,
            labels: grow_staging(dev, &mut a.labels, batch, to)?,
        })
    }

    /// Host view of the staged batch's per-sample weights (`batch` values), for the caller
    /// to fill after [`DenseModel::stage`]: the step then uses the weighted loss
    /// ([`Op::WeightedBce`]). A batch staged without it has every sample weigh 1 and runs
    /// the unweighted loss, the same code and bits as before weights existed.
    pub fn stage_weights(&mut self, batch: usize) -> DeviceResult<&mut [f32]> {
        let dev = &self.dev;
        let st = &mut self.stages[self.fill];
        if st.staged.map(|s| s.0) != Some(batch) {
            return Err(DeviceError::refused("staging weights", format!("the staged batch does not have {batch} samples (call stage() first)")));
        }
        st.weighted = true;
        if st.weights.is_none() {
            st.weights = Some(dev.staging(0, Direction::ToDevice)?);
        }
        let w = st.weights.as_mut().ok_or_else(|| DeviceError::refused("staging weights", "no staging buffer"))?;
        grow_staging(dev, w, batch, Direction::ToDevice)
    }

    /// Moves the staged batch to the device (checking its inverse map and building the
    /// per-key CSR lists on the host), gathers the input and flips to the other staging
    /// slot. Returns (samples, keys).
    pub fn load(&mut self) -> DeviceResult<(usize, usize)> {
        self.load_inner(None, &[])
    }

    /// [`DenseModel::load`] of a batch staged by [`DenseModel::stage_sourced`]: its input
    /// gathered from the rows of `cache` and the staged misses ([`Op::GatherSourced`]).
    pub fn load_cached(&mut self, cache: &D::Buf<f32>) -> DeviceResult<(usize, usize)> {
        self.load_inner(Some(cache), &[])
    }

    /// [`DenseModel::load`] of a batch staged by [`DenseModel::stage_tables`] and
    /// [`DenseModel::stage_uploaded`]: the staged values after the uploaded ones are copied
    /// on the device from `rows`, each (buffer, values, offset in the staged rows); together
    /// they cover every value not uploaded.
    pub fn load_with_rows(&mut self, rows: &[(&D::Buf<f32>, usize, usize)]) -> DeviceResult<(usize, usize)> {
        self.load_inner(None, rows)
    }

    /// Bytes copied to the device and from it so far (every upload, download and read).
    pub fn bytes_moved(&self) -> (u64, u64) {
        self.moved.get()
    }

    fn count_moved(&self, up: usize, down: usize) {
        let (u, d) = self.moved.get();
        self.moved.set((u + up as u64, d + down as u64));
    }

    /// Checks that the batch staged in `slot` loads the way it was staged: the device rows
    /// `on_device` (buffer, values, offset) follow its uploaded values (`stage_uploaded`),
    /// with a cache only when staged with cache sources, and a model of fields only through
    /// `stage_tables`. Returns the values staged to upload (`None`: every staged row).
    fn check_load(&mut self, slot: usize, cached: bool, on_device: &[(&D::Buf<f32>, usize, usize)]) -> DeviceResult<Option<usize>> {
        let misses = self.stages[slot].misses;
        let uploaded = self.stages[slot].uploaded.take();
        if let Some(up) = uploaded {
            let floats = self.stages[slot].floats.unwrap_or(0);
            let mut at = up;
            for (buf, n, to) in on_device {
                if *to != at || self.dev.len(*buf) < *n {
                    return Err(DeviceError::refused("loading a batch", format!("device rows of {n} values at {to} do not follow the staged values at {at}")));
                }
                at += n;
            }
            if at != floats {
                return Err(DeviceError::refused("loading a batch", format!("{up} uploaded and {} device values for {floats} staged ones", at - up)));
            }
        } else if !on_device.is_empty() {
            return Err(DeviceError::refused("loading a batch", "device rows for a batch staged without stage_uploaded()"));
        }
        if misses.is_some() != cached {
            return Err(DeviceError::refused("loading a batch", "a batch staged with cache sources loads with the cache (load_cached), any other with load"));
        }
        if cached && self.fields.is_some() {
            // The fields' gather reads every key's row at its offset in the staged rows,
            // which hold only the cache's misses here.
            return Err(DeviceError::refused("loading a batch", "a model with fields of several tables stages its cached rows by stage_tables() and loads them with load_with_rows()"));
        }
        Ok(uploaded)
    }

    fn load_inner(&mut self, cache: Option<&D::Buf<f32>>, on_device: &[(&D::Buf<f32>, usize, usize)]) -> DeviceResult<(usize, usize)> {
        let slot = self.fill;
        let misses = self.stages[slot].misses;
        let uploaded = self.check_load(slot, cache.is_some(), on_device)?;
        let (batch, keys) = self.stages[slot].staged.take().ok_or_else(|| DeviceError::refused("a dense step", "no batch was staged (call stage() first)"))?;
        let ids = match (self.bags, self.stages[slot].bag_ids.take()) {
            (0, _) => 0,
            (_, Some(ids)) => ids,
            (_, None) => return Err(DeviceError::refused("a dense step", "a model with multi-hot fields needs the batch's bags (call stage_bags() after stage())")),
        };
        let InputLayout { dim, ndense, .. } = self.layout;
        let floats = match (&self.fields, self.stages[slot].floats.take()) {
            (None, _) => keys * dim,
            (Some(_), Some(floats)) => floats,
            (Some(_), None) => return Err(DeviceError::refused("a dense step", "a model of fields of several widths needs its rows staged at their offsets (call stage_tables())")),
        };
        let fields = self.single_fields();
        let dev = &self.dev;
        self.batch.fit(dev, &self.layout, batch, keys, floats, fields)?;
        grow_staging(dev, &mut self.key_grads_host, floats, Direction::FromDevice)?;
        // The device builds the per-key lists from the inverse map (Op::BuildCsr), trusting
        // its rows: checked here, where it is staged.
        if let Some(bad) = dev.host(&mut self.stages[slot].arrays.inverse)?[..batch * fields].iter().find(|u| **u as usize >= keys) {
            return Err(DeviceError::refused("staging a batch", format!("inverse names row {bad} of {keys} unique keys")));
        }
        let bag_values = match self.bags > 0 || self.fields.is_some() {
            true => self.load_bags(slot, batch, keys, ids, floats)?,
            false => 0,
        };
        let weights = self.load_weights(slot, batch)?;
        let dev = &self.dev;
        let (b, x) = (&mut self.batch.arrays, &mut self.batch.x);
        let stage = &mut self.stages[slot];
        let new_rows = stage.new_rows.take();
        let new = new_rows.map_or(0, |n| n.0);
        // Values of the staged rows uploaded (a cache's misses: those not made on the device).
        let rows = uploaded.unwrap_or(misses.map_or(floats, |m| (m - new) * dim));
        let st = &mut stage.arrays;
        dev.upload(&mut st.emb, rows, &mut b.emb)?;
        for (buf, n, at) in on_device {
            dev.copy((*buf, 0), (&mut b.emb, *at), *n)?;
        }
        if let (Some((n, seed, scale)), Some(staged)) = (new_rows, stage.new_keys.as_mut()) {
            if self.batch.new_keys.is_none() {
                self.batch.new_keys = Some(dev.alloc(0)?);
            }
            let buf = self.batch.new_keys.as_mut().ok_or_else(|| DeviceError::refused("loading new rows", "no buffer"))?;
            grow(dev, buf, 2 * n)?;
            dev.upload(staged, 2 * n, buf)?;
            dev.exec(Op::InitRows { keys: buf, out: &mut b.emb, at: rows / dim, n, dim, seed, scale })?;
        }
        dev.upload(&mut st.inverse, batch * fields, &mut b.inverse)?;
        dev.upload(&mut st.dense, batch * ndense, &mut b.dense)?;
        dev.upload(&mut st.labels, batch, &mut b.labels)?;
        let (offsets, slots, csr) = (&mut self.batch.offsets, &mut self.batch.slots, &mut self.batch.csr);
        dev.exec(Op::BuildCsr { inverse: &b.inverse, n: batch * fields, keys, offsets, slots, scratch: csr })?;
        let stage = &mut self.stages[slot];
        let mut moved = 4 * (rows + batch * fields + batch * ndense + batch + weights + bag_values) + 8 * new;
        // x = [embedding rows of the sample's fields, dense features].
        let stride = self.layout.width();
        match (cache, stage.source.as_mut(), &self.fields) {
            (_, _, Some(f)) => {
                f.gather(dev, &b.emb, &b.key_at, &b.inverse, (&b.bag_offsets, &b.bag_index), x, batch, stride)?;
                self.batch.sourced = false;
            }
            (Some(cache), Some(src), None) => {
                if self.batch.source.is_none() {
                    self.batch.source = Some(dev.alloc(0)?);
                }
                let buf = self.batch.source.as_mut().ok_or_else(|| DeviceError::refused("loading sources", "no buffer"))?;
                grow(dev, buf, keys)?;
                dev.upload(src, keys, buf)?;
                moved += 4 * keys;
                dev.exec(Op::GatherSourced { cache, misses: &b.emb, source: buf, index: &b.inverse, out: x, rows: batch, per_row: fields, dim, stride })?;
                self.batch.sourced = true;
            }
            _ => {
                dev.exec(Op::GatherRows { table: &b.emb, index: &b.inverse, out: x, rows: batch, per_row: fields, dim, stride })?;
                self.batch.sourced = false;
            }
        }
        if self.bags > 0 && self.fields.is_none() {
            let (index, offsets, bags, col, mean) = (&b.bag_index, &b.bag_offsets, self.bags, fields * dim, self.mean);
            match (cache, self.batch.source.as_ref().filter(|_| self.batch.sourced)) {
                // Each bag id's row where the single-hot gather reads it: its cache slot or its staged miss.
                (Some(cache), Some(source)) => dev.exec(Op::PoolBagsSourced { cache, misses: &b.emb, source, index, offsets, out: x, rows: batch, bags, dim, stride, col, mean })?,
                _ => dev.exec(Op::PoolBags { table: &b.emb, index, offsets, out: x, rows: batch, bags, dim, stride, col, mean })?,
            }
        }
        dev.exec(Op::CopyColumns { src: &b.dense, out: x, rows: batch, cols: ndense, stride, col: self.layout.fields * dim })?;
        self.fill = 1 - slot;
        self.loaded = Some((batch, keys));
        self.floats = floats;
        self.count_moved(moved, 0);
        Ok((batch, keys))
    }

    /// Moves the per-sample weights staged in slot `slot` (`batch` samples) to the device,
    /// or drops the last batch's when it has none. Returns the values counted as moved.
    fn load_weights(&mut self, slot: usize, batch: usize) -> DeviceResult<usize> {
        let (dev, stage) = (&self.dev, &mut self.stages[slot]);
        match (stage.weighted, &mut stage.weights) {
            (true, Some(w)) => {
                if self.batch.weights.is_none() {
                    self.batch.weights = Some(dev.alloc(0)?);
                }
                let buf = self.batch.weights.as_mut().ok_or_else(|| DeviceError::refused("loading weights", "no buffer"))?;
                grow(dev, buf, batch)?;
                dev.upload(w, batch, buf)?;
            }
            _ => self.batch.weights = None,
        }
        Ok(if stage.weighted { batch } else { 0 })
    }

    /// Moves the staged bags of slot `slot` (`ids` ids; `batch` samples, `keys` keys) to the
    /// device with each key's bags ([`build_bag_csr`]); for fields of several widths also
    /// the keys' row offsets (`floats` values), checked against the fields' widths
    /// ([`FieldWidths::check_staged`]), and empty bags when none are multi-hot. Returns the
    /// values uploaded.
    fn load_bags(&mut self, slot: usize, batch: usize, keys: usize, ids: usize, floats: usize) -> DeviceResult<usize> {
        let (dev, bags, st) = (&self.dev, self.bags, &mut self.stages[slot].arrays);
        if bags == 0 {
            grow_staging(dev, &mut st.bag_offsets, 1, Direction::ToDevice)?.fill(0);
        }
        grow_staging(dev, &mut st.key_offsets, keys + 1, Direction::ToDevice)?;
        grow_staging(dev, &mut st.bag_slots, ids, Direction::ToDevice)?;
        grow_staging(dev, &mut st.bag_index, ids, Direction::ToDevice)?;
        let bag_offsets = &dev.host(&mut st.bag_offsets)?[..batch * bags + 1];
        let bag_index = &dev.host(&mut st.bag_index)?[..ids];
        let key_offsets = &mut dev.host(&mut st.key_offsets)?[..keys + 1];
        let bag_slots = &mut dev.host(&mut st.bag_slots)?[..ids];
        build_bag_csr(bag_index, bag_offsets, keys, key_offsets, bag_slots, &mut self.csr_next).map_err(|e| DeviceError::refused("staging a batch's bags", e))?;
        let b = &mut self.batch.arrays;
        if let Some(f) = &self.fields {
            let key_at = &dev.host(&mut st.key_at)?[..keys + 1];
            let inverse = &dev.host(&mut st.inverse)?[..batch * f.single()];
            f.widths().check_staged(key_at, floats, inverse, bag_offsets, bag_index).map_err(|e| DeviceError::refused("staging tables' rows", e))?;
            grow(dev, &mut b.key_at, keys + 1)?;
            dev.upload(&mut st.key_at, keys + 1, &mut b.key_at)?;
        }
        let key_at = if self.fields.is_some() { keys + 1 } else { 0 };
        // One element at least: a kernel argument is a pointer into a buffer.
        grow(dev, &mut b.bag_offsets, batch * bags + 1)?;
        grow(dev, &mut b.bag_index, ids.max(1))?;
        grow(dev, &mut b.key_offsets, keys + 1)?;
        grow(dev, &mut b.bag_slots, ids.max(1))?;
        dev.upload(&mut st.bag_offsets, batch * bags + 1, &mut b.bag_offsets)?;
        dev.upload(&mut st.bag_index, ids, &mut b.bag_index)?;
        dev.upload(&mut st.key_offsets, keys + 1, &mut b.key_offsets)?;
        dev.upload(&mut st.bag_slots, ids, &mut b.bag_slots)?;
        Ok(key_at + batch * bags + 1 + 2 * ids + keys + 1)
    }

    fn loaded(&self) -> DeviceResult<(usize, usize)> {
        self.loaded.ok_or_else(|| DeviceError::refused("a dense step", "no batch was loaded (call stage() and load() first)"))
    }

    /// One training step on the loaded batch: forward, the loss (its gradient scaled by
    /// `loss_scale`: the trainer passes 1 / global batch, so the sum over ranks is the
    /// gradient of the global mean loss; for a batch staged with weights, each sample's
    /// loss times its weight and 1 / the global batch's weight sum), backward. Hands each layer's gradient to `out` as
    /// soon as it is final, last layer first, then the loss sum.
    pub fn step(&mut self, loss_scale: f32, out: &mut dyn FnMut(Part, Tensor)) -> DeviceResult<()> {
        let (batch, _) = self.loaded()?;
        let (dev, net, b) = (&self.dev, &mut self.net, &mut self.batch);
        net.forward(dev, &b.x, &b.arrays.dense, batch)?;
        let (z, delta) = net.output_and_delta();
        match &b.weights {
            Some(w) => dev.exec(Op::WeightedBce { z, y: &b.arrays.labels, w, loss: &mut b.loss, delta, n: batch, scale: loss_scale })?,
            None => dev.exec(Op::BceWithLogits { z, y: &b.arrays.labels, loss: &mut b.loss, delta, n: batch, scale: loss_scale })?,
        }
        let mut sum = self.loss_sum.take().ok_or_else(|| DeviceError::refused("a dense step", "the last step's loss sum was not given back"))?;
        dev.exec(Op::Sum { x: &b.loss, n: batch, out: &mut sum, at: 0 })?;
        net.backward(dev, &b.x, &b.arrays.dense, &mut b.dx, batch, &mut |l, g| {
            out(Part::Layer(l), dev.lend(g));
            Ok(())
        })?;
        out(Part::Loss, dev.lend(sum));
        Ok(())
    }

    /// Takes back a tensor [`DenseModel::step`] handed out (reduced over the ranks).
    pub fn give_back(&mut self, part: Part, t: Tensor) -> DeviceResult<()> {
        let buf = self.dev.take_back::<f32>(t)?;
        match part {
            Part::Layer(l) => self.net.put_grad(l, buf)?,
            Part::Loss => self.loss_sum = Some(buf),
        }
        Ok(())
    }

    /// The last step's gradient rows of its unique keys (keys x dim, in the staged key
    /// order; with [`DenseModel::set_fields`], each key's row at its staged offsets): the
    /// input gradient summed per key on the device, moved to the host.
    pub fn key_grads(&mut self) -> DeviceResult<&[f32]> {
        let (batch, keys) = self.loaded()?;
        let (fields, dim, stride, bags, floats) = (self.single_fields(), self.layout.dim, self.layout.width(), self.bags, self.floats);
        let (dev, b) = (&self.dev, &mut self.batch);
        if let Some(f) = &self.fields {
            let a = &b.arrays;
            let lists = KeyLists { offsets: &b.offsets, slots: &b.slots, bag_offsets: &a.bag_offsets, key_offsets: &a.key_offsets, bag_slots: &a.bag_slots };
            f.key_grads(dev, &b.dx, &a.key_at, lists, &mut b.key_grads, keys, floats, batch, stride)?;
            dev.download(&mut b.key_grads, floats, &mut self.key_grads_host)?;
            self.count_moved(0, 4 * floats);
            return Ok(&dev.host(&mut self.key_grads_host)?[..floats]);
        }
        dev.exec(Op::SegmentSum { src: &b.dx, offsets: &b.offsets, slots: &b.slots, out: &mut b.key_grads, segments: keys, rows: batch, per_row: fields, dim, stride })?;
        if bags > 0 {
            let a = &b.arrays;
            dev.exec(Op::PoolBagsGrad { src: &b.dx, offsets: &a.bag_offsets, key_offsets: &a.key_offsets, slots: &a.bag_slots, out: &mut b.key_grads, segments: keys, rows: batch, bags, dim, stride, col: fields * dim, mean: self.mean })?;
        }
        dev.download(&mut b.key_grads, keys * dim, &mut self.key_grads_host)?;
        self.count_moved(0, 4 * keys * dim);
        Ok(&dev.host(&mut self.key_grads_host)?[..keys * dim])
    }

    /// The last step's key gradients as [`DenseModel::key_grads`] left them: the host copy
    /// and the device buffer (both as [`DenseModel::key_grads`] lays them out), valid until the
    /// next batch is loaded, and for a batch loaded with cache sources
    /// ([`DenseModel::load_cached`]) the device's copy of those (one per key).
    /// Returns the device with them.
    pub fn last_key_grads(&mut self) -> DeviceResult<LastKeyGrads<'_, D>> {
        self.loaded()?;
        let n = self.floats;
        let sources = self.batch.source.as_ref().filter(|_| self.batch.sourced);
        Ok((&self.dev, &self.dev.host(&mut self.key_grads_host)?[..n], &self.batch.key_grads, sources))
    }

    /// The first layer whose gradient (reduced, given back) holds a NaN or an infinity,
    /// named (`the gradient of dense layer 1`); `None` when all are finite. A sum per layer
    /// on the device (a non-finite element makes it non-finite), one small read.
    ///
    /// A layer's gradient (weights `in x out`, then `out` biases) is summed as an
    /// `(in + 1) x out` matrix: its column sums first (one GPU thread per column), then the
    /// sum of those (one thread). A single thread summing the whole layer in order took
    /// about 2.5 ms per step on an H200 (issue 6's device run), longer than the step's
    /// other device work. Same order on every device, so the decision is too.
    pub fn non_finite_gradient(&mut self) -> DeviceResult<Option<String>> {
        let groups = self.net.groups();
        let layers = groups.len();
        let dev = &self.dev;
        if self.check.is_none() {
            let cols = groups.iter().map(|g| dev.alloc(g.cols)).collect::<DeviceResult<Vec<_>>>()?;
            self.check = Some(GradCheck { cols, sums: dev.alloc(layers)? });
        }
        let GradCheck { cols, sums: check } = self.check.as_mut().ok_or_else(|| DeviceError::refused("the gradient check", "no buffer"))?;
        for (l, (col, group)) in cols.iter_mut().zip(groups).enumerate() {
            let g = self.net.grads().get(l).ok_or_else(|| DeviceError::refused("the gradient check", format!("layer {l}'s gradient is still lent out")))?;
            let out = group.cols;
            dev.exec(Op::ColumnSum { x: g, rows: group.rows, cols: out, out: col, at: 0 })?;
            dev.exec(Op::Sum { x: col, n: out, out: check, at: l })?;
        }
        let mut sums = vec![0f32; layers];
        dev.read(check, 0, &mut sums)?;
        self.count_moved(0, 4 * layers);
        Ok(sums.iter().position(|s| !s.is_finite()).map(|l| format!("the gradient of dense layer {l}")))
    }

    /// The optimizer step with the (reduced, given back) gradients, on every rank.
    pub fn apply(&mut self) -> DeviceResult<()> {
        self.net.update(&self.dev, &mut self.opt)
    }

    /// The last step's loss sum as its buffer holds it now: the batch's own before the
    /// reduction, the global one after it was given back. Waits for the device.
    pub fn loss_sum(&self) -> DeviceResult<f64> {
        let sum = self.loss_sum.as_ref().ok_or_else(|| DeviceError::refused("reading the loss", "the loss sum is still being reduced"))?;
        let mut v = [0f32];
        self.dev.read(sum, 0, &mut v)?;
        self.count_moved(0, 4);
        Ok(v[0] as f64)
    }

    /// Logits of the loaded batch (inference: no gradients), written into `out`. Each
    /// row's logit is a function of that row alone (the device's row tiles of
    /// [`SCORING_ROW_TILE`], [`Device::set_row_tile`]), whatever rows share the batch.
    pub fn predict(&mut self, out: &mut Vec<f32>) -> DeviceResult<()> {
        let (batch, _) = self.loaded()?;
        self.dev.set_row_tile(Some(SCORING_ROW_TILE));
        let forward = self.net.forward(&self.dev, &self.batch.x, &self.batch.arrays.dense, batch);
        self.dev.set_row_tile(None);
        forward?;
        out.resize(batch, 0.0);
        self.dev.read(self.net.output(), 0, out)
    }

    /// The parameters, copied to the host (waits).
    pub fn params(&self) -> DeviceResult<Vec<f32>> {
        self.dev.to_vec(self.net.params(), self.net.num_params())
    }

    /// Replaces the parameters with `params` (the flat layout of [`Mlp`]), keeping the
    /// optimizer state (a sync of `--sync-every`).
    pub fn set_params(&mut self, params: &[f32]) -> DeviceResult<()> {
        if params.len() != self.net.num_params() {
            return Err(DeviceError::refused("setting the parameters", format!("{} values given, the model has {}", params.len(), self.net.num_params())));
        }
        self.dev.write(params, self.net.params_mut(), 0)
    }

    /// The optimizer state with its moments copied to the host (checkpoints).
    pub fn optim_state(&self) -> DeviceResult<DenseOptimState> {
        self.opt.state(&self.dev)
    }
}
