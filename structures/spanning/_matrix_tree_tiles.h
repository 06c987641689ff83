/* The matrix-tree's panels in registers at one vector width, included by _matrix_tree_c.c once per
 * width (x86 only): W lanes of the vector type V, SPLAT(x) V's initializer of W copies of x, TRANSPOSE
 * the W x W transpose of W vectors in place, NAME(f) the function f's name at this width. A panel is
 * KB columns; a transposed block of right-hand sides is 2 W wide. Every function gives each entry
 * the same operations in the same order as the scalar-transposing code it replaces (the same bits).
 * The parameters are undefined at the end, ready for the next width. */

INLINE V NAME(ld)(const double *p) { V v; memcpy(&v, p, sizeof v); return v; }
INLINE void NAME(st)(double *p, V v) { memcpy(p, &v, sizeof v); }

/* panel_rows for a panel of KB columns, W rows at a time: their columns transposed in registers
 * instead of through P (whose scalar stores, read back as vectors, stall). The last rows (fewer than
 * W) by panel_rows. */
INLINE void NAME(panel_rows)(double *X, idx n, idx j0, idx j1, idx k0, const double *L, const double *scale,
                             double sign, double *g, const double *gk, double *P) {
    idx j = j0;
    for (; j + W <= j1; j += W) {
        V v[KB], gv = {0}; /* v[t]: column k0 + t of the W rows */
        for (int q = 0; q < KB; q += W) {
            for (int r = 0; r < W; r++) v[q + r] = NAME(ld)(X + (j + r) * n + k0 + q);
            TRANSPOSE(v + q);
        }
        if (g) gv = NAME(ld)(g + j);
        for (int t = 0; t < KB; t++) {
            if (scale) {
                const double sc = scale[k0 + t];
                v[t] *= (V)SPLAT(sc);
            }
            if (g) {
                const double gt = gk[k0 + t];
                gv += (V)SPLAT(gt) * v[t];
            }
            for (int t2 = t + 1; t2 < KB; t2++) {
                const double c = sign * L[(k0 + t) * n + k0 + t2];
                v[t2] += (V)SPLAT(c) * v[t];
            }
        }
        if (g) NAME(st)(g + j, gv);
        for (int q = 0; q < KB; q += W) {
            TRANSPOSE(v + q);
            for (int r = 0; r < W; r++) NAME(st)(X + (j + r) * n + k0 + q, v[q + r]);
        }
    }
    if (j < j1) panel_rows(X, n, j, j1, k0, k0 + KB, L, scale, sign, g, gk, P);
}

/* rows i0..i1-1 of the transposed block Yt [n, 2 W] minus Σ_k Yt[k] LU[k, i] over the panel
 * b0..b1-1, each entry's terms in the panel's order (rank_update's roundings: the same products and
 * FMAs), four rows at once */
INLINE void NAME(block_update)(double *Yt, const double *LU, idx n, idx b0, idx b1, idx i0, idx i1) {
    const idx S = 2 * W;
    idx i = i0;
    for (; i + 4 <= i1; i += 4) {
        double *y0 = Yt + i * S, *y1 = y0 + S, *y2 = y1 + S, *y3 = y2 + S;
        V a0 = NAME(ld)(y0), a1 = NAME(ld)(y1), a2 = NAME(ld)(y2), a3 = NAME(ld)(y3);
        V h0 = NAME(ld)(y0 + W), h1 = NAME(ld)(y1 + W), h2 = NAME(ld)(y2 + W), h3 = NAME(ld)(y3 + W);
        for (idx k = b0; k < b1; k++) {
            const V f = NAME(ld)(Yt + k * S), g = NAME(ld)(Yt + k * S + W);
            const double *l = LU + k * n + i;
            const double t0 = l[0], t1 = l[1], t2 = l[2], t3 = l[3];
            const V c0 = SPLAT(t0), c1 = SPLAT(t1), c2 = SPLAT(t2), c3 = SPLAT(t3);
            a0 -= f * c0, h0 -= g * c0, a1 -= f * c1, h1 -= g * c1;
            a2 -= f * c2, h2 -= g * c2, a3 -= f * c3, h3 -= g * c3;
        }
        NAME(st)(y0, a0), NAME(st)(y1, a1), NAME(st)(y2, a2), NAME(st)(y3, a3);
        NAME(st)(y0 + W, h0), NAME(st)(y1 + W, h1), NAME(st)(y2 + W, h2), NAME(st)(y3 + W, h3);
    }
    for (; i < i1; i++) {
        V a = NAME(ld)(Yt + i * S), h = NAME(ld)(Yt + i * S + W);
        for (idx k = b0; k < b1; k++) {
            const double t = LU[k * n + i];
            const V c = SPLAT(t);
            a -= NAME(ld)(Yt + k * S) * c, h -= NAME(ld)(Yt + k * S + W) * c;
        }
        NAME(st)(Yt + i * S, a), NAME(st)(Yt + i * S + W, h);
    }
}

