//! Owned, typed tensors: what a program hands the engine and gets back.

use half::{bf16, f16};

use crate::dtype::{DType, Element};

#[derive(Clone, Debug, PartialEq)]
enum Data {
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
            Data::F32($v) => $e,
            Data::F64($v) => $e,
            Data::F16($v) => $e,
            Data::BF16($v) => $e,
            Data::I32($v) => $e,
            Data::I64($v) => $e,
            Data::U8($v) => $e,
        }
    };
}

/// A dense tensor: elements of one [`DType`] in row-major order, and a shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    data: Data,
    shape: Vec<usize>,
}

impl Tensor {
    /// A tensor of `shape` holding `data` (moved, not copied). `None` when the shape's
    /// product is not `data.len()`.
    pub fn new<T: Element>(data: Vec<T>, shape: &[usize]) -> Option<Tensor> {
        if shape.iter().product::<usize>() != data.len() {
            return None;
        }
        let any: Box<dyn std::any::Any> = Box::new(data);
        // Each downcast matches T::DTYPE, the one type implementing Element with that dtype.
        let data = match T::DTYPE {
            DType::F32 => Data::F32(*any.downcast().ok()?),
            DType::F64 => Data::F64(*any.downcast().ok()?),
            DType::F16 => Data::F16(*any.downcast().ok()?),
            DType::BF16 => Data::BF16(*any.downcast().ok()?),
            DType::I32 => Data::I32(*any.downcast().ok()?),
            DType::I64 => Data::I64(*any.downcast().ok()?),
            DType::U8 => Data::U8(*any.downcast().ok()?),
        };
        Some(Tensor { data, shape: shape.to_vec() })
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

    /// A zero tensor.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        let data = match dtype {
            DType::F32 => Data::F32(vec![0.0; n]),
            DType::F64 => Data::F64(vec![0.0; n]),
            DType::F16 => Data::F16(vec![f16::ZERO; n]),
            DType::BF16 => Data::BF16(vec![bf16::ZERO; n]),
            DType::I32 => Data::I32(vec![0; n]),
            DType::I64 => Data::I64(vec![0; n]),
            DType::U8 => Data::U8(vec![0; n]),
        };
        Tensor { data, shape: shape.to_vec() }
    }

    /// Its element type.
    pub fn dtype(&self) -> DType {
        match &self.data {
            Data::F32(_) => DType::F32,
            Data::F64(_) => DType::F64,
            Data::F16(_) => DType::F16,
            Data::BF16(_) => DType::BF16,
            Data::I32(_) => DType::I32,
            Data::I64(_) => DType::I64,
            Data::U8(_) => DType::U8,
        }
    }

    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        each!(&self.data, v => v.len())
    }

    /// True when it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        self.len() * self.dtype().size()
    }

    /// The elements, when they are of type `T`.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        (T::DTYPE == self.dtype()).then(|| bytemuck::cast_slice(self.bytes()))
    }

    /// The elements, mutably, when they are of type `T`.
    pub fn as_mut_slice<T: Element>(&mut self) -> Option<&mut [T]> {
        (T::DTYPE == self.dtype()).then(|| bytemuck::cast_slice_mut(self.bytes_mut()))
    }

    /// The elements as a `Vec<T>` (moved out), or the tensor back when `T` is not its type.
    pub fn into_vec<T: Element>(self) -> Result<Vec<T>, Tensor> {
        if T::DTYPE != self.dtype() {
            return Err(self);
        }
        let boxed: Box<dyn std::any::Any> = each!(self.data, v => Box::new(v));
        Ok(*boxed.downcast::<Vec<T>>().expect("the dtype names the element type"))
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &[u8] {
        each!(&self.data, v => bytemuck::cast_slice(v))
    }

    /// The raw bytes, mutably.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        each!(&mut self.data, v => bytemuck::cast_slice_mut(v))
    }

    /// A tensor of `dtype` and `shape` from raw bytes (copied); `None` when the length
    /// does not match.
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Option<Tensor> {
        let mut t = Tensor::zeros(dtype, shape);
        if t.byte_len() != bytes.len() {
            return None;
        }
        t.bytes_mut().copy_from_slice(bytes);
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
        assert_eq!(Tensor::from_bytes(DType::BF16, &[1], b.bytes()).unwrap(), b);
    }
}
