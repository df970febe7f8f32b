"""The real backend: device memory on an NVIDIA GPU through CuPy, shared with CUDA IPC.

The same five operations as the simulator (:mod:`mpviz.cuda.simulator`), done by the driver::

    producer                                              consumer
    Block(n):   cupy.cuda.Memory(n)        = cudaMalloc   Mapping(handle):
    export():   runtime.ipcGetMemHandle(ptr)  ──handle──▶   runtime.ipcOpenMemHandle(handle)
    record_event(): Event(interprocess=True).record()       wait_event(): ipcOpenEventHandle,
                    runtime.ipcGetEventHandle  ──handle──▶   streamWaitEvent, eventDestroy
    free():     memset 0xFF, then cudaFree               close(): runtime.ipcCloseMemHandle

* Blocks come from ``cupy.cuda.Memory`` (a plain ``cudaMalloc``), not from CuPy's memory pool:
  an IPC handle names a whole driver allocation, and a pooled pointer is a piece of a bigger one
  (torch sends the base block's handle plus an offset; mpviz gives each storage its own block).
* The producer records an interprocess event after its writes and sends the event's handle with
  the memory's; the consumer's stream waits on it, so it never reads half-written data (torch does
  the same, and falls back to synchronising the stream beyond 1000 events).

Adapted from torch's ``StorageSharing.cpp`` (``_share_cuda_`` / ``_new_shared_cuda``) and CuPy's
documented runtime API (``cupy.cuda.runtime.ipcGetMemHandle``, ``ipcOpenMemHandle``,
``ipcCloseMemHandle``, ``ipcGetEventHandle``, ``ipcOpenEventHandle``). Our own machines and CI
have no GPU; its conformance tests (tests/test_cuda.py) run wherever one is present, and passed on
an NVIDIA H100 with CuPy 14.2, where they were also checked against torch 2.11's own CUDA IPC
(``Tensor.min``, added later, has run on the simulator only).
"""
import os

NAME = "cupy"


def _cupy():
    import cupy  # imported only when this backend is chosen
    return cupy


def is_real():
    return True


def probe():
    """None if CuPy can use a GPU here, else the reason it cannot (for backend choice and skips)."""
    try:
        cupy = _cupy()
    except Exception as e:  # ImportError, or a broken CUDA install raising anything at import
        return f"CuPy is not importable ({type(e).__name__}: {e})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return f"CuPy found no usable CUDA driver/device ({type(e).__name__}: {e})"
    if n < 1:
        return "CuPy reports 0 CUDA devices"
    return None


def device_count():
    return _cupy().cuda.runtime.getDeviceCount()


def device_name(index):
    props = _cupy().cuda.runtime.getDeviceProperties(index)
    name = props.get("name", b"GPU")
    return name.decode() if isinstance(name, bytes) else str(name)


class _Memory:
    backend = NAME

    def _wrap(self, mem):
        cupy = _cupy()
        self._ptr = mem.ptr
        self.bytes = cupy.ndarray((self.nbytes,), cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))

    def view_as(self, dtype, offset, shape, strides):
        cupy = _cupy()
        return cupy.ndarray(shape, dtype, memptr=self.bytes.data + offset, strides=strides)

    def offset_of(self, array):
        data = getattr(array, "data", None)
        ptr = getattr(data, "ptr", None)
        if ptr is None:
            return None
        if self._ptr <= ptr < self._ptr + max(self.nbytes, 1) or (array.size == 0 and ptr == self._ptr):
            return ptr - self._ptr
        return None

    def data_ptr(self):
        return self._ptr

    def upload(self, host_bytes):
        with _cupy().cuda.Device(self.device_index):
            self.bytes.set(host_bytes)

    def is_valid(self):
        return self.bytes is not None


class Block(_Memory):
    """A ``cudaMalloc`` block this process owns."""

    def __init__(self, nbytes, device_index):
        cupy = _cupy()
        self.nbytes = nbytes
        self.device_index = device_index
        with cupy.cuda.Device(device_index):
            self._mem = cupy.cuda.Memory(max(nbytes, 1))
        self._wrap(self._mem)
        self.name = f"cuda{device_index}_{os.getpid()}_{self._ptr:#x}"
        self._events = []  # interprocess events must outlive the consumers' waits on them

    def export(self):
        return bytes(_cupy().cuda.runtime.ipcGetMemHandle(self._ptr))

    def free(self):
        """Fill the block with 0xFF before ``cudaFree``, so a consumer that broke the rules reads
        NaN rather than plausible numbers — as in the simulator."""
        cupy = _cupy()
        with cupy.cuda.Device(self.device_index):
            cupy.cuda.runtime.memset(self._ptr, 0xFF, max(self.nbytes, 1))  # poison, as the simulator
            cupy.cuda.runtime.deviceSynchronize()
        self.bytes = None
        self._mem = None  # cupy.cuda.Memory's destructor calls cudaFree
        self._events = []


class Mapping(_Memory):
    """Another process's block, opened from its IPC handle."""

    def __init__(self, handle, nbytes, device_index, name):
        cupy = _cupy()
        self.nbytes = nbytes
        self.device_index = device_index
        self.name = name
        with cupy.cuda.Device(device_index):
            ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)  # lazy peer access, CuPy's default
        mem = cupy.cuda.UnownedMemory(ptr, max(nbytes, 1), self, device_index)
        self._wrap(mem)

    def close(self):
        cupy = _cupy()
        self.bytes = None
        with cupy.cuda.Device(self.device_index):
            cupy.cuda.runtime.ipcCloseMemHandle(self._ptr)


def allocate(nbytes, device_index):
    return Block(nbytes, device_index)


def open_handle(handle, nbytes, device_index, name=None):
    return Mapping(handle, nbytes, device_index, name or repr(handle[:8]))


def record_event(block):
    """Record an interprocess event after this process's queued writes; return its IPC handle."""
    cupy = _cupy()
    with cupy.cuda.Device(block.device_index):
        event = cupy.cuda.Event(block=False, disable_timing=True, interprocess=True)
        event.record()
        block._events.append(event)
        return bytes(cupy.cuda.runtime.ipcGetEventHandle(event.ptr))


def wait_event(event_handle):
    """Make this process's current stream wait for the producer's writes."""
    if event_handle is None:
        return
    cupy = _cupy()
    event = cupy.cuda.runtime.ipcOpenEventHandle(event_handle)
    try:
        cupy.cuda.runtime.streamWaitEvent(cupy.cuda.get_current_stream().ptr, event)
    finally:
        cupy.cuda.runtime.eventDestroy(event)


def to_numpy(array):
    return _cupy().asnumpy(array)
