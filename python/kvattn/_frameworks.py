"""Outputs in the input's framework, and the framework's current CUDA stream.

Called by the extension (kvattn._kvattn) only when an output is not given, or when a CUDA call
gets stream=None. Frameworks are imported here lazily: importing kvattn imports none of them.
"""

_TORCH_NAMES = {
    "f32": "float32", "f16": "float16", "bf16": "bfloat16", "e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2", "i32": "int32", "u8": "uint8",
}
_NUMPY_NATIVE = {"f32": "float32", "f16": "float16", "i32": "int32", "u8": "uint8"}
_ML_DTYPES = {"bf16": "bfloat16", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def _module_of(obj):
    return type(obj).__module__.split(".", 1)[0]


def numpy_dtype(name):
    """The numpy dtype of a kvattn dtype name; bf16 and fp8 come from ml_dtypes."""
    import numpy as np

    if name in _NUMPY_NATIVE:
        return np.dtype(_NUMPY_NATIVE[name])
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError(
            f"a numpy output of dtype {name} needs the ml_dtypes package (pip install ml_dtypes), "
            "or pass out= yourself (e.g. a uint16 array viewed as ml_dtypes.bfloat16)"
        ) from None
    return np.dtype(getattr(ml_dtypes, _ML_DTYPES[name]))


def empty(like, shape, dtype, name="the input"):
    """A new uninitialised tensor of `shape` and kvattn dtype name `dtype`, in the framework of
    `like` and on its device (`name`: the argument `like` is, for the error). Another DLPack or
    buffer producer of host memory gets a numpy array."""
    mod = _module_of(like)
    if mod == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, _TORCH_NAMES[dtype]), device=like.device)
    if mod == "numpy":
        import numpy as np

        return np.empty(shape, dtype=numpy_dtype(dtype))
    if mod == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=numpy_dtype(dtype))
    if hasattr(like, "__array_namespace__"):
        xp = like.__array_namespace__()
        name = _TORCH_NAMES[dtype]
        if not hasattr(xp, name):
            raise TypeError(f"{xp.__name__} has no dtype {name}; pass the output (out=) yourself")
        return xp.empty(shape, dtype=getattr(xp, name), device=like.device)
    device = _dlpack_device(like)
    if device is None or device[0] in (1, 3):  # kDLCPU, kDLCUDAHost: host memory
        import numpy as np

        return np.empty(shape, dtype=numpy_dtype(dtype))
    raise TypeError(
        f"cannot allocate an output like {name} (a {type(like).__module__}.{type(like).__name__} "
        f"on DLPack device {device[0]}:{device[1]}): pass the outputs (out=, lse=, ...) yourself"
    )


def _dlpack_device(like):
    """(device_type, device_id) of a DLPack producer, None for a buffer-protocol object."""
    fn = getattr(like, "__dlpack_device__", None)
    if fn is None:
        return None
    try:
        return tuple(fn())
    except Exception:  # a producer that cannot say: not host memory we know of
        return (-1, -1)


def current_stream(like):
    """The current CUDA stream (an int cudaStream_t) of the framework that produced `like`."""
    mod = _module_of(like)
    if mod == "torch":
        import torch

        index = like.device.index
        if index is None:
            index = torch.cuda.current_device()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # ~0.3 us against ~5 us
        if raw is not None:
            return raw(index)
        return torch.cuda.current_stream(index).cuda_stream
    if mod == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return 0
