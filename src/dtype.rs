//! Element types and reduction operations, and the reduction kernels every backend shares.
//!
//! The kernels are plain indexed loops over slices that LLVM vectorises (packed
//! `addps`/`minps`/`paddd`... on x86-64; see ARCHITECTURE.md for how this was checked).
//! f16/bf16 accumulate in f32: inputs are widened block-wise into an f32 scratch buffer,
//! combined there and narrowed once.

use half::{bf16, f16};

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Raw bytes (allgatherv/broadcast payloads; not reducible).
    U8,
}

impl DType {
    /// Every dtype, in wire-code order.
    pub const ALL: [DType; 7] = [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U8];
    /// The reducible dtypes.
    pub const REDUCIBLE: [DType; 6] = [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }
    /// The name nccl-tests prints.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F64 => "double",
            DType::F16 => "half",
            DType::BF16 => "bfloat16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
        }
    }
    /// Parses `f32`, `float`, `bf16`, ... as accepted on the command line.
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "f32" | "float" | "float32" => DType::F32,
            "f64" | "double" | "float64" => DType::F64,
            "f16" | "half" | "float16" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "i32" | "int32" | "int" => DType::I32,
            "i64" | "int64" => DType::I64,
            "u8" | "uint8" | "byte" => DType::U8,
            _ => return None,
        })
    }
    /// True for f16 and bf16, which are reduced through f32.
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }
}

/// `code` (the position in `ALL`, the stable code of collective headers) and its inverse
/// `from_code`, for an enum with an `ALL` list.
macro_rules! wire_code {
    ($($t:ident),*) => {$(
        impl $t {
            /// Stable code used in collective headers (the position in `ALL`).
            pub fn code(self) -> u32 {
                $t::ALL.iter().position(|v| *v == self).unwrap_or(0) as u32
            }
            /// Inverse of [`Self::code`].
            pub fn from_code(code: u32) -> Option<$t> {
                $t::ALL.get(code as usize).copied()
            }
        }
    )*};
}
wire_code!(DType, ReduceOp);

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise sum divided by the number of ranks (integers: truncated toward zero).
    Average,
    /// Element-wise minimum.
    Min,
    /// Element-wise maximum.
    Max,
}

impl ReduceOp {
    /// Every op, in wire-code order.
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Average, ReduceOp::Min, ReduceOp::Max];
    /// The name nccl-tests prints.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Average => "avg",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
        }
    }
    /// Parses `sum`, `avg`/`average`, `min`, `max`.
    pub fn parse(s: &str) -> Option<ReduceOp> {
        Some(match s.to_ascii_lowercase().as_str() {
            "sum" => ReduceOp::Sum,
            "avg" | "average" | "mean" => ReduceOp::Average,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            _ => return None,
        })
    }
    /// The op applied between partial results: Average combines as Sum and is scaled once at the end.
    pub fn combine(self) -> ReduceOp {
        if self == ReduceOp::Average {
            ReduceOp::Sum
        } else {
            self
        }
    }
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that is a tensor element.
pub trait Element: bytemuck::Pod + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    /// Its dtype.
    const DTYPE: DType;
    /// `v` as this type (`as` for integers, round to nearest for floats).
    fn from_f64(v: f64) -> Self;
}
macro_rules! element {
    ($($t:ty => $d:ident, $conv:expr;)*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn from_f64(v: f64) -> $t {
                $conv(v)
            }
        }
    )*};
}
element! {
    f32 => F32, |v| v as f32;
    f64 => F64, |v| v;
    f16 => F16, f16::from_f64;
    bf16 => BF16, bf16::from_f64;
    i32 => I32, |v| v as i32;
    i64 => I64, |v| v as i64;
    u8 => U8, |v| v as u8;
}

