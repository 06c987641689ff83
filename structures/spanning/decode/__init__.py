"""Non-DP algorithms over non-projective dependency trees (spanning arborescences): the best tree
(Chu-Liu-Edmonds / Tarjan), the exact k best (Camerini et al.), exact samples (Wilson's algorithm,
sequential conditioning)."""

from .arborescence import is_tree, kbest_arborescences, max_arborescence, tree_score
from .sampling import sample_arborescences

__all__ = ["is_tree", "kbest_arborescences", "max_arborescence", "sample_arborescences", "tree_score"]
