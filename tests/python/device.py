"""The device path of the Python module on the CPU (tests/python.rs): with the test hook
RINGREC_PY_DEVICE=host the extension's engine has a device executor on the host-kernels
device (kernels/*.cu compiled for the CPU, asynchronous queues like CUDA streams), which
takes DLPack capsules of device type kDLCUDA whose memory is host memory. ``FakeCuda`` makes
such capsules over numpy arrays (ctypes), and reads device results back the way a consumer
of DLPack does, so every collective here runs the GPU code path — lent device buffers,
the fusion buffer's copies, the cast kernels of fp16 compression, the device allgather —
against numpy's answer. The device side is made at the first device tensor: numpy arrays
before it make none. Empty tensors (a null data pointer, as CUDA's are) are no-ops. With
EXPECT_REFUSED=1 (RINGREC_PY_DEVICE=cpu) a CUDA tensor must be refused with a TypeError
saying what to do; with MIXED=1 (2 ranks) a collective that rank 0 runs on a device tensor
and the others on numpy arrays is a ValueError naming both, and the ranks go on.
"""

import ctypes
import os
import sys

import numpy as np

import ringrec


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
NAME, USED = b"dltensor", b"used_dltensor"

CODES = {np.dtype(np.float32): (2, 32), np.dtype(np.float64): (2, 64), np.dtype(np.float16): (2, 16),
         np.dtype(np.int32): (0, 32), np.dtype(np.int64): (0, 64)}
DTYPES = {v: k for k, v in CODES.items()}

# Every capsule handed out and not yet released by its consumer (the extension's deleter call).
LIVE = {}


@DELETER
def _delete(m):
    LIVE.pop(ctypes.addressof(m.contents), None)


class FakeCuda:
    """A "CUDA" tensor over a numpy array's host memory: DLPack device (kDLCUDA, device_id)."""

    streams = []

    def __init__(self, a, device_id=0, byte_offset=0, null=False):
        self.a, self.device_id, self.byte_offset, self.null = np.ascontiguousarray(a), device_id, byte_offset, null

    def __dlpack_device__(self):
        return (2, self.device_id)

    def __dlpack__(self, stream=None):
        FakeCuda.streams.append(stream)
        shape = (ctypes.c_int64 * max(self.a.ndim, 1))(*self.a.shape)
        code, bits = CODES[self.a.dtype]
        t = DLTensor(None if self.null else self.a.ctypes.data, DLDevice(2, self.device_id), self.a.ndim, DLDataType(code, bits, 1), shape, None, self.byte_offset)
        m = DLManagedTensor(t, None, _delete)
        LIVE[ctypes.addressof(m)] = (m, shape, self.a)
        return _api.PyCapsule_New(ctypes.addressof(m), NAME, None)

    def clone(self):
        return FakeCuda(self.a.copy(), self.device_id, null=self.null)

    @staticmethod
    def from_dlpack(obj):
        """A device result read back by a DLPack consumer: its capsule taken over, the
        elements copied out, the producer's deleter called."""
        assert obj.__dlpack_device__() == (2, 0), obj.__dlpack_device__()
        cap = obj.__dlpack__(stream=None)
        m = ctypes.cast(_api.PyCapsule_GetPointer(cap, NAME), ctypes.POINTER(DLManagedTensor))
        assert _api.PyCapsule_SetName(cap, USED) == 0
        t = m.contents.dl_tensor
        assert t.device.device_type == 2 and t.device.device_id == 0, (t.device.device_type, t.device.device_id)
        shape = tuple(t.shape[i] for i in range(t.ndim))
        dtype = DTYPES[(t.dtype.code, t.dtype.bits)]
        n = int(np.prod(shape)) if shape else 1
        if n == 0:
            out = np.zeros(shape, dtype)
        else:
            buf = (ctypes.c_char * (n * dtype.itemsize)).from_address(t.data + t.byte_offset)
            out = np.frombuffer(bytes(buf), dtype=dtype).reshape(shape).copy()
        m.contents.deleter(m)
        return out


def check(got, want, what):
    if not np.array_equal(got, want):
        raise AssertionError("%s: got %s, want %s" % (what, got, want))


