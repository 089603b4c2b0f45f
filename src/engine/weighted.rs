//! The weighted allreduce (design 001's per-node weights, design 002's "each worker's
//! gradient is weighted by the sum of its sample weights"): rank r contributes a tensor
//! `g_r` with a weight `w_r >= 0`; every rank gets `sum_r w_r g_r / sum_r w_r`.
//!
//! **One collective.** Each rank sends `[w_r * g_r, w_r]` (its tensor scaled by its
//! weight, then the weight as one more element) through one ordinary `Sum` allreduce, so
//! the numerator and the weight sum travel together (fused, negotiated and checked like
//! any tensor) and every rank divides the same reduced bits by the same sum. With weights
//! equal to each rank's row count and `g_r` each rank's mean gradient, the result is the
//! mean gradient over all rows, whatever the shards' sizes.
//!
//! Host `float32` and `float64` tensors (the weight travels in the tensor's dtype); a
//! device tensor, another dtype, a negative or non-finite weight, or weights that sum to
//! 0 is an error naming the tensor.

use super::{Engine, EngineError, EngineResult, Handle, Tensor};
use crate::dtype::{DType, ReduceOp};

/// A submitted weighted allreduce: [`WeightedHandle::wait`] gives the weighted mean.
pub struct WeightedHandle {
    inner: Result<Handle, EngineError>,
}

impl WeightedHandle {
    /// Blocks until the allreduce finished; returns `sum_r w_r g_r / sum_r w_r`, of the
    /// tensor's shape and dtype.
    pub fn wait(self) -> EngineResult<Tensor> {
        let h = self.inner?;
        let name = h.name().to_string();
        let t = h.wait()?;
        let zero = || EngineError::Invalid { name: name.clone(), reason: "the ranks' weights sum to 0: give at least one rank a positive weight".into() };
        match t.dtype() {
            DType::F32 => {
                let mut v = t.into_vec::<f32>().map_err(|_| zero())?;
                let w = v.pop().filter(|w| *w > 0.0).ok_or_else(zero)?;
                v.iter_mut().for_each(|x| *x /= w);
                Ok(Tensor::from_vec(v))
            }
            _ => {
                let mut v = t.into_vec::<f64>().map_err(|_| zero())?;
                let w = v.pop().filter(|w| *w > 0.0).ok_or_else(zero)?;
                v.iter_mut().for_each(|x| *x /= w);
                Ok(Tensor::from_vec(v))
            }
        }
    }
}

/// `[w * g, w]` of a host f32 or f64 tensor, or why not.
fn scaled(name: &str, t: &Tensor, weight: f64) -> EngineResult<Tensor> {
    let invalid = |reason: String| EngineError::Invalid { name: name.into(), reason };
    if !(weight.is_finite() && weight >= 0.0) {
        return Err(invalid(format!("weight {weight}: a rank's weight must be a finite number >= 0")));
    }
    if let Some(g) = t.as_slice::<f32>() {
        let w = weight as f32;
        return Ok(Tensor::from_vec(g.iter().map(|x| x * w).chain([w]).collect::<Vec<f32>>()));
    }
    if let Some(g) = t.as_slice::<f64>() {
        return Ok(Tensor::from_vec(g.iter().map(|x| x * weight).chain([weight]).collect::<Vec<f64>>()));
    }
    Err(invalid(format!("a weighted allreduce takes a host float32 or float64 tensor, not a {:?} tensor in {:?}", t.dtype(), t.location())))
}

impl Engine {
    /// Submits `tensor` with this rank's `weight`: every rank gets the weighted mean
    /// `sum_r w_r g_r / sum_r w_r` (see [`crate::engine::weighted`]).
    pub fn weighted_allreduce_async(&self, name: &str, tensor: Tensor, weight: f64) -> WeightedHandle {
        WeightedHandle { inner: scaled(name, &tensor, weight).map(|t| self.allreduce_async(name, t, ReduceOp::Sum)) }
    }

    /// Blocking [`Engine::weighted_allreduce_async`].
    pub fn weighted_allreduce(&self, name: &str, tensor: Tensor, weight: f64) -> EngineResult<Tensor> {
        self.weighted_allreduce_async(name, tensor, weight).wait()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_weight_travels_as_one_more_element_and_bad_weights_are_refused() {
        let t = scaled("g", &Tensor::from_vec(vec![1.0f32, -2.0]), 3.0).unwrap();
        assert_eq!(t.as_slice::<f32>().unwrap(), &[3.0, -6.0, 3.0]);
        let t = scaled("g", &Tensor::from_vec(vec![0.5f64]), 2.0).unwrap();
        assert_eq!(t.as_slice::<f64>().unwrap(), &[1.0, 2.0]);
        for w in [-1.0, f64::NAN, f64::INFINITY] {
            assert!(scaled("g", &Tensor::from_vec(vec![1.0f32]), w).unwrap_err().to_string().contains(">= 0"), "{w}");
        }
        assert!(scaled("g", &Tensor::from_vec(vec![1i32]), 1.0).unwrap_err().to_string().contains("float32 or float64"));
    }
}
