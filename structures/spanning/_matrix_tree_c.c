/* The matrix-tree theorem's fast paths in C, one call per batch (structures/_tree_partition.py
 * uses them on the CPU where this optional extension is built; without it the torch paths run):
 *
 * - log_partition: log Z by the subtraction-free elimination of structures/_matrix_tree.py
 *   (Grassmann, Taksar & Heyman 1985) one word at a time, in panels of eight: the pivot of word k is its margin plus
 *   its arcs from the words still kept, never a difference, and eliminating k adds
 *   A_ik A_kj / d_k to the arcs and g_k A_kj / d_k to the margins. Every quantity is a sum of
 *   products of non-negative numbers, so log Z = Σ log d_k (plus the column shifts) is exact to
 *   ~n^2 u at any scale: no certificate. Single root: the words rooted at the most popular head
 *   c0 (margins: the arcs out of c0), then Z = det K (r_c0 + Σ_c r_c v_c) with K v = w (the arcs
 *   into c0), v by substitutions with the same factors (additions only).
 *
 * - marginals: log Z and the marginals by the certified LAPACK-style path of
 *   structures/_certified.py, with the same a-posteriori error bound: LU of the Laplacian without
 *   row exchanges, X = M^{-1} by forward and back substitution on the identity's columns (panels of eight
 *   substitutions, 16 columns at a time), Koo et al.'s
 *   formulas (single root: the words rooted at c0 and a rank-one correction). ok[b] = 0 where the bound does not certify every answer within TOL; the caller computes those
 *   examples by the exact path. The bound here uses the computed |L| column sums and row maxima of
 *   |X| instead of their a-priori values (no sign assumption on the computed factors), and adds
 *   the error of the weights themselves (below).
 *
 * Both take the addresses of C-contiguous tensors (the caller's, not copied; their sizes are the
 * caller's to get right): theta float32 or float64 [B, n1, n1] (theta[b, h, m]: the arc
 * h -> m, row 0 the root; column 0 and the diagonal are ignored), lengths (int64 [B], 1..n1-1
 * words: example b is its leading (lengths[b]+1)^2 block, padding contributes nothing; 0:
 * every example n1-1 words), write logz [B] and uint8 (or bool) ok [B], and return the number of
 * examples not ok; marginals also writes mu [B, n1, n1] (0 off each example's arcs). logz and mu are
 * float64, or float32 (out_is_float32): computed in float64 and rounded once, with no float64 copy of
 * the batch (fresh memory costs a page fault per 4 KiB, ~2 us on some machines) and no conversion after.
 * Each word's scores are shifted by their max before exp: the weights lie in [0, 1], the exp
 * (_vector.h's) is within a few ulps, and the shift's rounding is below 708 u relative; an example
 * with a NaN or +inf score, or a finite weight under e^-708 (flushed to 0), is not ok.
 *
 * The work is the updates of the rows below each panel (rank_update: four rows by eight columns in
 * registers) and the exps. On AVX-512 and AVX2 a panel's own columns are transposed in registers,
 * and the inverse's right-hand sides are solved held transposed (_matrix_tree_tiles.h, at each
 * width): scalar transposes through scratch stalled (a vector load of just-stored scalars), a third
 * of the marginals' time. The batch drivers are compiled for each of _vector.h's instruction
 * sets, the CPU's best chosen when the module loads (isas(), isa(), set_isa(name)), and split
 * the batch into the caller's number of parts, on as many threads (_threads.h).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../semiring/_threads.h"
#include "../../semiring/_vector.h"

#define LOW 1e-250         /* log_partition: a smaller pivot is an underflow (or no tree) */
#define TOL 1e-9           /* marginals: certified absolute error of log Z and every marginal */
#define UNIT 0x1p-53       /* unit roundoff of float64 */
#define WEIGHT_ERR (720 * UNIT) /* relative error of a weight: exp (< 8 u) and the shift (< 708 u) */
#define KB 8               /* a panel: the eliminations (or substitutions) applied to the rows below it together */

typedef Py_ssize_t idx;

/* the helpers are inlined into the batch drivers, which are compiled once per instruction set */
#define INLINE static inline __attribute__((always_inline))

INLINE vd vload(const double *p) { vd v; memcpy(&v, p, sizeof v); return v; }
INLINE void vstore(double *p, vd v) { memcpy(p, &v, sizeof v); }

/* Σ a_i b_i, Σ |a_i| b_i, Σ |a_i| and Σ a_i with eight partial sums (the order is free: the callers' bounds hold
 * for any order of summation) */
