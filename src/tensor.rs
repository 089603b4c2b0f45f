//! Owned, typed tensors: what a program hands the engine and gets back. A tensor lives in
//! host memory (a typed `Vec`, or memory a caller lends, [`Tensor::borrowed`]: the Python
//! module's numpy arrays and torch tensors, reduced where they are) or in a device's memory
//! ([`DeviceTensor`]: a buffer of a [`crate::device::Device`], which the engine hands to that
//! device's executor).

use std::any::Any;

use half::{bf16, f16};

use crate::dtype::{DType, Element};

/// Where a tensor's elements are: the engine runs a collective with the operations of
/// that memory (host collectives, or the device executor: NCCL on a GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// Host memory.
    Host,
    /// A device's memory.
    Device,
}

/// A tensor in a device's memory: the device's buffer, type-erased so the engine can carry
/// it, with its dtype and length. Only the executor of the device that made it opens it.
pub struct DeviceTensor {
    dtype: DType,
    len: usize,
    device: &'static str,
    buf: Box<dyn Any + Send>,
}

impl std::fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceTensor({} x {} on {})", self.len, self.dtype, self.device)
    }
}

impl DeviceTensor {
    /// Wraps `buf`, a buffer of `len` elements of `dtype` on the device type named `device`.
    pub fn new<B: Any + Send>(buf: B, dtype: DType, len: usize, device: &'static str) -> DeviceTensor {
        DeviceTensor { dtype, len, device, buf: Box::new(buf) }
    }
    /// True when the buffer is a `B`.
    pub fn holds<B: Any>(&self) -> bool {
        self.buf.is::<B>()
    }
    /// The buffer, when it is a `B`.
    pub fn buffer_mut<B: Any>(&mut self) -> Option<&mut B> {
        self.buf.downcast_mut()
    }
    /// The buffer moved out, or the tensor back when it is not a `B`.
    pub fn into_buffer<B: Any>(self) -> Result<B, DeviceTensor> {
        match self.buf.downcast::<B>() {
            Ok(b) => Ok(*b),
            Err(buf) => Err(DeviceTensor { buf, ..self }),
        }
    }
    /// The device type that made it.
    pub fn device(&self) -> &'static str {
        self.device
    }
}

/// Elements in host memory.
#[derive(Clone, Debug, PartialEq)]
enum Host {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
}

macro_rules! each {
    ($data:expr, $v:ident => $e:expr) => {
        match $data {
            Host::F32($v) => $e,
            Host::F64($v) => $e,
            Host::F16($v) => $e,
            Host::BF16($v) => $e,
            Host::I32($v) => $e,
            Host::I64($v) => $e,
            Host::U8($v) => $e,
        }
    };
}

impl Host {
    fn dtype(&self) -> DType {
        match self {
            Host::F32(_) => DType::F32,
            Host::F64(_) => DType::F64,
            Host::F16(_) => DType::F16,
            Host::BF16(_) => DType::BF16,
            Host::I32(_) => DType::I32,
            Host::I64(_) => DType::I64,
            Host::U8(_) => DType::U8,
        }
    }
}

/// Host memory a caller lends for the tensor's lifetime, and what keeps it alive.
struct Lent {
    address: *mut u8,
    bytes: usize,
    dtype: DType,
    _owner: Box<dyn Any + Send>,
}

// SAFETY: the memory is lent to the tensor alone for its lifetime (`Tensor::borrowed`'s
// contract) and the tensor is used by one thread at a time, as an owned `Vec` would be.
unsafe impl Send for Lent {}

impl Lent {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `Tensor::borrowed`'s contract: `bytes` valid bytes at `address` for the
        // tensor's lifetime (a dangling, aligned pointer when empty).
        unsafe { std::slice::from_raw_parts(self.address, self.bytes) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and no one else reads or writes them meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.address, self.bytes) }
    }
}

impl std::fmt::Debug for Lent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lent({} bytes of {})", self.bytes, self.dtype)
    }
}

#[derive(Debug)]
enum Data {
    Host(Host),
    Lent(Lent),
    Device(DeviceTensor),
}

/// A dense tensor: elements of one [`DType`] in row-major order, and a shape; in host
/// memory or on a device ([`Tensor::location`]).
#[derive(Debug)]
pub struct Tensor {
    data: Data,
    shape: Vec<usize>,
}

impl PartialEq for Tensor {
    /// Host tensors compare by dtype, shape and elements; a device tensor equals nothing.
    fn eq(&self, o: &Tensor) -> bool {
        match (&self.data, &o.data) {
            (Data::Host(a), Data::Host(b)) => a == b && self.shape == o.shape,
            (Data::Device(_), _) | (_, Data::Device(_)) => false,
            _ => self.dtype() == o.dtype() && self.shape == o.shape && self.host_bytes() == o.host_bytes(),
        }
    }
}