def refused():
    ringrec.init()
    try:
        ringrec.allreduce(FakeCuda(np.ones(4, np.float32)), name="x")
    except TypeError as e:
        assert "cuda:0" in str(e) and "t.cpu()" in str(e), e
    else:
        raise AssertionError("a CUDA tensor without a device executor must be refused")
    print("device refused ok rank %d" % ringrec.rank(), flush=True)


def expect(kind, words, f):
    try:
        f()
    except kind as e:
        assert all(w in str(e) for w in words), "%s does not say %s" % (e, words)
    else:
        raise AssertionError("must raise %s saying %s" % (kind.__name__, words))


def mixed():
    """Rank 0 gives a device tensor, the others a numpy array, under one name: an error
    naming both on every rank (the engine negotiates where each rank's tensor lives), no hang;
    then every rank gives a device tensor and the device side is made on all."""
    ringrec.init()
    r, n = ringrec.rank(), ringrec.size()
    x = FakeCuda(np.ones(4, np.float32)) if r == 0 else np.ones(4, np.float32)
    expect(ValueError, ["'mixed'", "rank 0: allreduce float [4] on a device sum", "rank 1: allreduce float [4] sum", "others one in host memory"], lambda: ringrec.allreduce(x, name="mixed", op=ringrec.Sum))
    check(ringrec.allreduce(np.ones(2, np.float32), name="after", op=ringrec.Sum), np.full(2, n, np.float32), "a host allreduce after")
    check(ringrec.allreduce(FakeCuda(np.ones(3, np.float32)), name="both", op=ringrec.Sum).a, np.full(3, n, np.float32), "a device allreduce after")
    print("device mixed ok rank %d" % r, flush=True)


def empties(r, n):
    """Empty device tensors: no-ops with their shapes; an allgather where some ranks give no
    rows returns the others'; a null pointer with elements is still refused."""
    e = ringrec.allreduce(FakeCuda(np.zeros((0, 3), np.float32), null=True), name="empty.ar", op=ringrec.Sum)
    check(FakeCuda.from_dlpack(e) if not isinstance(e, FakeCuda) else e.a, np.zeros((0, 3), np.float32), "empty allreduce")
    z = FakeCuda(np.zeros(0, np.float64), null=True)
    assert ringrec.allreduce_(z, name="empty.ar_", op=ringrec.Max) is z and z.a.shape == (0,)
    outs = ringrec.grouped_allreduce([FakeCuda(np.zeros(0, np.float32), null=True), FakeCuda(np.full(3, r, np.float32))], name="empty.group", op=ringrec.Sum)
    check(outs[0].a, np.zeros(0, np.float32), "grouped empty")
    check(outs[1].a, np.full(3, n * (n - 1) / 2, np.float32), "grouped beside an empty tensor")
    check(ringrec.allreduce(FakeCuda(np.zeros(0, np.float32), null=True), name="empty.fp16", op=ringrec.Sum, compression=ringrec.Compression.fp16).a, np.zeros(0, np.float32), "empty fp16")
    b = FakeCuda(np.zeros((0, 2), np.int32), null=True)
    assert ringrec.broadcast_(b, n - 1, name="empty.bc") is b
    g = ringrec.allgather(FakeCuda(np.full((r % 2, 2), r, np.int64), null=r % 2 == 0), name="empty.gather")
    check(FakeCuda.from_dlpack(g), np.concatenate([np.full((q % 2, 2), q, np.int64) for q in range(n)]), "allgather with ranks of no rows")
    g = ringrec.allgather(FakeCuda(np.zeros((0, 5), np.float32), null=True), name="empty.gather.all")
    check(FakeCuda.from_dlpack(g), np.zeros((0, 5), np.float32), "allgather of no rows anywhere")
    expect(ValueError, ["null"], lambda: ringrec.allreduce_(FakeCuda(np.ones(4, np.float32), null=True), name="null"))