INLINE double dot(const double *restrict a, const double *restrict b, idx n) {
    double acc[8] = {0};
    idx i = 0;
    for (; i + 8 <= n; i += 8)
        for (int t = 0; t < 8; t++) acc[t] += a[i + t] * b[i + t];
    for (; i < n; i++) acc[0] += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

INLINE double abs_dot(const double *restrict a, const double *restrict b, idx n) {
    double acc[8] = {0};
    idx i = 0;
    for (; i + 8 <= n; i += 8)
        for (int t = 0; t < 8; t++) acc[t] += fabs(a[i + t]) * b[i + t];
    for (; i < n; i++) acc[0] += fabs(a[i]) * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

INLINE double abs_sum(const double *restrict a, idx n) {
    double acc[8] = {0};
    idx i = 0;
    for (; i + 8 <= n; i += 8)
        for (int t = 0; t < 8; t++) acc[t] += fabs(a[i + t]);
    for (; i < n; i++) acc[0] += fabs(a[i]);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

INLINE double sum(const double *restrict a, idx n) {
    double acc[8] = {0};
    idx i = 0;
    for (; i + 8 <= n; i += 8)
        for (int t = 0; t < 8; t++) acc[t] += a[i + t];
    for (; i < n; i++) acc[0] += a[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

#if ISAS_X86
/* the 8 x 8 transpose of v[0..7] in registers (AVX-512): row r's lane t becomes v[t]'s lane r */
INLINE void transpose8(vd8 v[8]) {
    const vid8 lo = {0, 8, 2, 10, 4, 12, 6, 14}, hi = {1, 9, 3, 11, 5, 13, 7, 15};
    const vid8 lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
    const vid8 lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
    vd8 t[8], u[8];
    for (int i = 0; i < 8; i += 2) t[i] = __builtin_shuffle(v[i], v[i + 1], lo), t[i + 1] = __builtin_shuffle(v[i], v[i + 1], hi);
    for (int i = 0; i < 8; i += 4) {
        u[i] = __builtin_shuffle(t[i], t[i + 2], lo2), u[i + 1] = __builtin_shuffle(t[i + 1], t[i + 3], lo2);
        u[i + 2] = __builtin_shuffle(t[i], t[i + 2], hi2), u[i + 3] = __builtin_shuffle(t[i + 1], t[i + 3], hi2);
    }
    for (int i = 0; i < 4; i++) v[i] = __builtin_shuffle(u[i], u[i + 4], lo4), v[i + 4] = __builtin_shuffle(u[i], u[i + 4], hi4);
}

/* the 4 x 4 transpose of v[0..3] in registers (AVX2) */
INLINE void transpose4(vd v[4]) {
    const vid lo = {0, 4, 2, 6}, hi = {1, 5, 3, 7}, lo2 = {0, 1, 4, 5}, hi2 = {2, 3, 6, 7};
    const vd t0 = __builtin_shuffle(v[0], v[1], lo), t1 = __builtin_shuffle(v[0], v[1], hi);
    const vd t2 = __builtin_shuffle(v[2], v[3], lo), t3 = __builtin_shuffle(v[2], v[3], hi);
    v[0] = __builtin_shuffle(t0, t2, lo2), v[1] = __builtin_shuffle(t1, t3, lo2);
    v[2] = __builtin_shuffle(t0, t2, hi2), v[3] = __builtin_shuffle(t1, t3, hi2);
}
#endif

/* T[m, h] = sign W[h, m] for h, m < n (W: stride ldw; T: stride n), in 8 x 8 tiles (a column
 * written one entry at a time would meet the same cache sets at power-of-two strides), whole tiles
 * in registers where ``wide`` */
INLINE void transpose(double *restrict T, const double *restrict W, idx ldw, idx n, double sign, int wide) {
    for (idx h0 = 0; h0 < n; h0 += 8)
        for (idx m0 = 0; m0 < n; m0 += 8) {
            const idx h1 = h0 + 8 < n ? h0 + 8 : n, m1 = m0 + 8 < n ? m0 + 8 : n;
#if ISAS_X86
            if (wide && h1 - h0 == 8 && m1 - m0 == 8) {
                vd8 v[8];
                for (int q = 0; q < 8; q++) memcpy(&v[q], W + (h0 + q) * ldw + m0, 64);
                transpose8(v);
                for (int q = 0; q < 8; q++) {
                    v[q] *= (vd8){sign, sign, sign, sign, sign, sign, sign, sign};
                    memcpy(T + (m0 + q) * n + h0, &v[q], 64);
                }
                continue;
            }
#endif
            for (idx m = m0; m < m1; m++)
                for (idx h = h0; h < h1; h++) T[m * n + h] = sign * W[h * ldw + m];
        }
}

#if ISAS_X86
/* exp_shifted's whole vectors of eight (AVX-512's, where ``wide``): returns how many entries it did */
AVX512 static inline idx exp_shifted_x8(double *y, idx len, const double *c, idx cs, vid *flushed) {
    const vd8 zero = {0}, low = zero - 708.0, none = zero - INFINITY, c0 = zero + c[0];
    vid8 flushed8 = {0};
    idx i = 0;
    for (; i + 8 <= len; i += 8) {
        vd8 x, s = c0;
        memcpy(&x, y + i, 64);
        if (cs) memcpy(&s, c + i, 64);
        x -= s;
        flushed8 += (x < low) & (x > none);
        const vd8 e = exp_f64x8(x);
        memcpy(y + i, &e, 64);
    }
    for (int t = 0; t < 8; t++) (*flushed)[t % LANES_f64] += flushed8[t];
    return i;
}
#endif

/* y[i] = exp(y[i] - c[i cs]) for i < len (cs 0: one shift c[0]; 1: one per entry), eight at a time where
 * ``wide`` (the same bits: the lanes are independent); *flushed gains -1 in a lane per finite difference
 * below -708 (a weight flushed to 0) */
INLINE void exp_shifted(double *y, idx len, const double *c, idx cs, vid *flushed, int wide) {
    const vd zero = {0}, low = zero - 708.0, none = zero - INFINITY, c0 = zero + c[0];
    idx i = 0;
#if ISAS_X86
    if (wide) i = exp_shifted_x8(y, len, c, cs, flushed);
#endif
    for (; i < len; i += LANES_f64) {
        const idx lanes = len - i < LANES_f64 ? len - i : LANES_f64;
        vd x = none;
        if (lanes == LANES_f64) x = vload(y + i) - (cs ? vload(c + i) : c0);
        else for (idx t = 0; t < lanes; t++) x[t] = y[i + t] - c[(i + t) * cs];
        *flushed += (x < low) & (x > none);
        const vd e = exp_f64(x);
        if (lanes == LANES_f64) vstore(y + i, e);
        else for (idx t = 0; t < lanes; t++) y[i + t] = e[t];
    }
}

/* c_m: word m's max score, 0 where it has none (-inf); returns the count of +inf maxima */
INLINE idx finish_max(double *c, idx n) {
    idx bad = 0;
    for (idx m = 0; m < n; m++) {
        bad += c[m] == INFINITY;
        c[m] = c[m] == -INFINITY ? 0.0 : c[m];
    }
    return bad;
}

/* The shifted weights of one example of n words: W [n+1, n+1] (row stride ldw), W[h, m] =
 * exp(theta[h, m] - c_m) for words m and heads h != m, 0 in column 0 and on the diagonal; returns
 * Σ c_m (c_m: word m's max score, 0 where it has no finite one), or NAN where the example is not
 * ok (a NaN or +inf score, a weight flushed to 0). tmp: n+1 scratch doubles, c: n+1. */
INLINE double load(const void *theta, int f32, idx n1, idx n, double *W, idx ldw, double *tmp, double *c, int wide) {
    idx bad = 0; /* a count, which vectorizes */
    for (idx m = 1; m <= n; m++) c[m] = -INFINITY;
    for (idx h = 0; h <= n; h++) {
        if (f32) {
            const float *row = (const float *)theta + h * n1;
            for (idx m = 0; m <= n; m++) tmp[m] = row[m];
        } else {
            memcpy(tmp, (const double *)theta + h * n1, sizeof(double) * (n + 1));
        }
        tmp[h] = -INFINITY;
        for (idx m = 1; m <= n; m++) {
            bad += tmp[m] != tmp[m];
            c[m] = tmp[m] > c[m] ? tmp[m] : c[m];
        }
        memcpy(W + h * ldw, tmp, sizeof(double) * (n + 1));
    }
    bad += finish_max(c + 1, n);
    double shift = 0.0;
    for (idx m = 1; m <= n; m++) shift += c[m];
    c[0] = INFINITY; /* column 0 becomes exp(-inf) = 0 */
    vid flushed = {0};
    for (idx h = 0; h <= n; h++) exp_shifted(W + h * ldw, n + 1, c, 1, &flushed, wide);
    for (int t = 0; t < LANES_f64; t++) bad += flushed[t] != 0;
    return bad ? NAN : shift;
}

/* load() transposed, for the elimination, which reads each word's heads: T [n, n] (T[m, h] =
 * exp(theta[h+1, m+1] - c_m), 0 on the diagonal) and root [n] (root[m] = exp(theta[0, m+1] - c_m)),
 * the same weights, with no [n+1, n+1] copy between; returns Σ c_m or NAN as load(). c: n scratch. */
INLINE double load_heads(const void *theta, int f32, idx n1, idx n, double *T, double *root, double *c, int wide) {
    /* T[m, h] = theta[h+1, m+1] (-inf on the diagonal) in 8 x 8 tiles (see transpose()), whole tiles in
     * registers where ``wide``, and c_m, the largest (a NaN counted, not compared) of T[m, .] and root[m]:
     * in the tiles' pass where ``wide``, by a pass over T's rows otherwise */
    idx nans = 0;
#if ISAS_X86
    vid8 nans8 = {0};
#endif
#define HEADS(TYPE)                                                                                             \
    do {                                                                                                        \
        const TYPE *th = (const TYPE *)theta;                                                                   \
        for (idx m = 0; m < n; m++) root[m] = th[m + 1], c[m] = -INFINITY;                                      \
        for (idx h0 = 0; h0 < n; h0 += 8)                                                                       \
            for (idx m0 = 0; m0 < n; m0 += 8) {                                                                 \
                const idx h1 = h0 + 8 < n ? h0 + 8 : n, m1 = m0 + 8 < n ? m0 + 8 : n;                           \
                if (WIDE_TILES && wide && h1 - h0 == 8 && m1 - m0 == 8) {                                      \
                    LOAD8(TYPE)                                                                                 \
                    continue;                                                                                   \
                }                                                                                               \
                for (idx m = m0; m < m1; m++)                                                                   \
                    for (idx h = h0; h < h1; h++) {                                                             \
                        const double x = th[(h + 1) * n1 + m + 1];                                              \
                        T[m * n + h] = x;                                                                       \
                        if (wide && h != m) nans += x != x, c[m] = x > c[m] ? x : c[m];                         \
                    }                                                                                           \
            }                                                                                                   \
        for (idx m = 0; m < n; m++) T[m * n + m] = -INFINITY;                                                   \
    } while (0)
#if ISAS_X86
#define WIDE_TILES 1
    /* a tile: rows h0.. of theta's columns m0+1.. as doubles; their maxima into c[m0..]; transposed */
#define LOAD8(TYPE)                                                                                             \
    vd8 v[8], best;                                                                                             \
    for (int q = 0; q < 8; q++) {                                                                               \
        const TYPE *src = th + (h0 + q + 1) * n1 + m0 + 1;                                                      \
        if (sizeof(TYPE) == 4) {                                                                                \
            float f[8];                                                                                         \
            memcpy(f, src, 32);                                                                                 \
            v[q] = (vd8){f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]};                                       \
        } else {                                                                                                \
            memcpy(&v[q], src, 64);                                                                             \
        }                                                                                                       \
        if (h0 == m0) v[q][q] = -INFINITY;                                                                      \
    }                                                                                                           \
    memcpy(&best, c + m0, 64);                                                                                  \
    for (int q = 0; q < 8; q++) {                                                                               \
        nans8 -= v[q] != v[q];                                                                                  \
        const vid8 up = v[q] > best;                                                                            \
        best = (vd8)(((vid8)v[q] & up) | ((vid8)best & ~up));                                                   \
    }                                                                                                           \
    memcpy(c + m0, &best, 64);                                                                                  \
    transpose8(v);                                                                                              \
    for (int q = 0; q < 8; q++) memcpy(T + (m0 + q) * n + h0, &v[q], 64);
#else
#define WIDE_TILES 0
#define LOAD8(TYPE)
#endif
    if (f32) HEADS(float);
    else HEADS(double);
#undef HEADS
#undef LOAD8
#undef WIDE_TILES
#if ISAS_X86
    for (int t = 0; t < 8; t++) nans += nans8[t];
#endif
    if (!wide) { /* the rows' maxima in lanes (a scalar max is a chain of dependent compares) */
        const vd none = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        vid nans4 = {0}; /* -1 per lane and NaN */
        for (idx m = 0; m < n; m++) {
            const double *row = T + m * n;
            vd best = none;
            idx h = 0;
            for (; h + LANES_f64 <= n; h += LANES_f64) {
                const vd x = vload(row + h);
                nans4 += x != x;
                const vid up = x > best;
                best = (vd)(((vid)x & up) | ((vid)best & ~up));
            }
            for (; h < n; h++) nans += row[h] != row[h], c[m] = row[h] > c[m] ? row[h] : c[m];
            for (int t = 0; t < LANES_f64; t++) c[m] = best[t] > c[m] ? best[t] : c[m];
        }
        for (int t = 0; t < LANES_f64; t++) nans -= nans4[t];
    }
    for (idx m = 0; m < n; m++) {
        nans += root[m] != root[m];
        c[m] = root[m] > c[m] ? root[m] : c[m];
    }
    idx bad = nans != 0;
    double shift = 0.0;
    bad += finish_max(c, n);
    vid flushed = {0};
    for (idx m = 0; m < n; m++) {
        shift += c[m];
        exp_shifted(T + m * n, n, c + m, 0, &flushed, wide);
    }
    exp_shifted(root, n, c, 1, &flushed, wide);
    for (int t = 0; t < LANES_f64; t++) bad += flushed[t] != 0;
    return bad ? NAN : shift;
}

/* Y[j, i] += sign Σ_k Y[j, k] F[k, i] over the panel k0..k1-1, for the rows j0..j1-1 and the columns
 * i0..i1-1 (Y and F of row stride n, possibly one matrix: the rows j are not the panel's rows, the
 * columns i not its columns): the updates of the rows below a panel (LU, elimination) or a block
 * of substitutions, four rows by eight columns at a time in registers (sixteen where ``wide``: AVX-512's
 * vectors), each entry's terms added in the panel's order (so the same bits at either width). The
 * callers' error bounds hold for any order of summation, and the elimination's terms are non-negative. */
INLINE void rank_update(double *Y, const double *F, idx n, idx j0, idx j1, idx k0, idx k1, idx i0, idx i1, double sign, int wide) {
#define MAC(acc, c, f) acc = sign > 0 ? acc + (c) * (f) : acc - (c) * (f) /* sign is a constant where this is inlined */
    idx j = j0;
    for (; j + 4 <= j1; j += 4) {
        double *y0 = Y + j * n, *y1 = y0 + n, *y2 = y1 + n, *y3 = y2 + n;
        idx i = i0;
#if ISAS_X86
        for (; wide && i + 16 <= i1; i += 16) {
            vd8 a0, a1, a2, a3, b0, b1, b2, b3;
            memcpy(&a0, y0 + i, 64), memcpy(&a1, y1 + i, 64), memcpy(&a2, y2 + i, 64), memcpy(&a3, y3 + i, 64);
            memcpy(&b0, y0 + i + 8, 64), memcpy(&b1, y1 + i + 8, 64), memcpy(&b2, y2 + i + 8, 64), memcpy(&b3, y3 + i + 8, 64);
            for (idx k = k0; k < k1; k++) {
                vd8 f, g;
                memcpy(&f, F + k * n + i, 64), memcpy(&g, F + k * n + i + 8, 64);
                const double t0 = y0[k], t1 = y1[k], t2 = y2[k], t3 = y3[k];
                const vd8 c0 = {t0, t0, t0, t0, t0, t0, t0, t0}, c1 = {t1, t1, t1, t1, t1, t1, t1, t1};
                const vd8 c2 = {t2, t2, t2, t2, t2, t2, t2, t2}, c3 = {t3, t3, t3, t3, t3, t3, t3, t3};
                MAC(a0, c0, f), MAC(b0, c0, g), MAC(a1, c1, f), MAC(b1, c1, g);
                MAC(a2, c2, f), MAC(b2, c2, g), MAC(a3, c3, f), MAC(b3, c3, g);
            }
            memcpy(y0 + i, &a0, 64), memcpy(y1 + i, &a1, 64), memcpy(y2 + i, &a2, 64), memcpy(y3 + i, &a3, 64);
            memcpy(y0 + i + 8, &b0, 64), memcpy(y1 + i + 8, &b1, 64), memcpy(y2 + i + 8, &b2, 64), memcpy(y3 + i + 8, &b3, 64);
        }
#endif
        for (; i + 2 * LANES_f64 <= i1; i += 2 * LANES_f64) {
            vd a0 = vload(y0 + i), a1 = vload(y1 + i), a2 = vload(y2 + i), a3 = vload(y3 + i);
            vd b0 = vload(y0 + i + LANES_f64), b1 = vload(y1 + i + LANES_f64);
            vd b2 = vload(y2 + i + LANES_f64), b3 = vload(y3 + i + LANES_f64);
            for (idx k = k0; k < k1; k++) {
                const vd f = vload(F + k * n + i), g = vload(F + k * n + i + LANES_f64);
                /* (GCC 12 broadcasts from memory in one instruction only when the vectors are built from named scalars) */
                const double t0 = y0[k], t1 = y1[k], t2 = y2[k], t3 = y3[k];
                const vd c0 = {t0, t0, t0, t0}, c1 = {t1, t1, t1, t1}, c2 = {t2, t2, t2, t2}, c3 = {t3, t3, t3, t3};
                MAC(a0, c0, f), MAC(b0, c0, g), MAC(a1, c1, f), MAC(b1, c1, g);
                MAC(a2, c2, f), MAC(b2, c2, g), MAC(a3, c3, f), MAC(b3, c3, g);
            }
            vstore(y0 + i, a0), vstore(y1 + i, a1), vstore(y2 + i, a2), vstore(y3 + i, a3);
            vstore(y0 + i + LANES_f64, b0), vstore(y1 + i + LANES_f64, b1);
            vstore(y2 + i + LANES_f64, b2), vstore(y3 + i + LANES_f64, b3);
        }
        for (; i < i1; i++)
            for (idx k = k0; k < k1; k++) {
                const double f = F[k * n + i];
                MAC(y0[i], y0[k], f), MAC(y1[i], y1[k], f), MAC(y2[i], y2[k], f), MAC(y3[i], y3[k], f);
            }
    }
    for (; j < j1; j++) {
        double *y = Y + j * n;
        idx i = i0;
        for (; i + LANES_f64 <= i1; i += LANES_f64) {
            vd a = vload(y + i);
            for (idx k = k0; k < k1; k++) {
                const double t = y[k];
                const vd c = {t, t, t, t};
                MAC(a, c, vload(F + k * n + i));
            }
            vstore(y + i, a);
        }
        for (; i < i1; i++)
            for (idx k = k0; k < k1; k++) MAC(y[i], y[k], F[k * n + i]);
    }
#undef MAC
}

/* The panel's own columns k0..k1-1 of the rows j0..j1-1 of X (stride n), updated for all these
 * rows at once (the rows are independent; a row's steps are not): transposed into P (kb x (j1-j0)
 * scratch), then for t = 0, 1, ... in order: P[t] *= scale[k0+t] (scale NULL: no scaling),
 * g[j] += gk[k0+t] P[t][j] (g NULL: none), P[t2] += sign L[k0+t, k0+t2] P[t] for t2 > t; and
 * back. Each entry meets the same roundings as in one row at a time. */
INLINE void panel_rows(double *X, idx n, idx j0, idx j1, idx k0, idx k1, const double *L, const double *scale, double sign,
                       double *g, const double *gk, double *P) {
    const idx m = j1 - j0, kb = k1 - k0;
    for (idx j = 0; j < m; j++)
        for (idx t = 0; t < kb; t++) P[t * m + j] = X[(j0 + j) * n + k0 + t];
    for (idx t = 0; t < kb; t++) {
        double *restrict pt = P + t * m;
        if (scale) {
            const double sc = scale[k0 + t];
            for (idx j = 0; j < m; j++) pt[j] *= sc;
        }
        if (g) {
            const double gt = gk[k0 + t];
            double *restrict gj = g + j0;
            for (idx j = 0; j < m; j++) gj[j] += gt * pt[j];
        }
        for (idx t2 = t + 1; t2 < kb; t2++) {
            const double c = sign * L[(k0 + t) * n + k0 + t2];
            double *restrict p2 = P + t2 * m;
            for (idx j = 0; j < m; j++) p2[j] += c * pt[j];
        }
    }
    for (idx j = 0; j < m; j++)
        for (idx t = 0; t < kb; t++) X[(j0 + j) * n + k0 + t] = P[t * m + j];
}

/* the back substitution's panel_rows: for t = kb-1 down to 0, P[t] *= inv[k0+t], then
 * P[t2] -= U[k0+t, k0+t2] P[t] for t2 < t */
INLINE void panel_rows_down(double *X, idx n, idx j0, idx j1, idx k0, idx k1, const double *U, const double *inv, double *P) {
    const idx m = j1 - j0, kb = k1 - k0;
    for (idx j = 0; j < m; j++)
        for (idx t = 0; t < kb; t++) P[t * m + j] = X[(j0 + j) * n + k0 + t];
    for (idx t = kb - 1; t >= 0; t--) {
        double *restrict pt = P + t * m;
        const double sc = inv[k0 + t];
        for (idx j = 0; j < m; j++) pt[j] *= sc;
        for (idx t2 = 0; t2 < t; t2++) {
            const double c = -U[(k0 + t) * n + k0 + t2];
            double *restrict p2 = P + t2 * m;
            for (idx j = 0; j < m; j++) p2[j] += c * pt[j];
        }
    }
    for (idx j = 0; j < m; j++)
        for (idx t = 0; t < kb; t++) X[(j0 + j) * n + k0 + t] = P[t * m + j];
}

#if ISAS_X86 /* the panels in registers at AVX-512's width and at AVX2's (_matrix_tree_tiles.h) */
#define NAME(f) f##_8
#define W 8
#define V vd8
#define SPLAT(x) {x, x, x, x, x, x, x, x}
#define TRANSPOSE transpose8
#include "_matrix_tree_tiles.h"
#define NAME(f) f##_4
#define W 4
#define V vd
#define SPLAT(x) {x, x, x, x}
#define TRANSPOSE transpose4
#include "_matrix_tree_tiles.h"
#endif

/* panel_rows by the tiles of the build's vector width (tiles: 8 on AVX-512, 4 on AVX2, 0 none) */
INLINE void panel_rows_tiled(int tiles, double *X, idx n, idx j0, idx j1, idx k0, idx k1, const double *L,
                             const double *scale, double sign, double *g, const double *gk, double *P) {
#if ISAS_X86
    if (tiles == 8 && k1 - k0 == KB) {
        panel_rows_8(X, n, j0, j1, k0, L, scale, sign, g, gk, P);
        return;
    }
    if (tiles == 4 && k1 - k0 == KB) {
        panel_rows_4(X, n, j0, j1, k0, L, scale, sign, g, gk, P);
        return;
    }
#endif
    panel_rows(X, n, j0, j1, k0, k1, L, scale, sign, g, gk, P);
}

/* ------------------------------------------------------------------------------- log_partition */

/* log Z of the shifted weights of one example as load_heads() leaves them (T [n, n], each word's
 * heads contiguous, overwritten; root [n]), or NAN where a pivot is below LOW; g, w, d: n scratch
 * each, P: KB * n. */
INLINE double gth_log_partition(double *T, const double *root, idx n, int single_root, double *g, double *w, double *d, double *P,
                                int tiles) {
    const int wide = tiles == 8;
    idx c0 = 0;
    if (single_root) {
        /* the most popular head: the largest sum of its arcs out (a column of T) */
        for (idx h = 0; h < n; h++) d[h] = 0.0;
        for (idx m = 0; m < n; m++)
            for (idx h = 0; h < n; h++) d[h] += T[m * n + h];
        for (idx h = 1; h < n; h++) c0 = d[h] > d[c0] ? h : c0;
        /* the words rooted at c0: margins are c0's arcs, c0 itself is eliminated first with pivot 1 */
        for (idx m = 0; m < n; m++) { g[m] = T[m * n + c0]; w[m] = T[c0 * n + m]; }
        for (idx j = 0; j < n; j++) { T[c0 * n + j] = 0.0; T[j * n + c0] = 0.0; }
        g[c0] = 1.0;
        w[c0] = 0.0;
    } else {
        memcpy(g, root, sizeof(double) * n);
    }
    /* Σ log d_k as log of the pivots' product, held as mant 2^ex with mant in [1/2, 1) (each product's
     * rounding is u relative, as each log's was; pivots lie in [LOW, DBL_MAX): products stay normal) */
    double mant = 1.0;
    int64_t ex = 0;
    for (idx k0 = 0; k0 < n; k0 += KB) {
        const idx k1 = k0 + KB < n ? k0 + KB : n;
        for (idx k = k0; k < k1; k++) { /* the panel's words, one at a time over whole rows */
            const double *restrict lo = T + k * n; /* lo[i], i > k: the arc k <- i (unscaled: Lo_ik d_k) */
            const double dk = g[k] + sum(lo + k + 1, n - k - 1);
            if (!(dk >= LOW) || dk == INFINITY) return NAN;
            uint64_t bits;
            mant *= dk;
            memcpy(&bits, &mant, sizeof bits);
            ex += (int64_t)(bits >> 52) - 1022; /* (the sign bit is 0) */
            bits = (bits & 0x000fffffffffffffULL) | 0x3fe0000000000000ULL;
            memcpy(&mant, &bits, sizeof mant);
            d[k] = 1.0 / dk; /* d is the reciprocal pivots from here (a multiplication is cheaper) */
            for (idx j = k + 1; j < k1; j++) {
                double *restrict row = T + j * n;
                const double up = row[k] * d[k]; /* Up[k, j], kept in T[j, k] */
                row[k] = up;
                g[j] += g[k] * up;
                for (idx i = k + 1; i < n; i++) row[i] += up * lo[i];
            }
        }
        /* every later row: the panel's eliminations, its own columns (Up[k, j]) first, then one pass */
        panel_rows_tiled(tiles, T, n, k1, n, k0, k1, T, d, 1.0, g, g, P);
        rank_update(T, T, n, k1, n, k0, k1, k1, n, 1.0, wide);
    }
    /* ex ln 2 in two parts, the first exact for |ex| < 2^20 (ex is at most n 1024 in magnitude) */
    const double logdet = log(mant) + ((double)ex * 6.93147180369123816490e-01 + (double)ex * 1.90821492927058770002e-10);
    if (!single_root) return logdet;
    /* K = (I - Lo) D (I - Up): v = (I - Up)^{-1} D^{-1} (I - Lo)^{-1} w, additions only */
    for (idx k = 0; k < n; k++) {
        const double t = w[k] * d[k];
        const double *restrict lo = T + k * n;
        for (idx i = k + 1; i < n; i++) w[i] += lo[i] * t;
    }
    for (idx k = 0; k < n; k++) w[k] *= d[k];
    for (idx j = n - 1; j > 0; j--) {
        const double *restrict up = T + j * n;
        const double x = w[j];
        for (idx k = 0; k < j; k++) w[k] += up[k] * x;
    }
    double q = root[c0];
    for (idx c = 0; c < n; c++)
        if (c != c0) q += root[c] * w[c];
    if (!(q >= LOW) || q == INFINITY) return NAN;
    return logdet + log(q);
}

/* ------------------------------------------------------------------------------- marginals */

/* LU of M without row exchanges, in place, M stored transposed (A[j, i] = M[i, j], as LAPACK's
 * column-major): afterwards A[k, i] = L[i, k] (i > k) and A[j, k] = U[k, j] (k <= j); s[k] the
 * sum of |L[i, k]| in column k, the unit diagonal included. Returns log det M, or NAN at a pivot that is not > 0. */
INLINE double lu(double *A, idx n, double *s, double *P, int tiles) {
    const int wide = tiles == 8;
    double logdet = 0.0;
    for (idx k0 = 0; k0 < n; k0 += KB) {
        const idx k1 = k0 + KB < n ? k0 + KB : n;
        for (idx k = k0; k < k1; k++) { /* the panel's columns, one at a time over whole rows */
            double *restrict l = A + k * n;
            const double p = l[k];
            if (!(p > 0.0) || p == INFINITY) return NAN;
            logdet += log(p);
            const double inv = 1.0 / p; /* as LAPACK's getf2 (within the bound's γ) */
            for (idx i = k + 1; i < n; i++) l[i] *= inv;
            s[k] = 1.0 + abs_sum(l + k + 1, n - k - 1);
            for (idx j = k + 1; j < k1; j++) {
                double *restrict row = A + j * n;
                const double a = row[k];
                for (idx i = k + 1; i < n; i++) row[i] -= a * l[i];
            }
        }
        /* every later row: the panel's updates, its own columns (U[k, j]) first, then one pass */
        panel_rows_tiled(tiles, A, n, k1, n, k0, k1, A, NULL, -1.0, NULL, NULL, P);
        rank_update(A, A, n, k1, n, k0, k1, k1, n, -1.0, wide);
    }
    return logdet;
}

#define BLOCK 16 /* right-hand sides solved together */

/* Rows Y[0..R) (length n) overwritten by M^{-1} y: forward substitution with the unit L from row
 * k0 on (the rows are 0 before it), back substitution with U, multiplying by the reciprocals of
 * its pivots inv (one more rounding per step: within the bound's γ = 4 n u, which covers
 * γ_{3n+1}); LU as left by lu(). The rows are solved together so that each row of the factors is
 * read once per block. */
INLINE void solve_rows(const double *LU, const double *inv, idx n, double *Y, idx R, idx k0, double *P, int wide) {
    for (idx b0 = k0; b0 < n; b0 += KB) {
        const idx b1 = b0 + KB < n ? b0 + KB : n;
        panel_rows(Y, n, 0, R, b0, b1, LU, NULL, -1.0, NULL, NULL, P);
        rank_update(Y, LU, n, 0, R, b0, b1, b1, n, -1.0, wide);
    }
    for (idx b1 = n; b1 > 0; b1 -= KB) {
        const idx b0 = b1 - KB > 0 ? b1 - KB : 0;
        panel_rows_down(Y, n, 0, R, b0, b1, LU, inv, P);
        rank_update(Y, LU, n, 0, R, b0, b1, 0, b0, -1.0, wide);
    }
}

/* Scratch of one example of up to N words (marginals). */
typedef struct {
    double *A, *X, *s, *phi, *rowmax, *tau, *u, *r, *tmp, *diag, *P;
} Work;

/* log Z and the marginals of one example of n words, written over its weights W (stride ldw, as
 * left by load()); returns log Z of the shifted weights, and *ok whether the bound certifies both
 * within TOL. X holds n+1 rows of n: X[h, m] = (M^{-1})[m, h] (each row a solve), and row n the
 * single root's v. */
INLINE double certified_marginals(double *W, idx ldw, idx n, int single_root, Work *wk, int *ok, int tiles) {
    const int wide = tiles == 8;
    double *A = wk->A, *X = wk->X, *s = wk->s, *phi = wk->phi, *rowmax = wk->rowmax, *tau = wk->tau, *u = wk->u, *r = wk->r;
    double *diag = wk->diag; /* the reciprocal pivots, then X_mm */
    const double gam = 4.0 * n * UNIT;
    *ok = 0;
    for (idx m = 0; m < n; m++) r[m] = W[m + 1];
    transpose(A, W + ldw + 1, ldw, n, -1.0, wide);
    idx c0 = 0;
    double *v = X + n * n, *w_in = wk->tmp;
    for (idx m = 0; m < n; m++) A[m * n + m] = -sum(A + m * n, n) + (single_root ? 0.0 : r[m]);
    if (single_root) {
        double best = -1.0;
        for (idx h = 0; h < n; h++) {
            const double o = sum(W + (h + 1) * ldw + 1, n);
            if (o > best) { best = o; c0 = h; }
        }
        for (idx m = 0; m < n; m++) w_in[m] = W[(m + 1) * ldw + c0 + 1];
        for (idx j = 0; j < n; j++) { A[c0 * n + j] = 0.0; A[j * n + c0] = 0.0; }
        A[c0 * n + c0] = 1.0;
    }
    const double logdet = lu(A, n, s, wk->P, tiles);
    if (isnan(logdet)) return NAN;
    /* φ_j >= the column sums of |L||U|: Σ_k |U_kj| s_k */
    for (idx j = 0; j < n; j++) phi[j] = abs_dot(A + j * n, s, j + 1);
    for (idx k = 0; k < n; k++) diag[k] = 1.0 / A[k * n + k];
#if ISAS_X86
    if (tiles) { /* blocks of 2 tiles right-hand sides (at most BLOCK) */
        for (idx j0 = 0; j0 < n; j0 += 2 * tiles) {
            const idx R = n - j0 < 2 * tiles ? n - j0 : 2 * tiles;
            if (tiles == 8) solve_identity_block_8(A, diag, n, X, j0, R, wk->P);
            else solve_identity_block_4(A, diag, n, X, j0, R, wk->P);
        }
    } else
#endif
    {
        memset(X, 0, sizeof(double) * n * n);
        for (idx j0 = 0; j0 < n; j0 += BLOCK) {
            const idx R = n - j0 < BLOCK ? n - j0 : BLOCK;
            for (idx r0 = 0; r0 < R; r0++) X[(j0 + r0) * n + j0 + r0] = 1.0;
            solve_rows(A, diag, n, X + j0 * n, R, j0, wk->P, wide);
        }
    }
    if (single_root) {
        memcpy(v, w_in, sizeof(double) * n);
        solve_rows(A, diag, n, v, 1, 0, wk->P, wide);
        v[c0] = 1.0;
    }
    for (idx m = 0; m < n; m++) diag[m] = X[m * n + m];
    /* row maxima of |X| (X[m, .] is column m here), τ = φ^T |X|, u = rr^T X */
    for (idx m = 0; m < n; m++) rowmax[m] = 0.0;
    for (idx h = 0; h < n; h++) {
        const double *xh = X + h * n;
        for (idx m = 0; m < n; m++) rowmax[m] = fabs(xh[m]) > rowmax[m] ? fabs(xh[m]) : rowmax[m];
        tau[h] = abs_dot(xh, phi, n);
    }
    double taumax = 0.0, err_z, err_mu = 0.0, logz;
    for (idx m = 0; m < n; m++) {
        rowmax[m] *= 1.0 + 1e-6;
        taumax = tau[m] > taumax ? tau[m] : taumax;
    }
    double rowphi = 0.0;
    for (idx j = 0; j < n; j++) rowphi += rowmax[j] * phi[j];
    if (!single_root) {
        err_z = gam * rowphi + 4 * n * UNIT * fabs(logdet);
        for (idx m = 0; m < n; m++) {
            const double e = rowmax[m] * (gam * (tau[m] + taumax) + 4 * UNIT);
            err_mu = e > err_mu ? e : err_mu;
        }
        for (idx m = 0; m < n; m++) W[m + 1] = r[m] * diag[m];
        for (idx h = 0; h < n; h++) {
            double *mu = W + (h + 1) * ldw + 1;
            const double *xh = X + h * n;
            for (idx m = 0; m < n; m++) {
                const double x = mu[m] * (diag[m] - xh[m]);
                mu[m] = x > 0.0 ? x : 0.0;
            }
        }
        logz = logdet;
    } else {
        /* the words rooted at c0, then every root by a rank-one correction (see _certified.py) */
        const double r0 = r[c0];
        r[c0] = 0.0; /* r is rr from here */
        for (idx h = 0; h < n; h++) u[h] = dot(X + h * n, r, n);
        const double q = r0 + dot(u, w_in, n);
        const double sig_w = dot(tau, w_in, n), rho_r = dot(r, rowmax, n);
        const double dq = gam * rho_r * sig_w;
        const double rel_q = dq / q + 2 * gam;
        double umax = -INFINITY;
        for (idx h = 0; h < n; h++) umax = u[h] > umax ? u[h] : umax;
        const double dumax = gam * rho_r * taumax;
        r[c0] = r0;
        for (idx m = 0; m < n; m++) {
            const double dv = gam * rowmax[m] * sig_w, du = gam * rho_r * tau[m], uu = u[m] + umax;
            double e = m == c0 ? (dumax + umax * rel_q) / q
                               : rowmax[m] * (gam * (tau[m] + taumax) + 8 * UNIT) + (dv * uu + v[m] * (dumax + du + uu * rel_q)) / q;
            const double e_root = r[m] * (dv + v[m] * rel_q) / q;
            e = e_root > e ? e_root : e;
            err_mu = e > err_mu ? e : err_mu;
        }
        err_z = gam * rowphi + dq / q + 4 * n * UNIT * (fabs(logdet) + fabs(log(q)));
        logz = logdet + log(q);
        /* μ[h, m] = W[h, m] ((X_mm - vq_m u_m) - X_mh + u_h vq_m); column c0: w_in_h u_h / q */
        for (idx m = 0; m < n; m++) {
            s[m] = v[m] / q; /* s is vq from here */
            tau[m] = diag[m] - s[m] * u[m]; /* τ is X_mm - vq_m u_m from here */
            W[m + 1] = r[m] * s[m];
        }
        for (idx h = 0; h < n; h++) {
            double *mu = W + (h + 1) * ldw + 1;
            const double *xh = X + h * n;
            const double uh = u[h];
            for (idx m = 0; m < n; m++) {
                const double x = mu[m] * ((tau[m] - xh[m]) + uh * s[m]);
                mu[m] = x > 0.0 ? x : 0.0;
            }
            const double x = w_in[h] * uh / q;
            mu[c0] = x > 0.0 ? x : 0.0;
        }
    }
    /* the weights' own error: every tree's weight within n WEIGHT_ERR relative */
    err_z += n * WEIGHT_ERR;
    err_mu += 2 * n * WEIGHT_ERR;
    *ok = isfinite(logz) && err_z <= TOL && err_mu <= TOL;
    return logz;
}

/* ------------------------------------------------------------------------------- bindings */

typedef struct {
    const char *theta;
    const int64_t *lengths; /* NULL: every example n1-1 words */
    void *logz, *mu; /* float64, or float32 where out32 */
    uint8_t *ok;
    idx B, n1;
    int f32, single_root, out32;
} Args;

/* checks the sizes and the lengths; 0 with a ValueError set otherwise (the addresses are the caller's
 * tensors' own: their sizes are the caller's to get right) */
static int check(const Args *a) {
    int good = a->n1 >= 2 && a->B >= 0 && (a->B == 0 || (a->theta && a->logz && a->ok));
    for (idx b = 0; good && a->lengths && b < a->B; b++) good = a->lengths[b] >= 1 && a->lengths[b] < a->n1;
    if (!good) PyErr_SetString(PyExc_ValueError, "expected n1 >= 2, B >= 0, lengths in 1..n1-1 and addresses of theta, logz and ok");
    return good;
}

/* logz[b] = z, rounded once to float32 where out32 */
INLINE void put(const Args *a, idx b, double z) {
    if (a->out32) ((float *)a->logz)[b] = (float)z;
    else ((double *)a->logz)[b] = z;
}

INLINE int log_partition_batch(const void *args, int64_t b0, int64_t b1, int tiles) {
    const int wide = tiles == 8;
    const Args *a = args;
    const idx n1 = a->n1, N = n1 - 1;
    double *buf = malloc(sizeof(double) * (N * N + (5 + KB) * n1));
    if (!buf) return 0;
    double *T = buf, *root = T + N * N, *g = root + n1, *w = g + n1, *d = w + n1, *c = d + n1, *P = c + n1;
    const idx stride = n1 * n1 * (a->f32 ? sizeof(float) : sizeof(double));
    for (idx b = b0; b < b1; b++) {
        const idx n = a->lengths ? a->lengths[b] : N;
        const double shift = load_heads(a->theta + b * stride, a->f32, n1, n, T, root, c, wide);
        const double z = isnan(shift) ? NAN : gth_log_partition(T, root, n, a->single_root, g, w, d, P, tiles);
        a->ok[b] = !isnan(z);
        put(a, b, z + shift);
    }
    free(buf);
    return 1;
}

INLINE int marginals_batch(const void *args, int64_t b0, int64_t b1, int tiles) {
    const int wide = tiles == 8;
    const Args *a = args;
    const idx n1 = a->n1, N = n1 - 1;
    /* float32 marginals: each example's weights and marginals in float64 here, rounded once into mu */
    double *buf = malloc(sizeof(double) * (N * N + n1 * N + (10 + BLOCK) * n1 + (a->out32 ? n1 * n1 : 0)));
    if (!buf) return 0;
    Work wk;
    wk.A = buf;
    wk.X = wk.A + N * N;
    wk.s = wk.X + n1 * N;
    wk.phi = wk.s + n1;
    wk.rowmax = wk.phi + n1;
    wk.tau = wk.rowmax + n1;
    wk.u = wk.tau + n1;
    wk.r = wk.u + n1;
    wk.tmp = wk.r + n1;
    wk.diag = wk.tmp + n1;
    double *c = wk.diag + n1, *tmp = c + n1;
    wk.P = tmp + n1;
    double *const W32 = wk.P + BLOCK * n1; /* (out32) */
    const idx stride = n1 * n1 * (a->f32 ? sizeof(float) : sizeof(double));
    for (idx b = b0; b < b1; b++) {
        const idx n = a->lengths ? a->lengths[b] : N;
        double *W = a->out32 ? W32 : (double *)a->mu + b * n1 * n1;
        const double shift = load(a->theta + b * stride, a->f32, n1, n, W, n1, tmp, c, wide);
        int ok = 0;
        const double z = isnan(shift) ? NAN : certified_marginals(W, n1, n, a->single_root, &wk, &ok, tiles);
        /* zeros off the example's arcs (padding rows and columns) */
        if (a->out32) {
            float *mu = (float *)a->mu + b * n1 * n1;
            for (idx h = 0; h <= n; h++) {
                for (idx m = 0; m <= n; m++) mu[h * n1 + m] = (float)W[h * n1 + m];
                memset(mu + h * n1 + n + 1, 0, sizeof(float) * (N - n));
            }
            memset(mu + (n + 1) * n1, 0, sizeof(float) * n1 * (N - n));
        } else {
            for (idx h = 0; h <= n; h++) memset(W + h * n1 + n + 1, 0, sizeof(double) * (N - n));
            memset(W + (n + 1) * n1, 0, sizeof(double) * n1 * (N - n));
        }
        a->ok[b] = ok;
        put(a, b, z + shift);
    }
    free(buf);
    return 1;
}

/* the batch drivers over examples [b0, b1) (PartFn of _threads.h), compiled once per instruction
 * set (_vector.h), TILES the lanes of its tiles in registers (8: AVX-512's 64-byte vectors, also
 * ``wide`` there; 4: AVX2's; 0: none); RUN[isa][with_mu] */
#define DRIVERS(ISA, TARGET, TILES)                                                                                                  \
    TARGET static int log_partition##ISA(const void *a, int64_t b0, int64_t b1) { return log_partition_batch(a, b0, b1, TILES); } \
    TARGET static int marginals##ISA(const void *a, int64_t b0, int64_t b1) { return marginals_batch(a, b0, b1, TILES); }
DRIVERS(_base, , 0)
#if ISAS_X86
DRIVERS(_avx2, AVX2, 4)
DRIVERS(_avx512, AVX512, 8)
static PartFn *const RUN[][2] = {{log_partition_base, marginals_base}, {log_partition_avx2, marginals_avx2},
                                 {log_partition_avx512, marginals_avx512}};
#else
static PartFn *const RUN[][2] = {{log_partition_base, marginals_base}};
#endif

static PyObject *entry(PyObject *args, int with_mu) {
    Args a = {0};
    Py_ssize_t theta, lengths, logz, ok, mu = 0, parts;
    int parsed = with_mu ? PyArg_ParseTuple(args, "npnnnpnnnpn", &theta, &a.f32, &a.B, &a.n1, &lengths, &a.single_root, &logz, &ok, &mu, &a.out32, &parts)
                         : PyArg_ParseTuple(args, "npnnnpnnpn", &theta, &a.f32, &a.B, &a.n1, &lengths, &a.single_root, &logz, &ok, &a.out32, &parts);
    if (!parsed) return NULL;
    a.theta = (const char *)theta, a.lengths = (const int64_t *)lengths, a.logz = (void *)logz, a.ok = (uint8_t *)ok, a.mu = (void *)mu;
    if (!check(&a) || (with_mu && a.B && !a.mu)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "expected the address of mu");
        return NULL;
    }
    int ran;
    Py_BEGIN_ALLOW_THREADS
    ran = split_batch(RUN[isa][with_mu], &a, a.B, parts);
    Py_END_ALLOW_THREADS
    if (!ran) return PyErr_NoMemory();
    idx failed = 0;
    for (idx b = 0; b < a.B; b++) failed += !a.ok[b];
    return PyLong_FromSsize_t(failed);
}

static PyObject *log_partition(PyObject *self, PyObject *args) { return entry(args, 0); }

static PyObject *marginals(PyObject *self, PyObject *args) { return entry(args, 1); }

static PyMethodDef methods[] = {
    {"log_partition", log_partition, METH_VARARGS,
     "log_partition(theta, is_float32, B, n1, lengths, single_root, logz, ok, out_is_float32, parts): exact log Z, in place, the batch in parts "
     "on as many threads; returns how many examples are not ok. theta, lengths (0: none), logz and ok are addresses."},
    {"marginals", marginals, METH_VARARGS,
     "marginals(theta, is_float32, B, n1, lengths, single_root, logz, ok, mu, out_is_float32, parts): certified log Z and marginals, in place, "
     "the batch in parts on as many threads; returns how many examples are not ok. The tensors are passed by address."},
    ISA_METHODS
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_matrix_tree_c", NULL, -1, methods};

PyMODINIT_FUNC PyInit__matrix_tree_c(void) {
    choose_best_isa();
    return PyModule_Create(&module);
}