impl Tensor {
    /// A tensor of `shape` holding `data` (moved, not copied). `None` when the shape's
    /// product is not `data.len()`.
    pub fn new<T: Element>(data: Vec<T>, shape: &[usize]) -> Option<Tensor> {
        if shape.iter().product::<usize>() != data.len() {
            return None;
        }
        let any: Box<dyn Any> = Box::new(data);
        // Each downcast matches T::DTYPE, the one type implementing Element with that dtype.
        let host = match T::DTYPE {
            DType::F32 => Host::F32(*any.downcast().ok()?),
            DType::F64 => Host::F64(*any.downcast().ok()?),
            DType::F16 => Host::F16(*any.downcast().ok()?),
            DType::BF16 => Host::BF16(*any.downcast().ok()?),
            DType::I32 => Host::I32(*any.downcast().ok()?),
            DType::I64 => Host::I64(*any.downcast().ok()?),
            DType::U8 => Host::U8(*any.downcast().ok()?),
        };
        Some(Tensor { data: Data::Host(host), shape: shape.to_vec() })
    }

    /// A 1-D tensor holding `data`.
    pub fn from_vec<T: Element>(data: Vec<T>) -> Tensor {
        let n = data.len();
        Tensor::new(data, &[n]).expect("a 1-D shape always matches")
    }

    /// A 1-D tensor holding a copy of `data`.
    pub fn from_slice<T: Element>(data: &[T]) -> Tensor {
        Tensor::from_vec(data.to_vec())
    }

    /// A host tensor of `dtype` and `shape` over `bytes` bytes at `address` that the caller
    /// lends, reduced (or broadcast) where they are; `owner` is dropped with the tensor (it
    /// keeps the memory alive: the Python module's array). `None` when the length does not
    /// match the shape or the address is not aligned for `dtype`.
    ///
    /// # Safety
    /// The bytes must stay valid, and no one else may read or write them, until the tensor
    /// is dropped (the engine hands the same tensor back when an operation completes).
    pub unsafe fn borrowed<O: Any + Send>(address: *mut u8, bytes: usize, dtype: DType, shape: &[usize], owner: O) -> Option<Tensor> {
        if shape.iter().product::<usize>() * dtype.size() != bytes || address.is_null() || address as usize % dtype.size() != 0 {
            return None;
        }
        Some(Tensor { data: Data::Lent(Lent { address, bytes, dtype, _owner: Box::new(owner) }), shape: shape.to_vec() })
    }

    /// True when its memory is lent by the caller ([`Tensor::borrowed`]).
    pub fn is_borrowed(&self) -> bool {
        matches!(self.data, Data::Lent(_))
    }

    /// A 1-D tensor in a device's memory.
    pub fn on_device(t: DeviceTensor) -> Tensor {
        let n = t.len;
        Tensor { data: Data::Device(t), shape: vec![n] }
    }

    /// The same elements under `shape` (same number of elements), or the tensor back.
    pub fn with_shape(self, shape: &[usize]) -> Result<Tensor, Tensor> {
        if shape.iter().product::<usize>() != self.len() {
            return Err(self);
        }
        Ok(Tensor { data: self.data, shape: shape.to_vec() })
    }