/* Yt[t2] += c Yt[t], Yt[t] given as its two vectors */
INLINE void NAME(axpy)(double *Yt, idx t2, double c, V yl, V yh) {
    const V cc = SPLAT(c);
    NAME(st)(Yt + t2 * 2 * W, NAME(ld)(Yt + t2 * 2 * W) + cc * yl);
    NAME(st)(Yt + t2 * 2 * W + W, NAME(ld)(Yt + t2 * 2 * W + W) + cc * yh);
}

/* solve_rows for the rows X[j0..j0+R) = e_j0..e_j0+R-1 (R <= 2 W), held transposed in Yt [n, 2 W]
 * (lanes past R unused) and written into X at the end: the same panels and the same roundings in the
 * same order as solve_rows, each step a vector over the right-hand sides, where solve_rows
 * transposes each panel's columns in and out (a third of the marginals' time at n = 128) */
INLINE void NAME(solve_identity_block)(const double *LU, const double *inv, idx n, double *X, idx j0, idx R, double *Yt) {
    const idx S = 2 * W;
    memset(Yt, 0, sizeof(double) * S * n);
    for (idx r = 0; r < R; r++) Yt[(j0 + r) * S + r] = 1.0;
    for (idx b0 = j0; b0 < n; b0 += KB) {
        const idx b1 = b0 + KB < n ? b0 + KB : n;
        for (idx t = b0; t < b1; t++) {
            const V yl = NAME(ld)(Yt + t * S), yh = NAME(ld)(Yt + t * S + W);
            for (idx t2 = t + 1; t2 < b1; t2++) NAME(axpy)(Yt, t2, -LU[t * n + t2], yl, yh);
        }
        NAME(block_update)(Yt, LU, n, b0, b1, b1, n);
    }
    for (idx b1 = n; b1 > 0; b1 -= KB) {
        const idx b0 = b1 - KB > 0 ? b1 - KB : 0;
        for (idx t = b1 - 1; t >= b0; t--) {
            const double s = inv[t];
            const V sc = SPLAT(s);
            const V yl = NAME(ld)(Yt + t * S) * sc, yh = NAME(ld)(Yt + t * S + W) * sc;
            NAME(st)(Yt + t * S, yl), NAME(st)(Yt + t * S + W, yh);
            for (idx t2 = b0; t2 < t; t2++) NAME(axpy)(Yt, t2, -LU[t * n + t2], yl, yh);
        }
        NAME(block_update)(Yt, LU, n, b0, b1, 0, b0);
    }
    idx i = 0;
    for (; i + W <= n; i += W) /* X[j0 + r, i..i+W) = Yt[i..i+W, r], W x W tiles transposed in registers */
        for (idx r0 = 0; r0 < R; r0 += W) {
            V v[W];
            for (int q = 0; q < W; q++) v[q] = NAME(ld)(Yt + (i + q) * S + r0);
            TRANSPOSE(v);
            for (idx r = r0; r < R && r < r0 + W; r++) NAME(st)(X + (j0 + r) * n + i, v[r - r0]);
        }
    for (; i < n; i++)
        for (idx r = 0; r < R; r++) X[(j0 + r) * n + i] = Yt[i * S + r];
}

#undef NAME
#undef W
#undef V
#undef SPLAT
#undef TRANSPOSE
