//! [`LentBuf`]: a framework's device memory lent to ringrec — a DLPack tensor's (pointer,
//! length, dtype, device ordinal) wrapped as a buffer of a [`Device`] that the device does
//! not own, so the engine's device executor fuses out of it, reduces it in place and copies
//! results into it as it does with its own buffers (Horovod's contract: the caller does not
//! touch a tensor in flight). The owner (the DLPack capsule's deleter) is released when the
//! buffer is dropped, after the buffer has been given up ([`Device::forget_borrowed`]: the
//! memory is never freed by ringrec).
//!
//! On a GPU the memory is the framework's CUDA memory; on the host-kernels test device it is
//! host memory its queues read and write, as the device's own.

use std::any::Any;
use std::mem::ManuallyDrop;

use super::{Device, DeviceError, DeviceResult, Scalar};
use crate::dtype::Element;
use crate::tensor::{DeviceTensor, Tensor};

/// A buffer over memory a caller lends (see the module docs).
pub struct LentBuf<D: Device, T: Scalar> {
    buf: ManuallyDrop<D::Buf<T>>,
    /// What keeps the memory alive (the DLPack tensor's manager); dropped after `buf` is
    /// given up.
    _owner: Box<dyn Any + Send>,
}

impl<D: Device, T: Scalar> LentBuf<D, T> {
    /// `n` elements of `T` at `address` of `dev`'s memory, on the device numbered `ordinal`
    /// (DLPack's `device_id`), kept alive by `owner`. Refuses a null or misaligned pointer
    /// and another device's memory, saying which.
    ///
    /// # Safety
    /// `address` holds `n` elements of `T` in the memory of the device `ordinal` names until
    /// the buffer is dropped (`owner` keeps them), and nothing else reads or writes them
    /// meanwhile.
    pub unsafe fn new<O: Any + Send>(dev: &D, address: usize, n: usize, ordinal: usize, owner: O) -> DeviceResult<LentBuf<D, T>> {
        let what = "lending a tensor to the engine";
        if address == 0 {
            return Err(DeviceError::refused(what, "its data pointer is null"));
        }
        let align = std::mem::align_of::<T>().max(std::mem::size_of::<T>());
        if address % align != 0 {
            return Err(DeviceError::refused(what, format!("its data at {address:#x} is not aligned to {align} bytes for its elements; make a contiguous copy")));
        }
        if ordinal != dev.ordinal() {
            return Err(DeviceError::refused(what, format!("it is on device {ordinal}, this rank's engine on {} {}; move it there first", dev.kind(), dev.ordinal())));
        }
        // SAFETY: the caller's contract, forwarded; the pointer is non-null and aligned, and
        // the buffer is given up with forget_borrowed (Drop), never freed.
        let buf = unsafe { dev.borrow_unchecked::<T>(address, n) }?;
        Ok(LentBuf { buf: ManuallyDrop::new(buf), _owner: Box::new(owner) })
    }

    /// The device's buffer over the lent memory.
    pub fn buf(&self) -> &D::Buf<T> {
        &self.buf
    }

    /// The device's buffer over the lent memory, mutably.
    pub fn buf_mut(&mut self) -> &mut D::Buf<T> {
        &mut self.buf
    }
}

impl<D: Device, T: Scalar + Element> LentBuf<D, T> {
    /// As an engine tensor of `n` elements (the device executor opens it with
    /// [`device_buffer_mut`]).
    pub fn into_tensor(self, dev: &D, n: usize) -> Tensor {
        Tensor::on_device(DeviceTensor::new(self, T::DTYPE, n, dev.kind()))
    }
}

impl<D: Device, T: Scalar> Drop for LentBuf<D, T> {
    fn drop(&mut self) {
        // SAFETY: `buf` is taken once, here, and not used again; the owner (a field) drops
        // after this body, so the memory outlives the buffer's last use.
        let buf = unsafe { ManuallyDrop::take(&mut self.buf) };
        D::forget_borrowed(buf);
    }
}

/// The `D::Buf<T>` of a device tensor: one of the device's own buffers, or a lent one.
pub fn device_buffer_mut<D: Device, T: Scalar>(t: &mut DeviceTensor) -> Option<&mut D::Buf<T>> {
    if t.holds::<D::Buf<T>>() {
        t.buffer_mut::<D::Buf<T>>()
    } else {
        t.buffer_mut::<LentBuf<D, T>>().map(LentBuf::buf_mut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{HostKernels, Op};
    use std::sync::Arc;

    #[test]
    fn the_host_kernels_device_writes_lent_memory_in_place_and_releases_its_owner() {
        let dev = HostKernels::new().expect("host kernels");
        let mut v = vec![1.0f32, 2.0, 3.0, 4.0];
        let owner = Arc::new(());
        let addr = v.as_mut_ptr() as usize;
        // SAFETY: `v` outlives the buffer and is not touched while it lives.
        let mut lent = unsafe { LentBuf::<HostKernels, f32>::new(&dev, addr, 4, 0, owner.clone()) }.expect("lent");
        let src = dev.buffer_from(&[10.0f32, 20.0]).expect("buffer");
        dev.copy((&src, 0), (lent.buf_mut(), 1), 2).expect("copy");
        let ones = dev.buffer_from(&[1.0f32; 4]).expect("buffer");
        dev.exec(Op::AddInto { x: &ones, out: lent.buf_mut(), n: 4 }).expect("add");
        assert_eq!(Arc::strong_count(&owner), 2);
        let mut t = lent.into_tensor(&dev, 4);
        assert!(device_buffer_mut::<HostKernels, f32>(t.device_mut().expect("device")).is_some());
        assert!(device_buffer_mut::<HostKernels, i32>(t.device_mut().expect("device")).is_none());
        drop(t);
        assert_eq!(Arc::strong_count(&owner), 1);
        assert_eq!(v, vec![2.0, 11.0, 21.0, 5.0]);
    }

    #[test]
    fn a_null_misaligned_or_foreign_pointer_is_refused() {
        let dev = HostKernels::new().expect("host kernels");
        let mut v = vec![0u8; 16];
        let base = v.as_mut_ptr() as usize;
        let aligned = base + (4 - base % 4) % 4;
        // SAFETY: refused before any use.
        let err = |addr, ordinal| unsafe { LentBuf::<HostKernels, f32>::new(&dev, addr, 2, ordinal, ()) }.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err(0, 0).contains("null"), "{}", err(0, 0));
        assert!(err(aligned + 1, 0).contains("not aligned"), "{}", err(aligned + 1, 0));
        assert!(err(aligned, 1).contains("on device 1"), "{}", err(aligned, 1));
    }
}