    /// A zero tensor in host memory.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        let host = match dtype {
            DType::F32 => Host::F32(vec![0.0; n]),
            DType::F64 => Host::F64(vec![0.0; n]),
            DType::F16 => Host::F16(vec![f16::ZERO; n]),
            DType::BF16 => Host::BF16(vec![bf16::ZERO; n]),
            DType::I32 => Host::I32(vec![0; n]),
            DType::I64 => Host::I64(vec![0; n]),
            DType::U8 => Host::U8(vec![0; n]),
        };
        Tensor { data: Data::Host(host), shape: shape.to_vec() }
    }

    /// Its element type.
    pub fn dtype(&self) -> DType {
        match &self.data {
            Data::Host(h) => h.dtype(),
            Data::Lent(l) => l.dtype,
            Data::Device(d) => d.dtype,
        }
    }

    /// Where its elements are.
    pub fn location(&self) -> Location {
        match self.data {
            Data::Host(_) | Data::Lent(_) => Location::Host,
            Data::Device(_) => Location::Device,
        }
    }

    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            Data::Host(h) => each!(h, v => v.len()),
            Data::Lent(l) => l.bytes / l.dtype.size(),
            Data::Device(d) => d.len,
        }
    }

    /// True when it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        self.len() * self.dtype().size()
    }

    /// The elements, when they are host memory of type `T`.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        (T::DTYPE == self.dtype()).then(|| self.host_bytes().map(bytemuck::cast_slice)).flatten()
    }

    /// The elements, mutably, when they are host memory of type `T`.
    pub fn as_mut_slice<T: Element>(&mut self) -> Option<&mut [T]> {
        (T::DTYPE == self.dtype()).then(|| self.host_bytes_mut().map(bytemuck::cast_slice_mut)).flatten()
    }

    /// The elements as a `Vec<T>` (moved out), or the tensor back when it is not host
    /// memory of type `T` that it owns.
    pub fn into_vec<T: Element>(self) -> Result<Vec<T>, Tensor> {
        match self.data {
            Data::Host(h) if T::DTYPE == h.dtype() => {
                let boxed: Box<dyn Any> = each!(h, v => Box::new(v));
                Ok(*boxed.downcast::<Vec<T>>().expect("the dtype names the element type"))
            }
            data => Err(Tensor { data, shape: self.shape }),
        }
    }

    /// The device tensor moved out, or the tensor back when it is in host memory.
    pub fn into_device(self) -> Result<DeviceTensor, Tensor> {
        match self.data {
            Data::Device(d) => Ok(d),
            data => Err(Tensor { data, shape: self.shape }),
        }
    }

    /// The device tensor, when it is one.
    pub fn device_mut(&mut self) -> Option<&mut DeviceTensor> {
        match &mut self.data {
            Data::Device(d) => Some(d),
            Data::Host(_) | Data::Lent(_) => None,
        }
    }

    /// The raw bytes of a host tensor (`None` on a device).
    pub fn host_bytes(&self) -> Option<&[u8]> {
        match &self.data {
            Data::Host(h) => Some(each!(h, v => bytemuck::cast_slice(v))),
            Data::Lent(l) => Some(l.bytes()),
            Data::Device(_) => None,
        }
    }

    /// The raw bytes of a host tensor, mutably (`None` on a device).
    pub fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.data {
            Data::Host(h) => Some(each!(h, v => bytemuck::cast_slice_mut(v))),
            Data::Lent(l) => Some(l.bytes_mut()),
            Data::Device(_) => None,
        }
    }

    /// A host tensor of `dtype` and `shape` from raw bytes (copied); `None` when the
    /// length does not match.
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Option<Tensor> {
        let mut t = Tensor::zeros(dtype, shape);
        let dst = t.host_bytes_mut()?;
        if dst.len() != bytes.len() {
            return None;
        }
        dst.copy_from_slice(bytes);
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_typed_data_in_and_out() {
        let t = Tensor::new(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
        assert_eq!(t.dtype(), DType::F32);
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.byte_len(), 24);
        assert_eq!(t.as_slice::<f32>().unwrap()[4], 5.0);
        assert!(t.as_slice::<f64>().is_none());
        let t = t.into_vec::<i32>().unwrap_err();
        assert_eq!(t.into_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert!(Tensor::new(vec![1i64, 2], &[3]).is_none());
        let b = Tensor::from_vec(vec![bf16::from_f32(1.5)]);
        assert_eq!(Tensor::from_bytes(DType::BF16, &[1], b.host_bytes().unwrap()).unwrap(), b);
    }

    #[test]
    fn lent_memory_is_read_and_written_in_place() {
        let mut v = vec![1i32, 2, 3, 4, 5, 6];
        let owner = std::sync::Arc::new(());
        // SAFETY: `v` outlives `t` and is not touched while `t` lives.
        let mut t = unsafe { Tensor::borrowed(v.as_mut_ptr().cast(), 24, DType::I32, &[3, 2], owner.clone()) }.unwrap();
        assert!(t.is_borrowed() && t.location() == Location::Host);
        assert_eq!((t.len(), t.shape(), t.dtype()), (6, &[3usize, 2][..], DType::I32));
        t.as_mut_slice::<i32>().unwrap()[5] = 60;
        assert_eq!(t, Tensor::new(vec![1i32, 2, 3, 4, 5, 60], &[3, 2]).unwrap());
        assert_eq!(std::sync::Arc::strong_count(&owner), 2);
        let t = t.into_vec::<i32>().unwrap_err();
        drop(t);
        assert_eq!((std::sync::Arc::strong_count(&owner), v[5]), (1, 60));
        // SAFETY: never dereferenced: the length does not match.
        assert!(unsafe { Tensor::borrowed(v.as_mut_ptr().cast(), 20, DType::I32, &[3, 2], ()) }.is_none());
    }
}
