"""Pictures of dependency trees: arc diagrams of several trees of one sentence, arc-marginal heatmaps.

Trees are head lists (``heads[i]`` the head of word ``i+1``, 0 the root); files are PNG (Agg).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Arc  # noqa: E402


def draw_trees(words: Sequence[str], trees: Mapping[str, Sequence[int]], path: str | Path, title: str = "") -> None:
    """One arc diagram per tree, stacked, the first taken as the reference: arcs of the others
    that are not in it are red. Every arc is drawn above the words, from head to modifier (the
    root is position 0, ``ROOT``)."""
    names = list(trees)
    reference = {(h, m) for m, h in enumerate(trees[names[0]], 1)}
    n = len(words)
    tilt = n > 12 or max(map(len, words), default=0) > 7  # long words would overlap their neighbours
    fig, axes = plt.subplots(len(names), 1, figsize=(max(6.0, 0.65 * (n + 1)), 1.9 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        top = 1.0
        for m, h in enumerate(trees[name], 1):
            if not 0 <= h <= n:
                continue
            width = abs(m - h)
            color = "black" if (h, m) in reference else "crimson"
            ax.add_patch(Arc(((h + m) / 2, 0), width, width, theta1=0, theta2=180, color=color, lw=1.2))
            ax.plot([m], [0.05], marker="v", color=color, markersize=4)
            top = max(top, width / 2)
        for i, w in enumerate(["ROOT", *words]):
            ax.text(i, -0.15, w, ha="right" if tilt else "center", va="top", rotation=40 if tilt else 0,
                    rotation_mode="anchor", fontsize=8)
        ax.set_xlim(-0.7, n + 0.7)
        ax.set_ylim(-1.6 if tilt else -0.6, top + 0.3)
        ax.set_title(name, fontsize=9, loc="left")
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def draw_marginals(words: Sequence[str], marginals: Sequence[Sequence[float]], path: str | Path,
                   gold: Sequence[int] | None = None, title: str = "") -> None:
    """Heatmap of arc marginals ``[n+1, n+1]`` (``[h, m]``: head row, modifier column, 0 the root),
    gold arcs (if given) circled."""
    labels = ["ROOT", *words]
    n = len(words)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * n + 2), max(3.5, 0.35 * n + 1.5)))
    im = ax.imshow([row[1:] for row in marginals], cmap="Blues", vmin=0, vmax=1, aspect="auto")
    if gold is not None:
        ax.scatter(range(n), gold, facecolors="none", edgecolors="crimson", s=40, lw=1, label="gold arc")
        ax.legend(loc="upper right", fontsize=7)
    ax.set_xticks(range(n), labels[1:], rotation=90, fontsize=7)
    ax.set_yticks(range(n + 1), labels, fontsize=7)
    ax.set_xlabel("modifier")
    ax.set_ylabel("head")
    fig.colorbar(im, ax=ax, fraction=0.04)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
