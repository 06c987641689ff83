"""Non-projective dependency trees (spanning arborescences): the one structure that is not a dynamic
program, with the machinery it runs on.

Its face is :class:`NonProjectiveDependencyCRF` and the spanning-tree decoders (``decode``: the
best tree, the k best, exact samples). Behind them: the matrix-tree theorem's log-partition and
marginals (``_tree_partition``: a certified float path, an exact path, the C code
``_matrix_tree_c.c``), their autograd (``_tree_autograd``) and tree counts (``_tree_count``).
Imports run one way: this package imports ``structures.base`` and ``structures.trees``, and nothing
else in ``structures`` imports its private modules.
"""

from .decode import is_tree, kbest_arborescences, max_arborescence, sample_arborescences, tree_score
from .nonprojective import NonProjectiveDependencyCRF

__all__ = ["NonProjectiveDependencyCRF", "is_tree", "kbest_arborescences", "max_arborescence",
           "sample_arborescences", "tree_score"]