/// Number arithmetic the kernels need (f32, f64, i32, i64).
trait Num: Copy {
    fn add(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn div_n(self, n: usize) -> Self;
}
macro_rules! num_float {
    ($t:ty) => {
        impl Num for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            // `if` forms map to minps/maxps; f32::min's NaN handling would block vectorisation.
            #[inline(always)]
            fn min(self, o: Self) -> Self {
                if o < self {
                    o
                } else {
                    self
                }
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                if o > self {
                    o
                } else {
                    self
                }
            }
            #[inline(always)]
            fn div_n(self, n: usize) -> Self {
                self / n as $t
            }
        }
    };
}
macro_rules! num_int {
    ($t:ty) => {
        impl Num for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn min(self, o: Self) -> Self {
                Ord::min(self, o)
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                Ord::max(self, o)
            }
            #[inline(always)]
            fn div_n(self, n: usize) -> Self {
                self / n as $t
            }
        }
    };
}
num_float!(f32);
num_float!(f64);
num_int!(i32);
num_int!(i64);

#[inline(always)]
fn combine_slice<T: Num>(dst: &mut [T], src: &[T], op: ReduceOp) {
    let n = dst.len().min(src.len());
    let (dst, src) = (&mut dst[..n], &src[..n]);
    match op.combine() {
        ReduceOp::Sum | ReduceOp::Average => {
            for i in 0..n {
                dst[i] = dst[i].add(src[i]);
            }
        }
        ReduceOp::Min => {
            for i in 0..n {
                dst[i] = dst[i].min(src[i]);
            }
        }
        ReduceOp::Max => {
            for i in 0..n {
                dst[i] = dst[i].max(src[i]);
            }
        }
    }
}

/// `dst[i] = src[i] op dst[i]`: [`combine_slice`] with the operands the other way round
/// (so a reduction that holds its own input in `dst` keeps the left-to-right order).
#[inline(always)]
fn combine_rev<T: Num>(dst: &mut [T], src: &[T], op: ReduceOp) {
    let n = dst.len().min(src.len());
    let (dst, src) = (&mut dst[..n], &src[..n]);
    match op.combine() {
        ReduceOp::Sum | ReduceOp::Average => {
            for i in 0..n {
                dst[i] = src[i].add(dst[i]);
            }
        }
        ReduceOp::Min => {
            for i in 0..n {
                dst[i] = src[i].min(dst[i]);
            }
        }
        ReduceOp::Max => {
            for i in 0..n {
                dst[i] = src[i].max(dst[i]);
            }
        }
    }
}

#[inline(always)]
fn scale_slice<T: Num>(buf: &mut [T], n: usize) {
    for x in buf.iter_mut() {
        *x = x.div_n(n);
    }
}

/// Half-precision element: widened to f32 for arithmetic.
trait Half: Copy {
    fn widen(src: &[Self], dst: &mut [f32]);
    fn narrow(src: &[f32], dst: &mut [Self]);
}

impl Half for f16 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU supports the features the function is compiled for (checked above).
            unsafe { f16c::widen(bytemuck::cast_slice(src), dst) };
            return;
        }
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(src, dst)
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU supports the features the function is compiled for (checked above).
            unsafe { f16c::narrow(src, bytemuck::cast_slice_mut(dst)) };
            return;
        }
        half::slice::HalfFloatSliceExt::convert_from_f32_slice(dst, src)
    }
}

/// F16C conversion loops, 8 lanes at a time (the `half` crate converts chunk by chunk
/// through a call per 8 values, about 8x slower here).
#[cfg(target_arch = "x86_64")]
mod f16c {
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support AVX and F16C.
    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn widen(src: &[u16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n bounds both unaligned accesses.
            unsafe {
                let v = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(v));
            }
            i += 8;
        }
        for j in i..n {
            dst[j] = half::f16::from_bits(src[j]).to_f32();
        }
    }

    /// # Safety
    /// The CPU must support AVX and F16C.
    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn narrow(src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n bounds both unaligned accesses.
            unsafe {
                let v = _mm256_loadu_ps(src.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
            }
            i += 8;
        }
        for j in i..n {
            dst[j] = half::f16::from_f32(src[j]).to_bits();
        }
    }
}

impl Half for bf16 {
    // bf16 is the top half of an f32: plain integer loops that LLVM vectorises.
    fn widen(src: &[Self], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let (src, dst) = (&src[..n], &mut dst[..n]);
        for i in 0..n {
            dst[i] = f32::from_bits((src[i].to_bits() as u32) << 16);
        }
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        let n = src.len().min(dst.len());
        let (src, dst) = (&src[..n], &mut dst[..n]);
        for i in 0..n {
            let b = src[i].to_bits();
            // Round to nearest, ties to even; NaNs stay (quiet) NaNs.
            let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
            let nan = ((b >> 16) | 0x40) as u16;
            dst[i] = bf16::from_bits(if (b & 0x7fff_ffff) > 0x7f80_0000 { nan } else { rounded });
        }
    }
}

