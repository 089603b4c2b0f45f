//! The operations of a [`Device`]: a row-major GEMM with epilogues ([`Gemm`],
//! [`Epilogue`]) and the kernels of [`Op`], with the bounds each one touches
//! ([`Op::check`]), and their mapping onto the CUDA C kernels of kernels/*.cu for the
//! backends that launch those ([`launch`]).

use half::{bf16, f16};

use super::csr::CsrScratch;
use super::kernels::Kernel;
use super::{fits, Device, DeviceError, DeviceResult};

/// `c (m x n) = op(a) (m x k) * op(b) (k x n)`, all row-major: `a_t` means `a` is stored
/// k x m and used transposed, `b_t` that `b` is stored n x k.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    /// Rows of c.
    pub m: usize,
    /// Columns of c.
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// `a` is stored transposed.
    pub a_t: bool,
    /// `b` is stored transposed.
    pub b_t: bool,
}

impl Gemm {
    /// Elements each operand spans from its offset: (a, b, c).
    pub fn extents(&self) -> (usize, usize, usize) {
        (self.m * self.k, self.k * self.n, self.m * self.n)
    }
}

/// The arithmetic of a device's GEMMs (`--dense-precision`): a property of the device
/// ([`Device::set_gemm_precision`]), so every GEMM of every model follows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GemmPrecision {
    /// f32 operands and accumulation (the default).
    #[default]
    F32,
    /// Operands rounded to bfloat16 (nearest, ties to even), products accumulated in f32
    /// and the result in f32: the CPU's AVX-512 BF16 (`vdpbf16ps`), cuBLAS's bf16 tensor-core
    /// GEMMs. Parameters, gradients and optimizer state stay f32.
    Bf16,
}

crate::config::named_enum!(GemmPrecision { F32 => "f32", Bf16 => "bf16" });

/// What follows a layer's GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// Nothing.
    Identity,
    /// `max(x, 0)`.
    Relu,
}

/// Work fused after a GEMM (as cuBLASLt's epilogues): the CPU runs it on each part of the
/// product while it is in cache; kernel backends launch it after the GEMM.
pub enum Epilogue<'a, D: Device> {
    /// Nothing.
    None,
    /// `c[r, j] = act(c[r, j] + bias[at + j])`.
    Bias {
        /// The bias buffer.
        bias: &'a D::Buf<f32>,
        /// Offset of the bias.
        at: usize,
        /// The activation after it.
        act: Activation,
    },
    /// `c[i] = 0` where `act[i] <= 0` (the ReLU's backward on the product).
    ReluGrad {
        /// The layer's forward output.
        act: &'a D::Buf<f32>,
    },
    /// `c_buffer[at + j] = sum over the k rows of b[r, j]` (`b` not transposed): a bias
    /// gradient beside the weight gradient `a^T b`, in the same buffer as the product
    /// (outside its extent).
    BiasGrad {
        /// Offset of the column sums in c's buffer.
        at: usize,
    },
}

impl<D: Device> Epilogue<'_, D> {
    /// Checks the epilogue's buffers against the GEMM's shape and `c` (its buffer's
    /// length, the product's offset in it).
    pub fn check(&self, dev: &D, g: &Gemm, c: (usize, usize)) -> DeviceResult<()> {
        match self {
            Epilogue::None => Ok(()),
            Epilogue::Bias { bias, at, .. } => fits("gemm bias", dev.len(*bias), at + g.n),
            Epilogue::ReluGrad { act } => fits("gemm relu grad", dev.len(*act), g.m * g.n),
            Epilogue::BiasGrad { at } => {
                if g.b_t {
                    return Err(DeviceError::refused("gemm bias grad", "the column sums need b stored k x n (not transposed)"));
                }
                if *at < c.1 + g.m * g.n && c.1 < at + g.n {
                    return Err(DeviceError::refused("gemm bias grad", format!("the column sums at {at} overlap the product at {}", c.1)));
                }
                fits("gemm bias grad", c.0, at + g.n)
            }
        }
    }
}

/// A half-precision buffer as a cast destination.
pub enum HalfMut<'a, D: Device> {
    /// IEEE binary16.
    F16(&'a mut D::Buf<f16>),
    /// bfloat16.
    Bf16(&'a mut D::Buf<bf16>),
}

/// A half-precision buffer as a cast source.
pub enum HalfRef<'a, D: Device> {
    /// IEEE binary16.
    F16(&'a D::Buf<f16>),
    /// bfloat16.
    Bf16(&'a D::Buf<bf16>),
}

impl<D: Device> HalfMut<'_, D> {
    fn len(&self, dev: &D) -> usize {
        match self {
            HalfMut::F16(b) => dev.len(&**b),
            HalfMut::Bf16(b) => dev.len(&**b),
        }
    }
}

impl<D: Device> HalfRef<'_, D> {
    fn len(&self, dev: &D) -> usize {
        match self {
            HalfRef::F16(b) => dev.len(*b),
            HalfRef::Bf16(b) => dev.len(*b),
        }
    }
}

