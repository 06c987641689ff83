"""Layers (``nn.Module``): structured attention, batch first, with padding given by ``lengths``, a
CRF tagging layer with pytorch-crf's interface (``CRF``), and a biaffine parser's scorers (``MLP``,
``Biaffine``; the whole model in ``structures.nn.parser``)."""

from .attention import SegmentationAttention, SigmoidAttention, SoftmaxAttention
from .biaffine import MLP, Biaffine
from .crf import CRF
from .gated import GatedSyntacticContext
from .hops import HopAttention, MemoryHopAttention
from .output import AttentionOutput
from .self_attention import StructuredSelfAttention
from .subtree_attention import SubtreeAttention
from .syntactic import SyntacticAttention
from .tree_lstm import TreeLSTM, TreeStates

__all__ = ["CRF", "AttentionOutput", "SegmentationAttention", "SigmoidAttention", "SoftmaxAttention", "SyntacticAttention"]
__all__ += ["GatedSyntacticContext", "StructuredSelfAttention", "SubtreeAttention", "TreeLSTM", "TreeStates"]
__all__ += ["HopAttention", "MemoryHopAttention", "Biaffine", "MLP"]
