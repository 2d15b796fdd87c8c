"""Tensor <-> numpy encoding used when a Batch is pickled (Ray object store, multiprocessing, ``copy``).

Why numpy: pickle protocol 5 lets numpy hand a contiguous array's memory to the pickler as an out-of-band buffer, and
Ray's serializer places those buffers in the object store without copying them into the pickle stream. A torch tensor
pickled directly goes through torch's own storage reducer instead, so converting to numpy is what makes a Batch cheap
to move. numpy has no bfloat16 / float8, so such tensors travel as a same-width integer view and are viewed back to
their dtype on load (a reinterpretation of the same bytes, no conversion).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

# torch dtypes whose tensors convert to numpy directly (tensor.numpy() shares memory).
_NUMPY_NATIVE = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    }
)
# The integer dtype used to carry the bytes of any other dtype, by element size in bytes.
_CARRIER_BY_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

EncodedTensor = tuple[np.ndarray, torch.dtype]
"""A C-contiguous numpy array holding the tensor's bytes, and the torch dtype to view them as on load."""


def encode_tensor(tensor: Tensor) -> EncodedTensor:
    """A CPU, C-contiguous numpy array sharing memory with ``tensor`` where possible, plus its torch dtype.

    Tensors on an accelerator are copied to CPU (a pickled Batch always arrives on CPU; the receiver calls
    ``.to(device)``). Non-contiguous tensors are made contiguous first: numpy pickles non-contiguous arrays in-band.
    Autograd history is dropped (``detach``).
    """
    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    data = data.contiguous()
    if data.dtype in _NUMPY_NATIVE:
        return data.numpy(), data.dtype
    carrier = _CARRIER_BY_WIDTH.get(data.element_size())
    if carrier is None:
        raise TypeError(f"cannot serialise tensors of dtype {data.dtype} (element size {data.element_size()} bytes)")
    return data.view(carrier).numpy(), data.dtype


def decode_tensor(encoded: EncodedTensor) -> Tensor:
    """The tensor back from :func:`encode_tensor`'s output, on CPU, in process-owned writable memory.

    Ray hands out read-only views of its shared-memory object store; torch cannot safely wrap read-only memory (an
    in-place update would fault or corrupt the stored object), so such arrays are copied once here. Writable arrays
    (plain ``pickle.loads``) are wrapped without a copy.
    """
    array, dtype = encoded
    if not array.flags.writeable:
        array = array.copy()
    tensor = torch.from_numpy(array)
    return tensor if tensor.dtype == dtype else tensor.view(dtype)
