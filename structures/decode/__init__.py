"""Non-DP decoding algorithms: maximum spanning arborescences (argmax and exact k-best)."""

from .arborescence import is_tree, kbest_arborescences, max_arborescence, tree_score

__all__ = ["is_tree", "kbest_arborescences", "max_arborescence", "tree_score"]