const HALF_BLOCK: usize = 2048;

/// dst = op(src[0], src[1], ...), all in f32, for a half type. With `own = Some(r)`, dst
/// holds the input at position r and `srcs` the others, in order.
fn reduce_half<H: Half + bytemuck::Pod>(dst: &mut [H], srcs: &[&[H]], own: Option<usize>, op: ReduceOp, scale: Option<usize>) {
    let mut acc = [0f32; HALF_BLOCK];
    let mut tmp = [0f32; HALF_BLOCK];
    let n = dst.len();
    let inputs = srcs.len() + usize::from(own.is_some());
    let mut start = 0;
    while start < n {
        let len = HALF_BLOCK.min(n - start);
        let (acc, tmp) = (&mut acc[..len], &mut tmp[..len]);
        for q in 0..inputs {
            let src: &[H] = match own {
                Some(r) if q == r => &dst[start..start + len],
                Some(r) if q > r => &srcs[q - 1][start..start + len],
                _ => &srcs[q][start..start + len],
            };
            if q == 0 {
                H::widen(src, acc);
            } else {
                H::widen(src, tmp);
                combine_slice(acc, tmp, op);
            }
        }
        if let Some(k) = scale {
            scale_slice(acc, k);
        }
        H::narrow(acc, &mut dst[start..start + len]);
        start += len;
    }
}

/// Elements per block of the prefix sum in [`reduce_num`].
const NUM_BLOCK: usize = 1024;

/// dst = op(src[0], src[1], ...) left to right. With `own = Some(r)`, dst holds the input
/// at position r and `srcs` the others, in order: the inputs before it are combined block
/// by block on the stack, then with dst, then the rest into dst.
fn reduce_num<T: Num + bytemuck::Pod>(dst: &mut [T], srcs: &[&[T]], own: Option<usize>, op: ReduceOp, scale: Option<usize>) {
    let n = dst.len();
    let rest = match own {
        None => {
            dst.copy_from_slice(&srcs[0][..n]);
            &srcs[1..]
        }
        Some(0) => srcs,
        Some(r) => {
            let mut tmp = [T::zeroed(); NUM_BLOCK];
            for start in (0..n).step_by(NUM_BLOCK) {
                let end = (start + NUM_BLOCK).min(n);
                let tmp = &mut tmp[..end - start];
                tmp.copy_from_slice(&srcs[0][start..end]);
                for s in &srcs[1..r] {
                    combine_slice(tmp, &s[start..end], op);
                }
                combine_rev(&mut dst[start..end], tmp, op);
            }
            &srcs[r..]
        }
    };
    for s in rest {
        combine_slice(dst, s, op);
    }
    if let Some(k) = scale {
        scale_slice(dst, k);
    }
}

fn cast<T: bytemuck::Pod>(b: &[u8], dtype: DType) -> Result<&[T], crate::CommError> {
    bytemuck::try_cast_slice(b).map_err(|_| crate::CommError::BadBuffer { len: b.len(), dtype: dtype.name() })
}
fn cast_mut<T: bytemuck::Pod>(b: &mut [u8], dtype: DType) -> Result<&mut [T], crate::CommError> {
    let len = b.len();
    bytemuck::try_cast_slice_mut(b).map_err(|_| crate::CommError::BadBuffer { len, dtype: dtype.name() })
}

/// `dst = op(srcs[0], ..., srcs[k-1])` element-wise, over raw bytes of `dtype`,
/// combining sources in the order given (so every caller that passes the same order gets
/// bit-identical results). With `scale = Some(n)` the result is divided by `n` (Average).
/// Sources must be at least as long as `dst`; `srcs` may not be empty.
pub fn reduce_into(dst: &mut [u8], srcs: &[&[u8]], dtype: DType, op: ReduceOp, scale: Option<usize>) -> Result<(), crate::CommError> {
    reduce_with_own(dst, srcs, None, dtype, op, scale)
}