/// One kernel: element-wise maps, reductions, gathers and scatters, optimizer steps and
/// casts. Reductions run in a fixed order on every backend (one output's inputs are summed
/// in index order), so results do not depend on scheduling. `at` fields are element
/// offsets into the buffer before them.
#[allow(missing_docs)]
pub enum Op<'a, D: Device> {
    /// `z[r, c] = act(z[r, c] + bias[at + c])` over `rows x cols`, in place.
    BiasAct { z: &'a mut D::Buf<f32>, bias: &'a D::Buf<f32>, at: usize, rows: usize, cols: usize, act: Activation },
    /// `delta[i] = 0` where `act[i] <= 0`, for `n` elements (the ReLU's backward).
    ReluGrad { delta: &'a mut D::Buf<f32>, act: &'a D::Buf<f32>, n: usize },
    /// `out[at + c] = sum over rows r of x[r, c]` (rows in order).
    ColumnSum { x: &'a D::Buf<f32>, rows: usize, cols: usize, out: &'a mut D::Buf<f32>, at: usize },
    /// Binary cross-entropy of `n` logits `z` against 0/1 labels `y`: `loss[i]`, and the
    /// gradient of `scale * sum(loss)`, `delta[i] = (sigmoid(z[i]) - y[i]) * scale`.
    BceWithLogits { z: &'a D::Buf<f32>, y: &'a D::Buf<f32>, loss: &'a mut D::Buf<f32>, delta: &'a mut D::Buf<f32>, n: usize, scale: f32 },
    /// [`Op::BceWithLogits`] with a weight per sample (`--decay-base`,
    /// `--merge-duplicates`): `loss[i] = w[i] * bce(z[i], y[i])` and the gradient of
    /// `scale * sum(loss)`, `delta[i] = w[i] * (sigmoid(z[i]) - y[i]) * scale`. A run without
    /// weights never launches it, so its bits stay those of [`Op::BceWithLogits`].
    WeightedBce { z: &'a D::Buf<f32>, y: &'a D::Buf<f32>, w: &'a D::Buf<f32>, loss: &'a mut D::Buf<f32>, delta: &'a mut D::Buf<f32>, n: usize, scale: f32 },
    /// `out[at] = sum of x[0..n)`, accumulated in f64.
    Sum { x: &'a D::Buf<f32>, n: usize, out: &'a mut D::Buf<f32>, at: usize },
    /// Embedding lookup into row blocks: for `i < rows * per_row`, row `index[i]` of
    /// `table` (`dim` values each) goes to `out[(i / per_row) * stride + (i % per_row) * dim ..]`
    /// (output rows of `stride` values).
    GatherRows { table: &'a D::Buf<f32>, index: &'a D::Buf<u32>, out: &'a mut D::Buf<f32>, rows: usize, per_row: usize, dim: usize, stride: usize },
    /// Columns appended to rows: `out[r * stride + col + c] = src[r * cols + c]`.
    CopyColumns { src: &'a D::Buf<f32>, out: &'a mut D::Buf<f32>, rows: usize, cols: usize, stride: usize, col: usize },
    /// The per-key lists of an inverse map (`crate::device::csr`): for the `n` slots of
    /// `inverse` (each naming one of `keys` unique keys, `< keys`: the caller checks),
    /// `slots[offsets[u]..offsets[u + 1]]` are the slots `p` with `inverse[p] == u` in
    /// increasing order ([`crate::device::csr::build_csr`], slot for slot). `scratch` fitted
    /// for `n` ([`CsrScratch::fit`]).
    BuildCsr { inverse: &'a D::Buf<u32>, n: usize, keys: usize, offsets: &'a mut D::Buf<u32>, slots: &'a mut D::Buf<u32>, scratch: &'a mut CsrScratch<D> },
    /// The backward of [`Op::GatherRows`] as a segmented sum: for segment `u`, the
    /// `dim`-value blocks of `src` (`rows` rows of `stride` values) named by
    /// `slots[offsets[u]..offsets[u+1]]` (slot `p` is block `p % per_row` of row
    /// `p / per_row`) summed in list order into `out[u * dim ..]`.
    SegmentSum { src: &'a D::Buf<f32>, offsets: &'a D::Buf<u32>, slots: &'a D::Buf<u32>, out: &'a mut D::Buf<f32>, segments: usize, rows: usize, per_row: usize, dim: usize, stride: usize },
    /// Multi-hot pooling (`EmbeddingBag`, kernels/pooling.cu): bag `b < rows * bags` (field
    /// `b % bags` of row `b / bags`) holds the rows of `table` (`dim` values each) named by
    /// `index[offsets[b]..offsets[b + 1]]`; their sum in list order — divided by the bag's
    /// length for a field whose bit is set in `mean` — goes to `out[(b / bags) * stride +
    /// col + (b % bags) * dim ..]`. An empty bag gives zeros.
    PoolBags { table: &'a D::Buf<f32>, index: &'a D::Buf<u32>, offsets: &'a D::Buf<u32>, out: &'a mut D::Buf<f32>, rows: usize, bags: usize, dim: usize, stride: usize, col: usize, mean: u32 },
    /// The backward of [`Op::PoolBags`], added into the key gradients: for key `u`, the
    /// pooled gradient blocks of `src` (rows as `out` above) of the bags listed in
    /// `slots[key_offsets[u]..key_offsets[u + 1]]` (once per occurrence of the key, in bag
    /// order), each divided by its bag's length for a mean field, are added in list order
    /// to `out[u * dim ..]`.
    PoolBagsGrad { src: &'a D::Buf<f32>, offsets: &'a D::Buf<u32>, key_offsets: &'a D::Buf<u32>, slots: &'a D::Buf<u32>, out: &'a mut D::Buf<f32>, segments: usize, rows: usize, bags: usize, dim: usize, stride: usize, col: usize, mean: u32 },
    /// The input of fields of several widths (`--table`, kernels/pooling.cu): for each row
    /// `r < rows` and column `c < cols.cols`, `out[r * stride + c]` is the value of column `c`'s
    /// field ([`FieldCols`]): a single-hot field's row of unique key
    /// `inverse[r * cols.single + f]`, or a multi-hot field's bag pooled as [`Op::PoolBags`]
    /// pools it (bag `r * bags + g`, `index`/`offsets` its ids); unique key `u`'s row is
    /// `emb[key_at[u]..key_at[u + 1]]`. With one width it is [`Op::GatherRows`] then
    /// [`Op::PoolBags`], the same values.
    GatherFields { emb: &'a D::Buf<f32>, key_at: &'a D::Buf<u32>, inverse: &'a D::Buf<u32>, index: &'a D::Buf<u32>, offsets: &'a D::Buf<u32>, cols: FieldCols<'a, D>, out: &'a mut D::Buf<f32>, rows: usize, stride: usize },
    /// The backward of [`Op::GatherFields`]: key `u`'s gradient row `out[key_at[u]..key_at[u + 1]]`
    /// (`floats` = `key_at[keys]` values in all, no row wider than `widest`) is the sum, from
    /// zero, of the gradient blocks of `src` (`rows` rows of `stride` values) at its
    /// single-hot slots `slots[offsets[u]..offsets[u + 1]]` (slot `p`: field `p % single` of
    /// row `p / single`) in list order, then of its bags' blocks as [`Op::PoolBagsGrad`] adds
    /// them (`key_offsets`, `bag_slots`; `bag_offsets` the bags' ids): [`Op::SegmentSum`] then
    /// [`Op::PoolBagsGrad`], the same additions.
    GatherFieldsGrad {
        src: &'a D::Buf<f32>,
        key_at: &'a D::Buf<u32>,
        offsets: &'a D::Buf<u32>,
        slots: &'a D::Buf<u32>,
        bag_offsets: &'a D::Buf<u32>,
        key_offsets: &'a D::Buf<u32>,
        bag_slots: &'a D::Buf<u32>,
        cols: FieldCols<'a, D>,
        out: &'a mut D::Buf<f32>,
        keys: usize,
        widest: usize,
        floats: usize,
        rows: usize,
        stride: usize,
    },
    /// A block of columns copied between row-major matrices of `rows` rows:
    /// `out[r * stride + col + c] = src[r * src_stride + src_col + c]` for `c < cols`.
    CopyBlock { src: &'a D::Buf<f32>, src_stride: usize, src_col: usize, out: &'a mut D::Buf<f32>, stride: usize, col: usize, rows: usize, cols: usize },
    /// `out[i] = a[i] * b[i]` (or `out[i] += a[i] * b[i]` when `accumulate`) for `n`
    /// elements (DCN-v2's `x_0 * y` and its backward).
    Mul { a: &'a D::Buf<f32>, b: &'a D::Buf<f32>, out: &'a mut D::Buf<f32>, n: usize, accumulate: bool },
    /// `out[i] += x[i]` for `n` elements.
    AddInto { x: &'a D::Buf<f32>, out: &'a mut D::Buf<f32>, n: usize },
    /// DLRM's dot interaction: `z` holds `rows` rows of `vectors` vectors of `dim` values
    /// (`z_0` first); output row `r` (`dim + pairs` values) is `z_0`, then `dot(z_i, z_j)`
    /// for `i` in `0..vectors`, `j < i` (`j <= i` when `with_self`), each summed over `k` in
    /// order.
    Interaction { z: &'a D::Buf<f32>, out: &'a mut D::Buf<f32>, rows: usize, vectors: usize, dim: usize, with_self: bool },
    /// The backward of [`Op::Interaction`]: from the output's gradient `dout`, `dz[r, i, k]`
    /// = (`dout[r, k]` for `i = 0`) + the sum over `j` in order of `dout[r, pair(i, j)]` times
    /// `z[r, j, k]` (twice `z[r, i, k]` for the pair of `i` with itself).
    InteractionGrad { z: &'a D::Buf<f32>, dout: &'a D::Buf<f32>, dz: &'a mut D::Buf<f32>, rows: usize, vectors: usize, dim: usize, with_self: bool },
    /// The deep input of a model with first-order weights: input rows of `fields` blocks of
    /// `dim + 1` values (embedding, weight) then `ndense` features become rows of the
    /// `fields` embeddings (`dim` each) then the features.
    StripFirstOrder { x: &'a D::Buf<f32>, out: &'a mut D::Buf<f32>, rows: usize, fields: usize, dim: usize, ndense: usize },
    /// `out[r] = sum over the fields f in order of x[r, f (dim + 1) + dim]`: the
    /// first-order weights of a sample's keys (input rows as in [`Op::StripFirstOrder`]).
    FirstOrderSum { x: &'a D::Buf<f32>, out: &'a mut D::Buf<f32>, rows: usize, fields: usize, dim: usize, ndense: usize },
    /// The backward of both: input gradient rows from the deep input's gradient `ddeep`
    /// (embedding and feature columns) and the first-order sum's gradient `dsum` (each
    /// field's weight column).
    StripFirstOrderGrad { ddeep: &'a D::Buf<f32>, dsum: &'a D::Buf<f32>, dx: &'a mut D::Buf<f32>, rows: usize, fields: usize, dim: usize, ndense: usize },
    /// The factorisation machine's second-order term over rows of `stride` values whose
    /// first `fields * dim` are the embeddings: `out[r] = 0.5 * sum over k of ((sum_f
    /// e[f, k])^2 - sum_f e[f, k]^2)`, fields and k in order.
    FmSecondOrder { emb: &'a D::Buf<f32>, out: &'a mut D::Buf<f32>, rows: usize, fields: usize, dim: usize, stride: usize },
    /// Its backward, added into `demb`: `demb[r, f, k] += dout[r] * (sum_g e[g, k] - e[f, k])`.
    FmSecondOrderGrad { emb: &'a D::Buf<f32>, dout: &'a D::Buf<f32>, demb: &'a mut D::Buf<f32>, rows: usize, fields: usize, dim: usize, stride: usize },
    /// SGD: `p[at + i] -= lr * g[i]` for `n` elements.
    Sgd { p: &'a mut D::Buf<f32>, at: usize, g: &'a D::Buf<f32>, lr: f32, n: usize },
    /// Adam over `n` parameters from `at` (moments `m`, `v` at the same offset); `alpha`
    /// and `eps_hat` carry the bias correction ([`crate::model::optim::adam_factors`]).
    Adam { p: &'a mut D::Buf<f32>, at: usize, g: &'a D::Buf<f32>, m: &'a mut D::Buf<f32>, v: &'a mut D::Buf<f32>, alpha: f32, beta1: f32, beta2: f32, eps_hat: f32, n: usize },
    /// `dst[dst_at + i] = half(src[src_at + i])` for `n` elements, round to nearest even.
    ToHalf { src: &'a D::Buf<f32>, src_at: usize, dst: HalfMut<'a, D>, dst_at: usize, n: usize },
    /// `dst[dst_at + i] = f32(src[src_at + i])` for `n` elements.
    FromHalf { src: HalfRef<'a, D>, src_at: usize, dst: &'a mut D::Buf<f32>, dst_at: usize, n: usize },
    /// 1-bit encoding with error feedback (kernels/compress.cu, the reference
    /// `engine::compression`), per block of `block` values (0: one block): `residual[i] +=
    /// x[i]` (= v), each block's scale (`l1`: `||v||_1 / d`, else `lambda ||v||_2 /
    /// sqrt(d)`; summed in f64 in order within a block, or for one block by
    /// [`onebit_parts`] strided parts, then over the parts in order) as f32 bits into
    /// `enc[at ..]`, the signs of v into the words after them (bit b of word w: value 32 w +
    /// b, set when v >= 0), and `residual[i] = v - s sign(v)`. `partial` holds 2 words per
    /// part.
    OneBitEncode { x: &'a D::Buf<f32>, residual: &'a mut D::Buf<f32>, n: usize, l1: bool, lambda: f32, block: usize, partial: &'a mut D::Buf<u32>, enc: &'a mut D::Buf<u32>, at: usize },
    /// The sum over `ranks` encodings of one tensor in blocks of `block` (rank r's at word
    /// `r * stride + at` of `gathered`), decoded and added in rank order from 0, into
    /// `x[..n]`; divided by `ranks` when `average`.
    OneBitDecodeSum { gathered: &'a D::Buf<u32>, stride: usize, at: usize, ranks: usize, x: &'a mut D::Buf<f32>, n: usize, block: usize, average: bool },
    /// [`Op::GatherRows`] through the GPU hot-row cache (kernels/cache.cu): unique key `u`'s
    /// row is row `source[u]` of `cache`, or, when `source[u]` has its top bit
    /// ([`crate::device::CACHE_MISS`]) set, row `source[u] & !CACHE_MISS` of `misses`.
    GatherSourced { cache: &'a D::Buf<f32>, misses: &'a D::Buf<f32>, source: &'a D::Buf<u32>, index: &'a D::Buf<u32>, out: &'a mut D::Buf<f32>, rows: usize, per_row: usize, dim: usize, stride: usize },
    /// [`Op::PoolBags`] through the GPU hot-row cache (kernels/pooling.cu): each bag id's row
    /// (a unique key `u`) is read where [`Op::GatherSourced`] reads it — row `source[u]` of
    /// `cache`, or row `source[u] & !CACHE_MISS` of `misses` — and pooled in list order with
    /// [`Op::PoolBags`]' arithmetic, so the pooled values are its values bit for bit.
    PoolBagsSourced { cache: &'a D::Buf<f32>, misses: &'a D::Buf<f32>, source: &'a D::Buf<u32>, index: &'a D::Buf<u32>, offsets: &'a D::Buf<u32>, out: &'a mut D::Buf<f32>, rows: usize, bags: usize, dim: usize, stride: usize, col: usize, mean: u32 },
    /// The host table's optimizer step on cached rows, bit for bit (the arithmetic of
    /// `embedding::update`): for entry `e < n`, gradient row `grads[e * dim ..]` updates row
    /// `slots[e]` of `rows` — SGD `w -= lr * g`, or with `adagrad` (accumulators `acc`, one
    /// per row) `acc += sum(g^2) / dim; w -= lr * g / (sqrt(acc) + eps)`, each operation
    /// rounded on its own, sums in order. Slots must be distinct. With `index`, entry `e`'s
    /// gradient row is `grads[index[e] * dim ..]` instead. An entry whose slot has
    /// [`crate::device::CACHE_MISS`] set is skipped, so a batch's sources can serve as the
    /// slots of its own key gradients.
    CacheUpdate { rows: &'a mut D::Buf<f32>, acc: &'a mut D::Buf<f32>, slots: &'a D::Buf<u32>, grads: &'a D::Buf<f32>, index: Option<&'a D::Buf<u32>>, n: usize, dim: usize, lr: f32, eps: f32, adagrad: bool },
    /// Rows put into cache slots: `values[e * dim ..]` into row `slots[e]` of `rows` for
    /// `e < n`, and with `has_acc`, `accs[e]` into `acc[slots[e]]`.
    CachePut { rows: &'a mut D::Buf<f32>, acc: &'a mut D::Buf<f32>, slots: &'a D::Buf<u32>, values: &'a D::Buf<f32>, accs: &'a D::Buf<f32>, n: usize, dim: usize, has_acc: bool },
    /// New keys' rows made on the device: for `e < n`, the f32 initial row
    /// ([`crate::hash::init_row_f32`] with `seed` and `scale`, bit for bit) of key
    /// `keys[2e] | keys[2e + 1] << 32` into row `at + e` of `out` (rows of `dim`).
    InitRows { keys: &'a D::Buf<u32>, out: &'a mut D::Buf<f32>, at: usize, n: usize, dim: usize, seed: u64, scale: f32 },
}

pub use crate::onebit::scales as onebit_scales;

/// DLRM's number of dot products of `vectors` vectors: pairs `j < i`, or `j <= i` with
/// each vector's dot with itself.
pub fn interaction_pairs(vectors: usize, with_self: bool) -> usize {
    if with_self {
        vectors * (vectors + 1) / 2
    } else {
        vectors * vectors.saturating_sub(1) / 2
    }
}

/// Words of a 1-bit encoding of `n` values in blocks of `block`: the scales, then the
/// sign bits.
pub fn onebit_words(n: usize, block: usize) -> usize {
    onebit_scales(n, block) + n.div_ceil(32)
}

/// Parts the norms of a 1-bit encoding of `n` values are summed in: one per block, or for
/// one block (`block` 0) up to [`ONEBIT_MAX_PARTS`] (at least 1).
pub fn onebit_parts(n: usize, block: usize) -> usize {
    if block == 0 {
        n.clamp(1, ONEBIT_MAX_PARTS)
    } else {
        onebit_scales(n, block)
    }
}

/// The most parts of a 1-bit norm.
pub const ONEBIT_MAX_PARTS: usize = 4096;

impl<D: Device> Op<'_, D> {
    /// The kernel's name (errors, traces).
    pub fn name(&self) -> &'static str {
        match self {
            Op::BiasAct { .. } => "bias_act",
            Op::ReluGrad { .. } => "relu_grad",
            Op::ColumnSum { .. } => "column_sum",
            Op::BceWithLogits { .. } => "bce_with_logits",
            Op::WeightedBce { .. } => "weighted_bce",
            Op::Sum { .. } => "sum",
            Op::GatherRows { .. } => "gather_rows",
            Op::CopyColumns { .. } => "copy_columns",
            Op::BuildCsr { .. } => "build_csr",
            Op::SegmentSum { .. } => "segment_sum",
            Op::PoolBags { .. } => "pool_bags",
            Op::PoolBagsGrad { .. } => "pool_bags_grad",
            Op::GatherFields { .. } => "gather_fields",
            Op::GatherFieldsGrad { .. } => "gather_fields_grad",
            Op::CopyBlock { .. } => "copy_block",
            Op::Mul { .. } => "mul",
            Op::AddInto { .. } => "add_into",
            Op::Interaction { .. } => "interaction",
            Op::InteractionGrad { .. } => "interaction_grad",
            Op::StripFirstOrder { .. } => "strip_first_order",
            Op::FirstOrderSum { .. } => "first_order_sum",
            Op::StripFirstOrderGrad { .. } => "strip_first_order_grad",
            Op::FmSecondOrder { .. } => "fm_second_order",
            Op::FmSecondOrderGrad { .. } => "fm_second_order_grad",
            Op::Sgd { .. } => "sgd",
            Op::Adam { .. } => "adam",
            Op::ToHalf { .. } => "to_half",
            Op::FromHalf { .. } => "from_half",
            Op::OneBitEncode { .. } => "onebit_encode",
            Op::OneBitDecodeSum { .. } => "onebit_decode_sum",
            Op::GatherSourced { .. } => "gather_sourced",
            Op::PoolBagsSourced { .. } => "pool_bags_sourced",
            Op::CacheUpdate { .. } => "cache_update",
            Op::CachePut { .. } => "cache_put",
            Op::InitRows { .. } => "init_rows",
        }
    }

    /// Checks that every buffer holds what the operation touches. Row numbers read from
    /// `index` and `slots` are data: the caller checks them where it builds them.
    pub fn check(&self, dev: &D) -> DeviceResult<()> {
        let f = |what: &str, have: usize, need: usize| fits(&format!("{}: {what}", self.name()), have, need);
        match self {
            Op::BiasAct { z, bias, at, rows, cols, .. } => {
                f("z", dev.len(&**z), rows * cols)?;
                f("bias", dev.len(*bias), at + cols)
            }
            Op::ReluGrad { delta, act, n } => {
                f("delta", dev.len(&**delta), *n)?;
                f("act", dev.len(*act), *n)
            }
            Op::ColumnSum { x, rows, cols, out, at } => {
                f("x", dev.len(*x), rows * cols)?;
                f("out", dev.len(&**out), at + cols)
            }
            Op::BceWithLogits { z, y, loss, delta, n, .. } => {
                f("z", dev.len(*z), *n)?;
                f("labels", dev.len(*y), *n)?;
                f("loss", dev.len(&**loss), *n)?;
                f("delta", dev.len(&**delta), *n)
            }
            Op::WeightedBce { z, y, w, loss, delta, n, .. } => {
                f("z", dev.len(*z), *n)?;
                f("labels", dev.len(*y), *n)?;
                f("weights", dev.len(*w), *n)?;
                f("loss", dev.len(&**loss), *n)?;
                f("delta", dev.len(&**delta), *n)
            }
            Op::Sum { x, n, out, at } => {
                f("x", dev.len(*x), *n)?;
                f("out", dev.len(&**out), at + 1)
            }
            Op::GatherRows { index, out, rows, per_row, dim, stride, .. } => {
                if per_row * dim > *stride {
                    return Err(DeviceError::refused("gather_rows", format!("{per_row} rows of {dim} do not fit an output row of {stride}")));
                }
                f("index", dev.len(*index), rows * per_row)?;
                f("out", dev.len(&**out), rows * stride)
            }
            Op::CopyColumns { src, out, rows, cols, stride, col } => {
                if col + cols > *stride {
                    return Err(DeviceError::refused("copy_columns", format!("columns {col}..{} do not fit an output row of {stride}", col + cols)));
                }
                f("src", dev.len(*src), rows * cols)?;
                f("out", dev.len(&**out), rows * stride)
            }
            Op::BuildCsr { .. } => self.check_csr(dev),
            Op::SegmentSum { src, offsets, slots, out, segments, rows, per_row, dim, stride } => {
                if per_row * dim > *stride {
                    return Err(DeviceError::refused("segment_sum", format!("{per_row} blocks of {dim} do not fit a row of {stride}")));
                }
                f("src", dev.len(*src), rows * stride)?;
                f("offsets", dev.len(*offsets), segments + 1)?;
                f("slots", dev.len(*slots), rows * per_row)?;
                f("out", dev.len(&**out), segments * dim)
            }
            // The models' and the cache's kernels.
            Op::CopyBlock { .. } | Op::Mul { .. } | Op::AddInto { .. } | Op::Interaction { .. } | Op::InteractionGrad { .. } | Op::StripFirstOrder { .. } => self.check_model(dev),
            Op::FirstOrderSum { .. } | Op::StripFirstOrderGrad { .. } | Op::FmSecondOrder { .. } | Op::FmSecondOrderGrad { .. } => self.check_model(dev),
            Op::GatherSourced { .. } | Op::CacheUpdate { .. } | Op::CachePut { .. } | Op::InitRows { .. } => self.check_model(dev),
            Op::PoolBags { .. } | Op::PoolBagsSourced { .. } | Op::PoolBagsGrad { .. } | Op::GatherFields { .. } | Op::GatherFieldsGrad { .. } => self.check_pooling(dev),
            Op::Sgd { p, at, g, n, .. } => {
                f("params", dev.len(&**p), at + n)?;
                f("grad", dev.len(*g), *n)
            }
            Op::Adam { p, at, g, m, v, n, .. } => {
                f("params", dev.len(&**p), at + n)?;
                f("grad", dev.len(*g), *n)?;
                f("m", dev.len(&**m), at + n)?;
                f("v", dev.len(&**v), at + n)
            }
            Op::ToHalf { src, src_at, dst, dst_at, n } => {
                f("src", dev.len(*src), src_at + n)?;
                f("dst", dst.len(dev), dst_at + n)
            }
            Op::FromHalf { src, src_at, dst, dst_at, n } => {
                f("src", src.len(dev), src_at + n)?;
                f("dst", dev.len(&**dst), dst_at + n)
            }
            Op::OneBitEncode { x, residual, n, block, partial, enc, at, .. } => {
                f("x", dev.len(*x), *n)?;
                f("residual", dev.len(&**residual), *n)?;
                f("partial", dev.len(&**partial), 2 * onebit_parts(*n, *block))?;
                f("enc", dev.len(&**enc), at + onebit_words(*n, *block))
            }
            Op::OneBitDecodeSum { gathered, stride, at, ranks, x, n, block, .. } => {
                if at + onebit_words(*n, *block) > *stride {
                    return Err(DeviceError::refused("onebit_decode_sum", format!("an encoding of {n} values at word {at} does not fit a rank's {stride} words")));
                }
                f("gathered", dev.len(*gathered), ranks * stride)?;
                f("x", dev.len(&**x), *n)
            }
        }
    }
}

/// The most multi-hot fields one pooling launch takes (the bits of its `mean` mask).
pub const MAX_BAGS: usize = 32;

/// The columns of an input of fields of several widths ([`Op::GatherFields`]): fields
/// `0..single` single-hot, the others multi-hot (bit `g` of `mean`: field `single + g`
/// mean-pooled). Built and checked by its owner (`model::fields`); a kernel reads its
/// arrays as data.
pub struct FieldCols<'a, D: Device> {
    /// Per field its first column, then the columns in all (`fields + 1` values, rising).
    pub field_col: &'a D::Buf<u32>,
    /// Per column its field (`cols` values).
    pub col_field: &'a D::Buf<u32>,
    /// Columns of a row's fields.
    pub cols: usize,
    /// Fields.
    pub fields: usize,
    /// Single-hot fields (the first ones).
    pub single: usize,
    /// The multi-hot fields' mean mask.
    pub mean: u32,
}

impl<D: Device> FieldCols<'_, D> {
    /// Refuses columns that do not fit a row of `stride`, more multi-hot fields than a mask
    /// holds, or arrays shorter than the fields and columns.
    fn check(&self, dev: &D, name: &str, stride: usize) -> DeviceResult<()> {
        if self.single > self.fields {
            return Err(DeviceError::refused(name, format!("{} single-hot fields of {}", self.single, self.fields)));
        }
        check_bags(name, self.fields - self.single, 0, stride, self.cols)?;
        fits(&format!("{name}: field_col"), dev.len(self.field_col), self.fields + 1)?;
        fits(&format!("{name}: col_field"), dev.len(self.col_field), self.cols)
    }
}

/// Refuses a pooling whose fields do not fit its mask or an output row.
fn check_bags(name: &str, bags: usize, dim: usize, stride: usize, col: usize) -> DeviceResult<()> {
    if bags > MAX_BAGS {
        return Err(DeviceError::refused(name, format!("{bags} multi-hot fields; one pooling takes at most {MAX_BAGS}")));
    }
    if col + bags * dim > stride {
        return Err(DeviceError::refused(name, format!("{bags} bags of {dim} from column {col} do not fit a row of {stride}")));
    }
    Ok(())
}

impl<D: Device> Op<'_, D> {
    /// [`Op::check`] of the per-key lists' build (kernels/csr.cu).
    fn check_csr(&self, dev: &D) -> DeviceResult<()> {
        let f = |what: &str, have: usize, need: usize| fits(&format!("build_csr: {what}"), have, need);
        let Op::BuildCsr { inverse, n, keys, offsets, slots, scratch } = self else {
            return Ok(());
        };
        u32::try_from(*n).map_err(|_| DeviceError::refused("build_csr", format!("{n} slots do not fit a u32 position")))?;
        f("inverse", dev.len(*inverse), *n)?;
        f("offsets", dev.len(&**offsets), keys + 1)?;
        f("slots", dev.len(&**slots), *n)?;
        if !scratch.fits(dev, *n) {
            return Err(DeviceError::refused("build_csr", format!("the scratch does not hold what {n} slots need (CsrScratch::fit)")));
        }
        Ok(())
    }

    /// [`Op::check`] of the pooling kernels (kernels/pooling.cu).
    fn check_pooling(&self, dev: &D) -> DeviceResult<()> {
        let f = |what: &str, have: usize, need: usize| fits(&format!("{}: {what}", self.name()), have, need);
        match self {
            Op::PoolBags { offsets, out, rows, bags, dim, stride, col, .. } | Op::PoolBagsSourced { offsets, out, rows, bags, dim, stride, col, .. } => {
                check_bags(self.name(), *bags, *dim, *stride, *col)?;
                f("offsets", dev.len(*offsets), rows * bags + 1)?;
                f("out", dev.len(&**out), rows * stride)
            }
            Op::PoolBagsGrad { src, offsets, key_offsets, out, segments, rows, bags, dim, stride, col, .. } => {
                check_bags("pool_bags_grad", *bags, *dim, *stride, *col)?;
                f("src", dev.len(*src), rows * stride)?;
                f("offsets", dev.len(*offsets), rows * bags + 1)?;
                f("key_offsets", dev.len(*key_offsets), segments + 1)?;
                f("out", dev.len(&**out), segments * dim)
            }
            Op::GatherFields { key_at, inverse, offsets, cols, out, rows, stride, .. } => {
                cols.check(dev, "gather_fields", *stride)?;
                f("inverse", dev.len(*inverse), rows * cols.single)?;
                f("offsets", dev.len(*offsets), rows * (cols.fields - cols.single) + 1)?;
                f("key_at", dev.len(*key_at), 1)?;
                f("out", dev.len(&**out), rows * stride)
            }
            Op::GatherFieldsGrad { src, key_at, offsets, bag_offsets, key_offsets, cols, out, keys, floats, rows, stride, .. } => {
                cols.check(dev, "gather_fields_grad", *stride)?;
                f("src", dev.len(*src), rows * stride)?;
                f("key_at", dev.len(*key_at), keys + 1)?;
                f("offsets", dev.len(*offsets), keys + 1)?;
                f("key_offsets", dev.len(*key_offsets), keys + 1)?;
                f("bag_offsets", dev.len(*bag_offsets), rows * (cols.fields - cols.single) + 1)?;
                f("out", dev.len(&**out), *floats)
            }
            _ => Ok(()),
        }
    }

    /// [`Op::check`] of the models' kernels (kernels/models.cu) and the hot-row cache's
    /// (kernels/cache.cu).
    fn check_model(&self, dev: &D) -> DeviceResult<()> {
        let f = |what: &str, have: usize, need: usize| fits(&format!("{}: {what}", self.name()), have, need);
        match self {
            Op::CopyBlock { src, src_stride, src_col, out, stride, col, rows, cols } => {
                if src_col + cols > *src_stride || col + cols > *stride {
                    return Err(DeviceError::refused("copy_block", format!("columns {src_col}+{cols} of rows of {src_stride} or {col}+{cols} of rows of {stride} out of bounds")));
                }
                f("src", dev.len(*src), rows * src_stride)?;
                f("out", dev.len(&**out), rows * stride)
            }
            Op::Mul { a, b, out, n, .. } => {
                f("a", dev.len(*a), *n)?;
                f("b", dev.len(*b), *n)?;
                f("out", dev.len(&**out), *n)
            }
            Op::AddInto { x, out, n } => {
                f("x", dev.len(*x), *n)?;
                f("out", dev.len(&**out), *n)
            }
            Op::Interaction { z, out, rows, vectors, dim, with_self } => {
                f("z", dev.len(*z), rows * vectors * dim)?;
                f("out", dev.len(&**out), rows * (dim + interaction_pairs(*vectors, *with_self)))
            }
            Op::InteractionGrad { z, dout, dz, rows, vectors, dim, with_self } => {
                f("z", dev.len(*z), rows * vectors * dim)?;
                f("dout", dev.len(*dout), rows * (dim + interaction_pairs(*vectors, *with_self)))?;
                f("dz", dev.len(&**dz), rows * vectors * dim)
            }
            Op::StripFirstOrder { x, out, rows, fields, dim, ndense } => {
                f("x", dev.len(*x), rows * (fields * (dim + 1) + ndense))?;
                f("out", dev.len(&**out), rows * (fields * dim + ndense))
            }
            Op::FirstOrderSum { x, out, rows, fields, dim, ndense } => {
                f("x", dev.len(*x), rows * (fields * (dim + 1) + ndense))?;
                f("out", dev.len(&**out), *rows)
            }
            Op::StripFirstOrderGrad { ddeep, dsum, dx, rows, fields, dim, ndense } => {
                f("ddeep", dev.len(*ddeep), rows * (fields * dim + ndense))?;
                f("dsum", dev.len(*dsum), *rows)?;
                f("dx", dev.len(&**dx), rows * (fields * (dim + 1) + ndense))
            }
            Op::FmSecondOrder { emb, out, rows, fields, dim, stride } => {
                if fields * dim > *stride {
                    return Err(DeviceError::refused("fm_second_order", format!("{fields} fields of {dim} do not fit a row of {stride}")));
                }
                f("emb", dev.len(*emb), rows * stride)?;
                f("out", dev.len(&**out), *rows)
            }
            Op::FmSecondOrderGrad { emb, dout, demb, rows, fields, dim, stride } => {
                if fields * dim > *stride {
                    return Err(DeviceError::refused("fm_second_order_grad", format!("{fields} fields of {dim} do not fit a row of {stride}")));
                }
                f("emb", dev.len(*emb), rows * stride)?;
                f("dout", dev.len(*dout), *rows)?;
                f("demb", dev.len(&**demb), rows * stride)
            }
            Op::GatherSourced { index, out, rows, per_row, dim, stride, .. } => {
                if per_row * dim > *stride {
                    return Err(DeviceError::refused("gather_sourced", format!("{per_row} rows of {dim} do not fit an output row of {stride}")));
                }
                f("index", dev.len(*index), rows * per_row)?;
                f("out", dev.len(&**out), rows * stride)
            }
            Op::CacheUpdate { slots, grads, index, n, dim, .. } => {
                f("slots", dev.len(*slots), *n)?;
                match index {
                    Some(index) => f("index", dev.len(*index), *n),
                    None => f("grads", dev.len(*grads), n * dim),
                }
            }
            Op::CachePut { slots, values, accs, n, dim, has_acc, .. } => {
                f("slots", dev.len(*slots), *n)?;
                f("values", dev.len(*values), n * dim)?;
                f("accs", dev.len(*accs), if *has_acc { *n } else { 0 })
            }
            Op::InitRows { keys, out, at, n, dim, .. } => {
                f("keys", dev.len(*keys), 2 * n)?;
                f("out", dev.len(&**out), (at + n) * dim)
            }
            _ => Ok(()),
        }
    }
}

/// One kernel argument, in the kernel's parameter order, as `cuLaunchKernel` takes them.
pub enum KernelArg<'a, D: Device> {
    /// A `const float*` into a buffer, at an element offset.
    In(&'a D::Buf<f32>, usize),
    /// A `float*` into a buffer, at an element offset.
    Out(&'a mut D::Buf<f32>, usize),
    /// A `const u32*` to a whole buffer.
    InU32(&'a D::Buf<u32>),
    /// A `u32*` into a buffer, at an element offset.
    OutU32(&'a mut D::Buf<u32>, usize),
    /// A `const u16*` into an f16 buffer, at an element offset.
    InF16(&'a D::Buf<f16>, usize),
    /// A `u16*` into an f16 buffer, at an element offset.
    OutF16(&'a mut D::Buf<f16>, usize),
    /// A `const u16*` into a bf16 buffer, at an element offset.
    InBf16(&'a D::Buf<bf16>, usize),
    /// A `u16*` into a bf16 buffer, at an element offset.
    OutBf16(&'a mut D::Buf<bf16>, usize),
    /// An `int`.
    I32(i32),
    /// A `long long`.
    I64(i64),
    /// A `float`.
    F32(f32),
}

/// A device that runs [`Op`]s by launching the kernels of kernels/*.cu.
pub trait LaunchKernels: Device {
    /// Runs `kernel` over `work` independent outputs (the grid-stride loop's extent).
    fn launch(&self, kernel: Kernel, work: usize, args: &mut [KernelArg<'_, Self>]) -> DeviceResult<()>;
}

/// An `int` kernel argument; sizes past `i32::MAX` are refused rather than wrapped.
fn int<'a, D: Device>(v: usize) -> DeviceResult<KernelArg<'a, D>> {
    i32::try_from(v).map(KernelArg::I32).map_err(|_| DeviceError::refused("kernel launch", format!("size {v} does not fit the kernel's int argument; use a smaller --batch")))
}

/// A `long long` kernel argument.
fn long<'a, D: Device>(v: usize) -> KernelArg<'a, D> {
    KernelArg::I64(v as i64)
}

/// Runs `op` with the kernels of kernels/*.cu (bounds already checked).
pub fn launch<D: LaunchKernels>(dev: &D, op: Op<'_, D>) -> DeviceResult<()> {
    use KernelArg::{In, InU32, Out, F32};
    match op {
        Op::BiasAct { z, bias, at, rows, cols, act } => dev.launch(Kernel::BiasAct, rows * cols, &mut [Out(z, 0), In(bias, at), int(rows)?, int(cols)?, KernelArg::I32((act == Activation::Relu) as i32)]),
        Op::ReluGrad { delta, act, n } => dev.launch(Kernel::ReluGrad, n, &mut [Out(delta, 0), In(act, 0), long(n)]),
        Op::ColumnSum { x, rows, cols, out, at } => dev.launch(Kernel::ColumnSum, cols, &mut [In(x, 0), Out(out, at), int(rows)?, int(cols)?]),
        Op::BceWithLogits { z, y, loss, delta, n, scale } => dev.launch(Kernel::BceWithLogits, n, &mut [In(z, 0), In(y, 0), Out(loss, 0), Out(delta, 0), int(n)?, F32(scale)]),
        Op::WeightedBce { z, y, w, loss, delta, n, scale } => dev.launch(Kernel::WeightedBce, n, &mut [In(z, 0), In(y, 0), In(w, 0), Out(loss, 0), Out(delta, 0), int(n)?, F32(scale)]),
        Op::Sum { x, n, out, at } => dev.launch(Kernel::Sum, 1, &mut [In(x, 0), Out(out, at), int(n)?]),
        Op::GatherRows { table, index, out, rows, per_row, dim, stride } => dev.launch(Kernel::GatherRows, rows * per_row * dim, &mut [In(table, 0), InU32(index), Out(out, 0), int(rows)?, int(per_row)?, int(dim)?, int(stride)?]),
        Op::CopyColumns { src, out, rows, cols, stride, col } => dev.launch(Kernel::CopyColumns, rows * cols, &mut [In(src, 0), Out(out, 0), int(rows)?, int(cols)?, int(stride)?, int(col)?]),
        op @ Op::BuildCsr { .. } => super::csr::launch(dev, op),
        Op::SegmentSum { src, offsets, slots, out, segments, per_row, dim, stride, .. } => {
            dev.launch(Kernel::SegmentSum, segments * dim, &mut [In(src, 0), InU32(offsets), InU32(slots), Out(out, 0), int(segments)?, int(per_row)?, int(dim)?, int(stride)?])
        }
        Op::PoolBags { table, index, offsets, out, rows, bags, dim, stride, col, mean } => {
            dev.launch(Kernel::PoolBags, rows * bags * dim, &mut [In(table, 0), InU32(index), InU32(offsets), Out(out, 0), int(rows)?, int(bags)?, int(dim)?, int(stride)?, int(col)?, KernelArg::I32(mean as i32)])
        }
        Op::PoolBagsGrad { src, offsets, key_offsets, slots, out, segments, bags, dim, stride, col, mean, .. } => dev.launch(
            Kernel::PoolBagsGrad,
            segments * dim,
            &mut [In(src, 0), InU32(offsets), InU32(key_offsets), InU32(slots), Out(out, 0), int(segments)?, int(bags)?, int(dim)?, int(stride)?, int(col)?, KernelArg::I32(mean as i32)],
        ),
        op @ (Op::GatherFields { .. } | Op::GatherFieldsGrad { .. }) => launch_fields(dev, op),
        Op::CopyBlock { src, src_stride, src_col, out, stride, col, rows, cols } => dev.launch(Kernel::CopyBlock, rows * cols, &mut [In(src, 0), int(src_stride)?, int(src_col)?, Out(out, 0), int(stride)?, int(col)?, int(rows)?, int(cols)?]),
        Op::Mul { a, b, out, n, accumulate } => dev.launch(Kernel::Mul, n, &mut [In(a, 0), In(b, 0), Out(out, 0), long(n), KernelArg::I32(accumulate as i32)]),
        Op::AddInto { x, out, n } => dev.launch(Kernel::AddInto, n, &mut [In(x, 0), Out(out, 0), long(n)]),
        Op::Interaction { z, out, rows, vectors, dim, with_self } => {
            let width = dim + interaction_pairs(vectors, with_self);
            dev.launch(Kernel::Interaction, rows * width, &mut [In(z, 0), Out(out, 0), int(rows)?, int(vectors)?, int(dim)?, KernelArg::I32(with_self as i32)])
        }
        Op::InteractionGrad { z, dout, dz, rows, vectors, dim, with_self } => dev.launch(Kernel::InteractionGrad, rows * vectors * dim, &mut [In(z, 0), In(dout, 0), Out(dz, 0), int(rows)?, int(vectors)?, int(dim)?, KernelArg::I32(with_self as i32)]),
        Op::StripFirstOrder { x, out, rows, fields, dim, ndense } => dev.launch(Kernel::StripFirstOrder, rows * (fields * dim + ndense), &mut [In(x, 0), Out(out, 0), int(rows)?, int(fields)?, int(dim)?, int(ndense)?]),
        Op::FirstOrderSum { x, out, rows, fields, dim, ndense } => dev.launch(Kernel::FirstOrderSum, rows, &mut [In(x, 0), Out(out, 0), int(rows)?, int(fields)?, int(dim)?, int(ndense)?]),
        Op::StripFirstOrderGrad { ddeep, dsum, dx, rows, fields, dim, ndense } => {
            dev.launch(Kernel::StripFirstOrderGrad, rows * (fields * (dim + 1) + ndense), &mut [In(ddeep, 0), In(dsum, 0), Out(dx, 0), int(rows)?, int(fields)?, int(dim)?, int(ndense)?])
        }
        Op::FmSecondOrder { emb, out, rows, fields, dim, stride } => dev.launch(Kernel::FmSecondOrder, rows, &mut [In(emb, 0), Out(out, 0), int(rows)?, int(fields)?, int(dim)?, int(stride)?]),
        Op::FmSecondOrderGrad { emb, dout, demb, rows, fields, dim, stride } => dev.launch(Kernel::FmSecondOrderGrad, rows * dim, &mut [In(emb, 0), In(dout, 0), Out(demb, 0), int(rows)?, int(fields)?, int(dim)?, int(stride)?]),
        Op::Sgd { p, at, g, lr, n } => dev.launch(Kernel::SgdUpdate, n, &mut [Out(p, at), In(g, 0), F32(lr), long(n)]),
        Op::Adam { p, at, g, m, v, alpha, beta1, beta2, eps_hat, n } => {
            dev.launch(Kernel::AdamUpdate, n, &mut [Out(p, at), In(g, 0), Out(m, at), Out(v, at), F32(alpha), F32(beta1), F32(beta2), F32(eps_hat), long(n)])
        }
        Op::ToHalf { src, src_at, dst, dst_at, n } => match dst {
            HalfMut::F16(d) => dev.launch(Kernel::F32ToF16, n, &mut [In(src, src_at), KernelArg::OutF16(d, dst_at), long(n)]),
            HalfMut::Bf16(d) => dev.launch(Kernel::F32ToBf16, n, &mut [In(src, src_at), KernelArg::OutBf16(d, dst_at), long(n)]),
        },
        Op::FromHalf { src, src_at, dst, dst_at, n } => match src {
            HalfRef::F16(s) => dev.launch(Kernel::F16ToF32, n, &mut [KernelArg::InF16(s, src_at), Out(dst, dst_at), long(n)]),
            HalfRef::Bf16(s) => dev.launch(Kernel::Bf16ToF32, n, &mut [KernelArg::InBf16(s, src_at), Out(dst, dst_at), long(n)]),
        },
        Op::OneBitEncode { x, residual, n, l1, lambda, block, partial, enc, at } => {
            let (parts, scales) = (onebit_parts(n, block), onebit_scales(n, block));
            let l1 = l1 as i32;
            dev.launch(Kernel::OneBitNorms, parts, &mut [In(x, 0), Out(residual, 0), KernelArg::OutU32(partial, 0), int(n)?, int(parts)?, KernelArg::I32(l1), int(block)?])?;
            dev.launch(Kernel::OneBitScale, scales, &mut [InU32(partial), KernelArg::OutU32(enc, at), int(n)?, int(parts)?, KernelArg::I32(l1), F32(lambda), int(block)?])?;
            dev.launch(Kernel::OneBitPack, n.div_ceil(32), &mut [Out(residual, 0), KernelArg::OutU32(enc, at), int(n)?, int(block)?, int(scales)?])
        }
        Op::OneBitDecodeSum { gathered, stride, at, ranks, x, n, block, average } => {
            let scales = onebit_scales(n, block);
            dev.launch(Kernel::OneBitUnpackSum, n, &mut [InU32(gathered), Out(x, 0), int(n)?, int(ranks)?, long(stride), long(at), KernelArg::I32(average as i32), int(block)?, int(scales)?])
        }
        Op::PoolBagsSourced { cache, misses, source, index, offsets, out, rows, bags, dim, stride, col, mean } => dev.launch(
            Kernel::PoolBagsSourced,
            rows * bags * dim,
            &mut [In(cache, 0), In(misses, 0), InU32(source), InU32(index), InU32(offsets), Out(out, 0), int(rows)?, int(bags)?, int(dim)?, int(stride)?, int(col)?, KernelArg::I32(mean as i32)],
        ),
        Op::GatherSourced { cache, misses, source, index, out, rows, per_row, dim, stride } => {
            dev.launch(Kernel::GatherSourced, rows * per_row * dim, &mut [In(cache, 0), In(misses, 0), InU32(source), InU32(index), Out(out, 0), int(rows)?, int(per_row)?, int(dim)?, int(stride)?])
        }
        Op::CacheUpdate { rows, acc, slots, grads, index, n, dim, lr, eps, adagrad } => {
            let indexed = index.is_some() as i32;
            let index = index.unwrap_or(slots);
            dev.launch(Kernel::CacheUpdate, n, &mut [Out(rows, 0), Out(acc, 0), InU32(slots), In(grads, 0), InU32(index), KernelArg::I32(indexed), int(n)?, int(dim)?, F32(lr), F32(eps), KernelArg::I32(adagrad as i32)])
        }
        Op::CachePut { rows, acc, slots, values, accs, n, dim, has_acc } => {
            dev.launch(Kernel::CachePut, n * dim, &mut [Out(rows, 0), Out(acc, 0), InU32(slots), In(values, 0), In(accs, 0), int(n)?, int(dim)?, KernelArg::I32(has_acc as i32)])
        }
        Op::InitRows { keys, out, at, n, dim, seed, scale } => dev.launch(Kernel::InitRows, n * dim, &mut [InU32(keys), Out(out, at * dim), int(n)?, int(dim)?, KernelArg::I64(seed as i64), F32(scale)]),
    }
}

/// [`launch`] of the kernels of fields of several widths (kernels/pooling.cu).
fn launch_fields<D: LaunchKernels>(dev: &D, op: Op<'_, D>) -> DeviceResult<()> {
    use KernelArg::{In, InU32, Out};
    match op {
        Op::GatherFields { emb, key_at, inverse, index, offsets, cols: c, out, rows, stride } => dev.launch(
            Kernel::GatherFields,
            rows * c.cols,
            &mut [In(emb, 0), InU32(key_at), InU32(inverse), InU32(index), InU32(offsets), InU32(c.field_col), InU32(c.col_field), Out(out, 0), int(rows)?, int(c.cols)?, int(c.fields)?, int(c.single)?, int(stride)?, KernelArg::I32(c.mean as i32)],
        ),
        Op::GatherFieldsGrad { src, key_at, offsets, slots, bag_offsets, key_offsets, bag_slots, cols: c, out, keys, widest, stride, .. } => dev.launch(
            Kernel::GatherFieldsGrad,
            keys * widest,
            &mut [
                In(src, 0),
                InU32(key_at),
                InU32(offsets),
                InU32(slots),
                InU32(bag_offsets),
                InU32(key_offsets),
                InU32(bag_slots),
                InU32(c.field_col),
                Out(out, 0),
                int(keys)?,
                int(widest)?,
                int(c.fields)?,
                int(c.single)?,
                int(stride)?,
                KernelArg::I32(c.mean as i32),
            ],
        ),
        _ => Err(DeviceError::refused(op.name(), "not a kernel of fields of several widths")),
    }
}

/// The epilogue of a GEMM on a kernel device: launched after the product.
pub fn launch_epilogue<D: LaunchKernels>(dev: &D, g: &Gemm, b: (&D::Buf<f32>, usize), c: &mut D::Buf<f32>, c_at: usize, epi: Epilogue<'_, D>) -> DeviceResult<()> {
    if c_at != 0 && matches!(epi, Epilogue::Bias { .. } | Epilogue::ReluGrad { .. }) {
        return Err(DeviceError::refused("gemm epilogue", "an epilogue needs c at offset 0"));
    }
    match epi {
        Epilogue::None => Ok(()),
        Epilogue::Bias { bias, at, act } => dev.exec(Op::BiasAct { z: c, bias, at, rows: g.m, cols: g.n, act }),
        Epilogue::ReluGrad { act } => dev.exec(Op::ReluGrad { delta: c, act, n: g.m * g.n }),
        Epilogue::BiasGrad { at } => {
            if b.1 != 0 {
                return Err(DeviceError::refused("gemm bias grad", "b must start at offset 0"));
            }
            dev.exec(Op::ColumnSum { x: b.0, rows: g.k, cols: g.n, out: c, at })
        }
    }
}
