"""Structured attention layers (``nn.Module``), batch first, with padding given by ``lengths``."""

from .attention import SegmentationAttention, SigmoidAttention, SoftmaxAttention
from .gated import GatedSyntacticContext
from .hops import HopAttention, MemoryHopAttention
from .output import AttentionOutput
from .self_attention import StructuredSelfAttention
from .subtree_attention import SubtreeAttention
from .syntactic import SyntacticAttention
from .tree_lstm import TreeLSTM, TreeStates

__all__ = ["AttentionOutput", "SegmentationAttention", "SigmoidAttention", "SoftmaxAttention", "SyntacticAttention"]
__all__ += ["GatedSyntacticContext", "StructuredSelfAttention", "SubtreeAttention", "TreeLSTM", "TreeStates"]
__all__ += ["HopAttention", "MemoryHopAttention"]