/// [`reduce_into`] where `dst` itself holds the input at position `own` (`Some(r)`: the
/// inputs are `srcs[..r]`, dst, `srcs[r..]`, combined in that order, so the result is
/// bit-identical to [`reduce_into`] with dst's input copied to position r). Spares the
/// copy of a rank's own input in the shared-memory allreduce.
pub fn reduce_with_own(dst: &mut [u8], srcs: &[&[u8]], own: Option<usize>, dtype: DType, op: ReduceOp, scale: Option<usize>) -> Result<(), crate::CommError> {
    if (srcs.is_empty() && own.is_none()) || own.is_some_and(|r| r > srcs.len()) || srcs.iter().any(|s| s.len() < dst.len()) {
        return Err(crate::CommError::Invalid("reduce_into: missing or short source".into()));
    }
    if dst.is_empty() {
        return Ok(());
    }
    macro_rules! go {
        ($t:ty, $f:ident) => {{
            let d = cast_mut::<$t>(dst, dtype)?;
            let mut ss: Vec<&[$t]> = Vec::with_capacity(srcs.len());
            for s in srcs {
                ss.push(cast::<$t>(s, dtype)?);
            }
            $f(d, &ss, own, op, scale);
        }};
    }
    match dtype {
        DType::F32 => go!(f32, reduce_num),
        DType::F64 => go!(f64, reduce_num),
        DType::I32 => go!(i32, reduce_num),
        DType::I64 => go!(i64, reduce_num),
        DType::F16 => go!(f16, reduce_half),
        DType::BF16 => go!(bf16, reduce_half),
        DType::U8 => return Err(crate::CommError::Invalid("uint8 buffers cannot be reduced".into())),
    }
    Ok(())
}

/// `dst = op(dst, src)` element-wise (one step of a ring reduction).
pub fn accumulate(dst: &mut [u8], src: &[u8], dtype: DType, op: ReduceOp) -> Result<(), crate::CommError> {
    if src.len() < dst.len() {
        return Err(crate::CommError::Invalid("accumulate: short source".into()));
    }
    macro_rules! go {
        ($t:ty) => {
            combine_slice(cast_mut::<$t>(dst, dtype)?, cast::<$t>(src, dtype)?, op)
        };
    }
    match dtype {
        DType::F32 => go!(f32),
        DType::F64 => go!(f64),
        DType::I32 => go!(i32),
        DType::I64 => go!(i64),
        DType::F16 | DType::BF16 => {
            // Two-operand half reduce: widen both, combine in f32.
            return reduce_with_own(dst, &[src], Some(0), dtype, op, None);
        }
        DType::U8 => return Err(crate::CommError::Invalid("uint8 buffers cannot be reduced".into())),
    }
    Ok(())
}

/// Divides every element by `n` (the last step of Average).
pub fn scale(buf: &mut [u8], dtype: DType, n: usize) -> Result<(), crate::CommError> {
    macro_rules! go {
        ($t:ty) => {
            scale_slice(cast_mut::<$t>(buf, dtype)?, n)
        };
    }
    match dtype {
        DType::F32 => go!(f32),
        DType::F64 => go!(f64),
        DType::I32 => go!(i32),
        DType::I64 => go!(i64),
        DType::F16 | DType::BF16 => return reduce_with_own(buf, &[], Some(0), dtype, ReduceOp::Sum, Some(n)),
        DType::U8 => return Err(crate::CommError::Invalid("uint8 buffers cannot be reduced".into())),
    }
    Ok(())
}

/// Widens an f16/bf16 byte buffer into f32 values.
pub fn half_to_f32(src: &[u8], dtype: DType) -> Result<Vec<f32>, crate::CommError> {
    let mut out = vec![0f32; src.len() / 2];
    match dtype {
        DType::F16 => f16::widen(cast::<f16>(src, dtype)?, &mut out),
        DType::BF16 => bf16::widen(cast::<bf16>(src, dtype)?, &mut out),
        _ => return Err(crate::CommError::Invalid(format!("{dtype} is not a half type"))),
    }
    Ok(out)
}