def main():
    ringrec.init()
    r, n = ringrec.rank(), ringrec.size()
    # Lazy: numpy arrays make no device side; the first device tensor makes it.
    check(ringrec.allreduce(np.ones(3, np.float32), name="host.first", op=ringrec.Sum), np.full(3, n, np.float32), "a host allreduce first")
    assert ringrec._ringrec.device() is None, "a device side before any device tensor: %s" % ringrec._ringrec.device()
    base = np.arange(12, dtype=np.float32)
    ranks = [base + k for k in range(n)]

    for op, want in [(ringrec.Sum, sum(ranks)), (ringrec.Average, sum(ranks) / n), (ringrec.Min, ranks[0]), (ringrec.Max, ranks[-1])]:
        x = FakeCuda(base + r)
        out = ringrec.allreduce(x, name="op.%d" % op, op=op)
        assert isinstance(out, FakeCuda) and out is not x
        check(out.a, want.astype(np.float32), "allreduce op %d" % op)
        check(x.a, base + r, "allreduce leaves its input")
        dev = ringrec._ringrec.device()
        assert dev is not None and "host-kernels" in dev, dev

    # In place, a 2-D tensor, and the asynchronous forms.
    x = FakeCuda((base + r).reshape(3, 4))
    assert ringrec.allreduce_(x, name="inplace", op=ringrec.Sum) is x
    check(x.a, sum(ranks).reshape(3, 4), "allreduce_")
    hs = [ringrec.allreduce_async(FakeCuda(base * (k + 1) + r), name="async.%d" % k, op=ringrec.Sum) for k in range(3)]
    for k, h in enumerate(hs):
        check(h.wait().a, sum(base * (k + 1) + q for q in range(n)), "allreduce_async %d" % k)
    y = FakeCuda(base + r)
    ringrec.allreduce_async_(y, name="async_", op=ringrec.Max).wait()
    check(y.a, ranks[-1], "allreduce_async_")

    # Fused: a group reduced through the device's fusion buffer.
    outs = ringrec.grouped_allreduce([FakeCuda(base[: 3 + k] + r) for k in range(4)], name="group", op=ringrec.Sum)
    for k, o in enumerate(outs):
        check(o.a, sum(base[: 3 + k] + q for q in range(n)), "grouped %d" % k)

    # Other dtypes, and fp16 compression (the device's cast kernels).
    for dt in (np.float64, np.int32, np.int64, np.float16):
        check(ringrec.allreduce(FakeCuda((base + r).astype(dt)), name="dtype.%s" % np.dtype(dt).name, op=ringrec.Sum).a,
              sum(ranks).astype(dt), "allreduce %s" % np.dtype(dt).name)
    half = ringrec.allreduce(FakeCuda(base + r), name="fp16", op=ringrec.Sum, compression=ringrec.Compression.fp16)
    check(half.a, sum(ranks), "allreduce fp16 compression")

    # Broadcast, in place and as a copy.
    root = n - 1
    b = FakeCuda((base + 100 * r).astype(np.float32))
    assert ringrec.broadcast_(b, root, name="bcast_") is b
    check(b.a, base + 100 * root, "broadcast_")
    c = FakeCuda(np.full(5, r, np.int64))
    check(ringrec.broadcast(c, 0, name="bcast").a, np.zeros(5, np.int64), "broadcast")
    check(c.a, np.full(5, r, np.int64), "broadcast leaves its input")

    # Allgather: rank q gives q + 1 rows; the result comes back through DLPack.
    g = ringrec.allgather(FakeCuda(np.full((r + 1, 3), r, np.float32)), name="gather")
    rows = np.concatenate([np.full((q + 1, 3), q, np.float32) for q in range(n)])
    check(FakeCuda.from_dlpack(g), rows, "allgather")

    empties(r, n)

    # Wrong device, misaligned data: errors that say so.
    for bad, words in [(FakeCuda(base, device_id=1), "device 1"), (FakeCuda(base, byte_offset=1), "not aligned")]:
        try:
            ringrec.allreduce_(bad, name="bad")
        except ValueError as e:
            assert words in str(e), e
        else:
            raise AssertionError("%s must be refused" % words)

    assert all(s is None for s in FakeCuda.streams), "the host-kernels device has no stream to hand: %s" % FakeCuda.streams
    import gc
    gc.collect()
    assert not LIVE, "capsules the engine never released: %d" % len(LIVE)
    print("device ok rank %d" % r, flush=True)


if __name__ == "__main__":
    if os.environ.get("EXPECT_REFUSED") == "1":
        refused()
    elif os.environ.get("MIXED") == "1":
        mixed()
    else:
        main()
    sys.stdout.flush()
