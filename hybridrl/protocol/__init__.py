"""The batch container passed between the single controller and the worker groups.

``Batch`` holds named tensors sharing a batch dimension (dim 0), per-sample non-tensor values (numpy object arrays)
and un-split ``meta``; ``Fields`` names the canonical fields. See :mod:`hybridrl.protocol.batch`.
"""

from hybridrl.protocol.batch import Batch
from hybridrl.protocol.fields import Fields

__all__ = ["Batch", "Fields"]