/// Narrows f32 values into an f16/bf16 byte buffer (round to nearest even).
pub fn f32_to_half(src: &[f32], dst: &mut [u8], dtype: DType) -> Result<(), crate::CommError> {
    match dtype {
        DType::F16 => f16::narrow(src, cast_mut::<f16>(dst, dtype)?),
        DType::BF16 => bf16::narrow(src, cast_mut::<bf16>(dst, dtype)?),
        _ => return Err(crate::CommError::Invalid(format!("{dtype} is not a half type"))),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(vals: &[Vec<f64>], op: ReduceOp) -> Vec<f64> {
        let n = vals[0].len();
        (0..n)
            .map(|i| {
                let it = vals.iter().map(|v| v[i]);
                match op {
                    ReduceOp::Sum => it.sum(),
                    ReduceOp::Average => it.sum::<f64>() / vals.len() as f64,
                    ReduceOp::Min => it.fold(f64::INFINITY, f64::min),
                    ReduceOp::Max => it.fold(f64::NEG_INFINITY, f64::max),
                }
            })
            .collect()
    }

    fn to_bytes(dtype: DType, v: &[f64]) -> Vec<u8> {
        match dtype {
            DType::F32 => bytemuck::cast_slice(&v.iter().map(|x| *x as f32).collect::<Vec<_>>()).to_vec(),
            DType::F64 => bytemuck::cast_slice(v).to_vec(),
            DType::F16 => bytemuck::cast_slice(&v.iter().map(|x| f16::from_f64(*x)).collect::<Vec<_>>()).to_vec(),
            DType::BF16 => bytemuck::cast_slice(&v.iter().map(|x| bf16::from_f64(*x)).collect::<Vec<_>>()).to_vec(),
            DType::I32 => bytemuck::cast_slice(&v.iter().map(|x| *x as i32).collect::<Vec<_>>()).to_vec(),
            DType::I64 => bytemuck::cast_slice(&v.iter().map(|x| *x as i64).collect::<Vec<_>>()).to_vec(),
            DType::U8 => unreachable!(),
        }
    }

    #[test]
    fn every_dtype_and_op_matches_naive_reference() {
        // Small integers: every dtype represents them and their sums exactly, so any
        // summation order must give the naive result exactly.
        for dtype in DType::REDUCIBLE {
            for op in ReduceOp::ALL {
                for n in [0usize, 1, 7, 13, 2049, 5000] {
                    let vals: Vec<Vec<f64>> =
                        (0..3).map(|r| (0..n).map(|i| ((i * 7 + r * 13) % 61) as f64 - 30.0).collect()).collect();
                    let bufs: Vec<Vec<u8>> = vals.iter().map(|v| to_bytes(dtype, v)).collect();
                    let srcs: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
                    let mut dst = vec![0u8; n * dtype.size()];
                    let scale = (op == ReduceOp::Average).then_some(3);
                    reduce_into(&mut dst, &srcs, dtype, op, scale).unwrap();
                    let mut want = naive(&vals, op);
                    if op == ReduceOp::Average && matches!(dtype, DType::I32 | DType::I64) {
                        want = naive(&vals, ReduceOp::Sum).iter().map(|s| (*s as i64 / 3) as f64).collect();
                    }
                    assert_eq!(dst, to_bytes(dtype, &want), "{dtype} {op} n={n}");
                }
            }
        }
    }

    #[test]
    fn reducing_into_an_own_input_is_bit_identical_to_reducing_a_copy() {
        // Values that round differently depending on the order (so a changed order shows),
        // ±0 and ties for min/max, 4 inputs of 3000 elements (several prefix blocks).
        let n = 3000;
        let vals: Vec<Vec<f64>> = (0..4).map(|r| (0..n).map(|i| match (i * 7 + r * 5) % 11 { 0 => 0.0, 1 => -0.0, k => (k as f64 - 5.5) * 1e7 + (i as f64) * 0.1 + r as f64 * 1e-3 }).collect()).collect();
        for dtype in DType::REDUCIBLE {
            for op in ReduceOp::ALL {
                let bytes: Vec<Vec<u8>> = vals.iter().map(|v| to_bytes(dtype, v)).collect();
                let all: Vec<&[u8]> = bytes.iter().map(|b| &b[..]).collect();
                let scale = (op == ReduceOp::Average).then_some(4);
                let mut want = vec![0u8; bytes[0].len()];
                reduce_into(&mut want, &all, dtype, op, scale).unwrap();
                for r in 0..4 {
                    let mut dst = bytes[r].clone();
                    let others: Vec<&[u8]> = (0..4).filter(|q| *q != r).map(|q| &bytes[q][..]).collect();
                    reduce_with_own(&mut dst, &others, Some(r), dtype, op, scale).unwrap();
                    assert!(dst == want, "{dtype} {op:?} own at {r}");
                }
            }
        }
    }

    #[test]
    fn accumulate_and_scale_agree_with_reduce_into() {
        let a: Vec<f32> = (0..100).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..100).map(|i| 100.0 - i as f32).collect();
        let mut acc = bytemuck::cast_slice::<f32, u8>(&a).to_vec();
        accumulate(&mut acc, bytemuck::cast_slice(&b), DType::F32, ReduceOp::Average).unwrap();
        scale(&mut acc, DType::F32, 2).unwrap();
        let got: &[f32] = bytemuck::cast_slice(&acc);
        for i in 0..100 {
            assert_eq!(got[i], (a[i] + b[i]) / 2.0);
        }
    }

    #[test]
    fn half_types_accumulate_in_f32() {
        // 2048 + 1 + 1 in f16 step by step rounds to 2048 (spacing is 2 there); accumulated
        // in f32 it is 2050, exactly representable in f16.
        let x = [f16::from_f32(2048.0)];
        let y = [f16::from_f32(1.0)];
        let mut dst = [0u8; 2];
        reduce_into(&mut dst, &[bytemuck::cast_slice(&x), bytemuck::cast_slice(&y), bytemuck::cast_slice(&y)], DType::F16, ReduceOp::Sum, None).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f16>(&dst)[0].to_f32(), 2050.0);
    }

    #[test]
    fn fast_half_conversions_match_the_half_crate_bit_for_bit() {
        // Every f16/bf16 bit pattern widens like `half`; narrowing agrees on a sweep of f32s
        // (ties, subnormals, overflow, infinities, NaN).
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let mut wide = vec![0f32; all.len()];
        f16::widen(bytemuck::cast_slice(&all), &mut wide);
        for (b, w) in all.iter().zip(&wide) {
            let want = f16::from_bits(*b).to_f32();
            assert!(want.to_bits() == w.to_bits() || (want.is_nan() && w.is_nan()), "f16 {b:#x}");
        }
        bf16::widen(bytemuck::cast_slice(&all), &mut wide);
        for (b, w) in all.iter().zip(&wide) {
            let want = bf16::from_bits(*b).to_f32();
            assert!(want.to_bits() == w.to_bits() || (want.is_nan() && w.is_nan()), "bf16 {b:#x}");
        }
        let mut xs: Vec<f32> = (0..200_000u32).map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761))).collect();
        xs.extend([0.0, -0.0, 1.0 + f32::EPSILON, 65504.0, 65520.0, 1e-8, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0]);
        let mut h = vec![f16::ZERO; xs.len()];
        f16::narrow(&xs, &mut h);
        let mut b = vec![bf16::ZERO; xs.len()];
        bf16::narrow(&xs, &mut b);
        for (i, x) in xs.iter().enumerate() {
            let (wh, wb) = (f16::from_f32(*x), bf16::from_f32(*x));
            assert!(wh.to_bits() == h[i].to_bits() || (wh.is_nan() && h[i].is_nan()), "f16 of {x:e}");
            assert!(wb.to_bits() == b[i].to_bits() || (wb.is_nan() && b[i].is_nan()), "bf16 of {x:e}");
        }
    }

    #[test]
    fn misaligned_or_ragged_buffer_is_an_error() {
        let mut dst = vec![0u8; 6];
        let src = vec![0u8; 6];
        assert!(matches!(reduce_into(&mut dst, &[&src], DType::F32, ReduceOp::Sum, None), Err(crate::CommError::BadBuffer { .. })));
        assert!(reduce_into(&mut dst, &[&src], DType::U8, ReduceOp::Sum, None).is_err());
    }

    #[test]
    fn codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()), Some(d));
            assert_eq!(DType::parse(d.name()), Some(d));
        }
        for o in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_code(o.code()), Some(o));
            assert_eq!(ReduceOp::parse(o.name()), Some(o));
        }
    }
}
