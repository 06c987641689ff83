/* The Log semiring's steps of a level as one C loop (semiring/language/kernel.py packs them): on
 * the CPU, where each step as torch calls would cost ~8-30 dispatches of a few microseconds each
 * while its arithmetic is often a few thousand numbers. Built at install time as the optional
 * extension semiring.language._kernel (setup.py); without it the torch calls of execute.py run.
 *
 * A step is a box of coordinates, the first nL its items' (L), the rest summed (K). Term r of an
 * instance is read at  table[src_r].address + b * table[src_r].batch_stride + offset_r + Σ strides_r
 * * coords  (elements of the run's dtype); the instance exists where every mask holds (const +
 * Σ coeffs * coords >= 0, or != 0). An item is  log Σ_K exp(Σ_r term_r)  (the reads' sum over the
 * instances of the box; no instance: -inf), written to each of the step's heads, or ⊕-ed (logaddexp)
 * into them where an earlier step of the level wrote the same items ("accumulate").
 *
 * The backward of a step adds  exp(Σ_r term_r - item) * g  to the gradient of every term of every
 * instance, where g is the sum of the gradients at the item's heads and item its final value (the
 * ⊕ over every rule that writes it; clamped to the finite range as execute._softmax_weights does);
 * a step without K that alone writes its items passes g unchanged.
 *
 * Three ways through a step (path()): without K, a row of items at a time along the last L
 * coordinate; with K over rows of at least 4 items, a row at a time too, the vector lanes being
 * items (the terms of the row's instances in a [K, row] scratch, max and Σ exp down its columns);
 * else item by item, the lanes being its K instances. A backward pass takes consecutive steps of the
 * first way that write one line of a buffer (an alignment's anti-diagonal) together (grouped()). The exp and the log1p of logaddexp are
 * vector polynomials, exact to half an ulp (tests/test_kernel.py checks both against torch).
 *
 * Descriptor of a level (int64, semiring/language/pack.py): the number of steps, then per step
 *   n, nL, R, H, M, accumulate, shared, sizes[n],
 *   R x (src, offset, strides[n], bound, L, L x (src, stride, offset, bound, strides[n])),
 *   H x (src, offset, strides[nL]), M x (op (0: >=, 1: !=), const, coeffs[n]).
 * Table (int64): per source, (address, batch stride).
 * A read with L > 0 lookups adds stride_l * index_l to its position, index_l read from an int64
 * source at offset_l + Σ strides_l * coords (clamped into [0, bound_l) where bound_l > 0), and the
 * position is clamped into [0, bound) where bound > 0 (a gather): such a read's positions are
 * computed a row at a time (located_row()), on every path.
 *
 * forward(max, double, B, threads, table, levels[, starts])   the levels' items into their heads (max:
 *                                                             the Max semiring's, below; else the Log
 *                                                             semiring's)
 * backward(max, double, B, threads, table, grads, levels[, starts])  their gradients into the grads
 *                                                             table's buffers (each level's steps in the
 *                                                             order of execute._backward_order)
 * levels holds the descriptors levels[starts[k]:starts[k+1]] run one after the other (without starts:
 * one descriptor), so that a stretch of levels is one call.
 * pair_forward(double, B, threads, table, levels[, starts]) and pair_backward(double, B, threads, table,
 * grads, levels[, starts]): the same levels in the Log semiring on pairs (value, tangent), the passes of
 * a Hessian-vector product (item by item, scalar: PAIR_STEPS below); each table holds its sources'
 * values' rows, then as many rows of their tangents.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../_vector.h"

#define MAXDIM 16
#define MAXREADS 32 /* terms of a rule */

typedef struct {
    int64_t n, nL, R, H, M, accumulate, shared;
    const int64_t *sizes;
    const int64_t *rd[MAXREADS]; /* each read: src, offset, strides[n], bound, L, lookups */
    const int64_t *heads; /* H x (2 + nL) */
    const int64_t *masks; /* M x (2 + n) */
    int64_t K;            /* instances per item: the product of the K sizes */
} Step;

/* the step at p (ending before end); returns the position after it, or NULL where it is malformed */
static const int64_t *parse(const int64_t *p, const int64_t *end, Step *s) {
    if (end - p < 7) return NULL;
    s->n = p[0]; s->nL = p[1]; s->R = p[2]; s->H = p[3]; s->M = p[4]; s->accumulate = p[5]; s->shared = p[6];
    if (s->n < 0 || s->n > MAXDIM || s->R < 0 || s->R > MAXREADS) return NULL;
    p += 7;
    s->sizes = p; p += s->n;
    for (int64_t r = 0; r < s->R; r++) {
        if (end - p < 4 + s->n) return NULL;
        s->rd[r] = p;
        const int64_t L = p[3 + s->n];
        if (L < 0 || L > MAXREADS) return NULL;
        p += (4 + s->n) * (1 + L);
    }
    s->heads = p; p += s->H * (2 + s->nL);
    s->masks = p; p += s->M * (2 + s->n);
    s->K = 1;
    for (int64_t d = s->nL; d < s->n; d++) s->K *= s->sizes[d];
    return p;
}

static int check(const Step *s) {
    return s->n >= 0 && s->n <= MAXDIM && s->nL >= 0 && s->nL <= s->n && s->R >= 0 && s->R <= MAXREADS && s->H >= 1 && s->M >= 0;
}

#define ROW_CHUNK 256 /* positions of an indexed read computed at a time (a stack array) */

/* the positions of read rd (from its offset) for example b at the instances where coordinate last
 * is coords[last] + i0 + j, j < count, its other coordinates coords' (last < 0: none varies): the
 * strided part and every lookup along the row, then the clamps */
static void located_row(const Step *s, const int64_t *rd, const int64_t *table, int64_t b, const int64_t *coords,
                        int64_t last, int64_t i0, int64_t count, int64_t *pos) {
    const int64_t n = s->n, bound = rd[2 + n];
    int64_t at = rd[1];
    for (int64_t d = 0; d < n; d++) at += rd[2 + d] * (coords[d] + (d == last ? i0 : 0));
    const int64_t st = last >= 0 ? rd[2 + last] : 0;
    for (int64_t j = 0; j < count; j++) pos[j] = at + j * st;
    const int64_t *lk = rd + 4 + n;
    for (int64_t l = 0; l < rd[3 + n]; l++, lk += 4 + n) {
        int64_t la = lk[2];
        for (int64_t d = 0; d < n; d++) la += lk[4 + d] * (coords[d] + (d == last ? i0 : 0));
        const int64_t ls = last >= 0 ? lk[4 + last] : 0, lb = lk[3], stride = lk[1];
        const int64_t *index = (const int64_t *)(intptr_t)table[2 * lk[0]] + b * table[2 * lk[0] + 1];
        for (int64_t j = 0; j < count; j++) {
            int64_t x = la + j * ls;
            if (lb > 0) x = x < 0 ? 0 : x >= lb ? lb - 1 : x;
            pos[j] += stride * index[x];
        }
    }
    for (int64_t j = 0; j < count; j++) {
        int64_t x = pos[j];
        if (bound > 0) x = x < 0 ? 0 : x >= bound ? bound - 1 : x;
        pos[j] = x - rd[1];
    }
}

/* the position of read rd (from its offset) at the instance coords[0:n] */
static int64_t located(const Step *s, const int64_t *rd, const int64_t *table, int64_t b, const int64_t *coords) {
    int64_t pos;
    located_row(s, rd, table, b, coords, -1, 0, 1, &pos);
    return pos;
}

/* a row of an indexed read: BODY runs for i = c + j (j < m) with its position pos[j] */
#define EACH_LOCATED(rd, coords, last, inner, BODY)                                                  \
    do {                                                                                               \
        int64_t pos[ROW_CHUNK];                                                                        \
        for (int64_t c = 0; c < (inner); c += ROW_CHUNK) {                                             \
            const int64_t m = (inner) - c < ROW_CHUNK ? (inner) - c : ROW_CHUNK;                       \
            located_row(s, rd, table, b, coords, last, c, m, pos);                                     \
            for (int64_t j = 0; j < m; j++) BODY;                                                      \
        }                                                                                              \
    } while (0)

/* whether read rd gathers or looks positions up (its positions then come from located_row()) */
static inline int indexed(const Step *s, const int64_t *rd) { return rd[2 + s->n] > 0 || rd[3 + s->n] > 0; }

/* whether the instance at coords passes every mask */
static int holds(const Step *s, const int64_t *coords) {
    for (int64_t j = 0; j < s->M; j++) {
        const int64_t *m = s->masks + j * (2 + s->n);
        int64_t e = m[1];
        for (int64_t d = 0; d < s->n; d++) e += m[2 + d] * coords[d];
        if (m[0] == 0 ? e < 0 : e == 0) return 0;
    }
    return 1;
}

/* the next coordinates of dims [lo, hi) (an odometer, last fastest); returns 0 after the last */
static int next(int64_t *coords, const int64_t *sizes, int64_t lo, int64_t hi) {
    for (int64_t d = hi - 1; d >= lo; d--) {
        if (++coords[d] < sizes[d]) return 1;
        coords[d] = 0;
    }
    return 0;
}

enum { RUN_LOG, RUN_MAX, RUN_PAIRS }; /* the semiring a run computes in: Log, Max, or Log on pairs (value, tangent) */

#define PITCH(inner) (((inner) + 7) / 8 * 8) /* a scratch row: a multiple of both vector widths */
#define ROW_LIMIT (1 << 22)                     /* the most numbers a row-at-a-time step may hold */

/* how a step runs (mode: RUN_LOG, RUN_MAX or RUN_PAIRS): 1 a row of items at a time without K (Log), 2 a row at a
 * time with K (long rows; Max: with or without K), 0 item by item (pairs: always) */
static int path(const Step *s, int mode) {
    if (!s->nL || mode == RUN_PAIRS) return 0;
    if (s->n == s->nL && mode == RUN_LOG) return 1;
    const int64_t inner = s->sizes[s->nL - 1];
    return inner >= 4 && s->K * PITCH(inner) <= ROW_LIMIT ? 2 : 0;
}

#define PAIR_PAD(K) (((K) + 15) / 16 * 16) /* a pair step's terms, padded to any vector width: its tangents follow */

/* the scratch numbers a step needs */
static int64_t need(const Step *s, int mode) {
    const int64_t pitch = s->nL ? PITCH(s->sizes[s->nL - 1]) : 8;
    if (mode == RUN_PAIRS) return 2 * PAIR_PAD(s->K) + 16;
    switch (path(s, mode)) {
    case 1: return 2 * pitch + 8;
    case 2: return (s->K + 3) * pitch + 8;
    default: return 2 * (s->K + 8);
    }
}

/* A group, in a backward pass: consecutive steps of a level, Log, each a row of items without K (path
 * 1) along its one item coordinate, with one head, all in one buffer at one stride along that
 * coordinate, each sharing its items with another rule. Their items are runs of one line of the
 * head buffer (an anti-diagonal of an alignment's chart, a frame of CTC's), so each item's gradient
 * and value are read once for the group, where step by step each rule read both at the buffer's
 * stride: the same numbers, but for the order in which several examples' gradients add into an
 * input the batch shares (7-8% of an alignment's marginals, B = 16, n = m = 64; the forward's
 * writes, grouped the same way, gained nothing: its cost is the ⊕'s arithmetic). */
#define GROUP_MAX 8

static int groupable(const Step *s, int mode) {
    return mode == RUN_LOG && path(s, mode) == 1 && s->nL == 1 && s->H == 1 && s->shared && s->heads[2] != 0;
}

/* the group that starts at p (of at most `left` steps): its steps in g[0..n) (n = 1: no group, g[0]
 * the step), *after the position past them, and the union of their items, [*lo, *lo + *width) in
 * head strides from the first step's head (0 where n = 1); NULL *after where a step is malformed */
static int64_t grouped(const int64_t *p, const int64_t *end, int64_t left, int mode, Step *g, int64_t *lo,
                       int64_t *width, const int64_t **after) {
    int64_t n = 1;
    *after = parse(p, end, g);
    *lo = *width = 0;
    if (!*after || !groupable(g, mode)) return 1;
    const int64_t stride = g[0].heads[2];
    while (n < left && n < GROUP_MAX) {
        const int64_t *q = parse(*after, end, g + n);
        const Step *u = g + n;
        if (!q || !check(u) || !groupable(u, mode) || u->heads[0] != g[0].heads[0] || u->heads[2] != stride
            || (u->heads[1] - g[0].heads[1]) % stride != 0)
            break;
        *after = q;
        n++;
    }
    if (n == 1) return 1;
    int64_t hi = g[0].sizes[0];
    for (int64_t k = 1; k < n; k++) {
        const int64_t at = (g[k].heads[1] - g[0].heads[1]) / stride;
        *lo = at < *lo ? at : *lo;
        hi = at + g[k].sizes[0] > hi ? at + g[k].sizes[0] : hi;
    }
    *width = hi - *lo;
    return n;
}

/* the scratch numbers a group of this width needs: a step's terms and weights, the items' gradients
 * and values, rows of PITCH(width), and a vector's padding */
static int64_t group_need(int64_t width) { return 4 * PITCH(width) + 16; }

/* log(1 + e) for e in [0, 1] (logaddexp's correction): 2 atanh(u), u = e / (2 + e) in [0, 1/3], by
 * its odd series (8 terms for float, 17 for double: below half an ulp), relative to e as e -> 0 */
static inline __attribute__((always_inline)) vf log1p_f32(vf e) {
    vf u = e / (2.0f + e), u2 = u * u, p = (vf){0} + 2.0f / 15;
    for (int k = 6; k >= 0; k--) p = p * u2 + 2.0f / (2 * k + 1);
    return u * p;
}

static inline __attribute__((always_inline)) vd log1p_f64(vd e) {
    vd u = e / (2.0 + e), u2 = u * u, p = (vd){0} + 2.0 / 33;
    for (int k = 15; k >= 0; k--) p = p * u2 + 2.0 / (2 * k + 1);
    return u * p;
}

/* y[i * hs] = logaddexp(y[i * hs], t[i]) for i < inner, LANES at a time (t padded; y's whole vectors
 * loaded and stored as such where hs is 1: a diagonal chart's levels, held level by level) */
#define LOGADDEXP_ROW(T, V, VI, SUFFIX)                                                                     \
static inline __attribute__((always_inline)) void logaddexp_row_##SUFFIX(T *y, int64_t hs, const T *t,      \
                                                                         int64_t inner) {                   \
    const V inf = (V){0} + INFINITY;                                                                        \
    for (int64_t k = 0; k < inner; k += LANES_##SUFFIX) {                                                   \
        V a, b;                                                                                             \
        const int whole = hs == 1 && k + LANES_##SUFFIX <= inner;                                           \
        memcpy(&b, t + k, sizeof b);                                                                        \
        if (whole) memcpy(&a, y + k, sizeof a);                                                             \
        else for (int i = 0; i < LANES_##SUFFIX; i++) a[i] = k + i < inner ? y[(k + i) * hs] : -INFINITY;   \
        VI ge = a >= b;                                                                                     \
        V m = (V)(((VI)a & ge) | ((VI)b & ~ge)), lo = (V)(((VI)b & ge) | ((VI)a & ~ge));                  \
        V r = m + log1p_##SUFFIX(exp_##SUFFIX(lo - m));                                                     \
        VI odd = (m == inf) | (m == -inf);                                                                  \
        r = (V)(((VI)m & odd) | ((VI)r & ~odd));                                                            \
        VI nan = (a != a) | (b != b);                                                                       \
        r = (V)(((VI)(a + b) & nan) | ((VI)r & ~nan));                                                      \
        if (whole) memcpy(y + k, &r, sizeof r);                                                             \
        else for (int i = 0; i < LANES_##SUFFIX && k + i < inner; i++) y[(k + i) * hs] = r[i];              \
    }                                                                                                       \
}
LOGADDEXP_ROW(float, vf, vif, f32)
LOGADDEXP_ROW(double, vd, vid, f64)

#define KERNELS(T, V, VI, SUFFIX, LOWEST, LOG, LOG1P, EXP1)                                                 \
static inline __attribute__((always_inline)) V load_##SUFFIX(const T *p) { V v; memcpy(&v, p, sizeof v); return v; } \
static inline __attribute__((always_inline)) void store_##SUFFIX(T *p, V v) { memcpy(p, &v, sizeof v); }   \
                                                                                                            \
/* the terms of the item whose reads start at base[r] (its K instances, -inf where masked) into          \
 * t[0:K], and -inf up to the next multiple of the vector width */                                         \
static inline __attribute__((always_inline)) void terms_##SUFFIX(const Step *s, const int64_t *table,      \
                                                                 int64_t b, T *const *src,                  \
                                                                 const int64_t *base, int64_t *coords, T *t) { \
    for (int64_t d = s->nL; d < s->n; d++) coords[d] = 0;                                                  \
    const int64_t last = s->n - 1, inner = s->n > s->nL ? s->sizes[last] : 1;                              \
    int64_t k = 0;                                                                                          \
    do {                                                                                                    \
        T *restrict out = t + k;                                                                            \
        if (s->R == 0) for (int64_t i = 0; i < inner; i++) out[i] = 0;                                     \
        for (int64_t r = 0; r < s->R; r++) {                                                               \
            const int64_t *rd = s->rd[r];                                                 \
            if (indexed(s, rd)) {                                                                           \
                EACH_LOCATED(rd, coords, last, inner, out[c + j] = r == 0 ? src[r][pos[j]] : out[c + j] + src[r][pos[j]]); \
                continue;                                                                                   \
            }                                                                                               \
            int64_t at = base[r];                                                                           \
            for (int64_t d = s->nL; d < last; d++) at += rd[2 + d] * coords[d];                           \
            const T *restrict x = src[r] + at;                                                              \
            const int64_t st = s->n > s->nL ? rd[2 + last] : 0;                                            \
            if (r == 0 && st == 1) for (int64_t i = 0; i < inner; i++) out[i] = x[i];                      \
            else if (r == 0) for (int64_t i = 0; i < inner; i++) out[i] = x[i * st];                       \
            else if (st == 1) for (int64_t i = 0; i < inner; i++) out[i] += x[i];                          \
            else for (int64_t i = 0; i < inner; i++) out[i] += x[i * st];                                  \
        }                                                                                                   \
        if (s->M) {                                                                                         \
            for (int64_t i = 0; i < inner; i++) {                                                          \
                if (s->n > s->nL) coords[last] = i;                                                        \
                if (!holds(s, coords)) out[i] = -INFINITY;                                                 \
            }                                                                                               \
            if (s->n > s->nL) coords[last] = 0;                                                            \
        }                                                                                                   \
        k += inner;                                                                                         \
    } while (s->n - 1 > s->nL && next(coords, s->sizes, s->nL, last));                                    \
    for (; k % LANES_##SUFFIX; k++) t[k] = -INFINITY;                                                      \
}                                                                                                           \
                                                                                                            \
/* log Σ exp(t[0:K]) (the max clamped to the finite range, as execute._logsumexp_); t padded */            \
static inline __attribute__((always_inline)) T logsumexp_##SUFFIX(const T *t, int64_t K) {                 \
    V mv = load_##SUFFIX(t);                                                                                \
    for (int64_t k = LANES_##SUFFIX; k < K; k += LANES_##SUFFIX) {                                         \
        V x = load_##SUFFIX(t + k);                                                                         \
        VI gt = x > mv;                                                                                     \
        mv = (V)(((VI)x & gt) | ((VI)mv & ~gt));                                                           \
    }                                                                                                       \
    T m = LOWEST;                                                                                           \
    for (int i = 0; i < LANES_##SUFFIX; i++) m = mv[i] > m ? mv[i] : m;                                    \
    if (m > -LOWEST) m = -LOWEST;                                                                           \
    V sv = {0};                                                                                          \
    for (int64_t k = 0; k < K; k += LANES_##SUFFIX) sv += exp_##SUFFIX(load_##SUFFIX(t + k) - m);          \
    T sum = 0;                                                                                              \
    for (int i = 0; i < LANES_##SUFFIX; i++) sum += sv[i];                                                 \
    return LOG(sum) + m;                                                                                    \
}                                                                                                           \
                                                                                                            \
static inline T log_s_##SUFFIX(T x) { return LOG(x); } /* (scalar: the pair steps') */                    \
static inline T exp_s_##SUFFIX(T x) { return EXP1(x); }                                                     \
                                                                                                            \
static T logaddexp_##SUFFIX(T a, T b) {                                                                    \
    T m = a > b ? a : b;                                                                                    \
    if (isnan(a) || isnan(b)) return a + b;                                                                 \
    if (isinf(m)) return m;                                                                                 \
    T d = a - b;                                                                                            \
    return m + LOG1P(EXP1(d < 0 ? d : -d));                                                                 \
}                                                                                                           \
                                                                                                            \
/* the batch's b: where every read and head starts */                                                      \
static inline __attribute__((always_inline)) void place_##SUFFIX(const Step *s, const int64_t *table,      \
                                                                 int64_t b, T **src, T **dst) {             \
    for (int64_t r = 0; r < s->R; r++) {                                                                   \
        const int64_t *rd = s->rd[r];                                                     \
        src[r] = (T *)(intptr_t)table[2 * rd[0]] + b * table[2 * rd[0] + 1] + rd[1];                       \
    }                                                                                                       \
    for (int64_t h = 0; h < s->H; h++) {                                                                   \
        const int64_t *hd = s->heads + h * (2 + s->nL);                                                    \
        dst[h] = (T *)(intptr_t)table[2 * hd[0]] + b * table[2 * hd[0] + 1] + hd[1];                       \
    }                                                                                                       \
}                                                                                                           \
                                                                                                            \
/* the offsets of every read and head at the item coords[0:nL] */                                          \
static inline __attribute__((always_inline)) void item_offsets_##SUFFIX(const Step *s, const int64_t *coords, \
                                                                        int64_t *rbase, int64_t *hbase) {   \
    for (int64_t r = 0; r < s->R; r++) {                                                                   \
        const int64_t *rd = s->rd[r];                                                     \
        int64_t at = 0;                                                                                     \
        for (int64_t d = 0; d < s->nL; d++) at += rd[2 + d] * coords[d];                                   \
        rbase[r] = at;                                                                                      \
    }                                                                                                       \
    for (int64_t h = 0; h < s->H; h++) {                                                                   \
        const int64_t *hd = s->heads + h * (2 + s->nL);                                                    \
        int64_t at = 0;                                                                                     \
        for (int64_t d = 0; d < s->nL; d++) at += hd[2 + d] * coords[d];                                   \
        hbase[h] = at;                                                                                      \
    }                                                                                                       \
}                                                                                                           \
                                                                                                            \
/* w[0:inner], a row of instances' gradients along the last coordinate, added into the gradient gr of       \
 * read rd (positions from the item's base: looked up, strided, or one shared by the row) */                \
static inline __attribute__((always_inline)) void add_row_##SUFFIX(const Step *s, const int64_t *table, int64_t b, \
                                                                   const int64_t *rd, int64_t base, const int64_t *coords, \
                                                                   int64_t last, int64_t inner, const T *restrict w, \
                                                                   T *restrict gr) {                        \
    if (indexed(s, rd)) {                                                                                   \
        EACH_LOCATED(rd, coords, last, inner, gr[pos[j]] += w[c + j]);                                      \
        return;                                                                                             \
    }                                                                                                       \
    for (int64_t d = s->nL; d < last; d++) base += rd[2 + d] * coords[d];                                   \
    T *restrict gx = gr + base;                                                                             \
    const int64_t st = s->n > s->nL ? rd[2 + last] : 0;                                                     \
    if (st == 1) for (int64_t i = 0; i < inner; i++) gx[i] += w[i];                                         \
    else if (st == 0) { T a = 0; for (int64_t i = 0; i < inner; i++) a += w[i]; gx[0] += a; }               \
    else for (int64_t i = 0; i < inner; i++) gx[i * st] += w[i];                                            \
}                                                                                                           \
                                                                                                            \
static int empty_##SUFFIX(const Step *s) {                                                                 \
    for (int64_t d = 0; d < s->nL; d++) if (s->sizes[d] == 0) return 1;                                    \
    return 0;                                                                                               \
}                                                                                                           \
                                                                                                            \
/* steps without K (one instance per item: CTC's, a chain's unary terms), a row of items at a time    \
 * along the last L coordinate (no per-item bookkeeping) */                                          \
static inline __attribute__((always_inline)) void row_terms_##SUFFIX(const Step *s, const int64_t *table, int64_t b, T *const *src,         \
                                                                     const int64_t *at, int64_t *coords,    \
                                                                     int64_t inner, T *out) {               \
    const int64_t last = s->nL - 1;                                                                         \
    if (s->R == 0) for (int64_t i = 0; i < inner; i++) out[i] = 0;                                         \
    for (int64_t r = 0; r < s->R; r++) {                                                                   \
        if (indexed(s, s->rd[r])) {                                                                         \
            EACH_LOCATED(s->rd[r], coords, last, inner, out[c + j] = r == 0 ? src[r][pos[j]] : out[c + j] + src[r][pos[j]]); \
            continue;                                                                                       \
        }                                                                                                   \
        const T *restrict x = src[r] + at[r];                                                               \
        const int64_t st = s->rd[r][2 + last];                                            \
        if (r == 0 && st == 1) for (int64_t i = 0; i < inner; i++) out[i] = x[i];                          \
        else if (r == 0 && st == 0) { const T c = x[0]; for (int64_t i = 0; i < inner; i++) out[i] = c; }  \
        else if (r == 0) for (int64_t i = 0; i < inner; i++) out[i] = x[i * st];                           \
        else if (st == 1) for (int64_t i = 0; i < inner; i++) out[i] += x[i];                              \
        else if (st == 0) { const T c = x[0]; for (int64_t i = 0; i < inner; i++) out[i] += c; }           \
        else for (int64_t i = 0; i < inner; i++) out[i] += x[i * st];                                      \
    }                                                                                                       \
    if (s->M) {                                                                                             \
        for (int64_t i = 0; i < inner; i++) {                                                              \
            coords[last] = i;                                                                               \
            if (!holds(s, coords)) out[i] = -INFINITY;                                                     \
        }                                                                                                   \
        coords[last] = 0;                                                                                   \
    }                                                                                                       \
}                                                                                                           \
                                                                                                            \
/* a row of items v[0:inner] into every head, ⊕-ed into what is there where the step accumulates    \
 * (v padded to the vector width) */                                                                        \
static inline __attribute__((always_inline)) void write_row_##SUFFIX(const Step *s, T *const *dst,         \
                                                                     const int64_t *hbase, const T *v,      \
                                                                     int64_t inner) {                       \
    const int64_t last = s->nL - 1;                                                                         \
    for (int64_t h = 0; h < s->H; h++) {                                                                   \
        T *restrict y = dst[h] + hbase[h];                                                                  \
        const int64_t hs = s->heads[h * (2 + s->nL) + 2 + last];                                           \
        if (s->accumulate) logaddexp_row_##SUFFIX(y, hs, v, inner);                                        \
        else for (int64_t i = 0; i < inner; i++) y[i * hs] = v[i];                                         \
    }                                                                                                       \
}                                                                                                           \
                                                                                                            \
/* g[0:inner]: the gradient of a row of items, summed over the heads; whether any is nonzero */            \
static inline __attribute__((always_inline)) int grad_row_##SUFFIX(const Step *s, T *const *gdst,          \
                                                                   const int64_t *hbase, int64_t inner,     \
                                                                   T *g) {                                   \
    const int64_t last = s->nL - 1;                                                                         \
    for (int64_t i = 0; i < inner; i++) g[i] = 0;                                                          \
    for (int64_t h = 0; h < s->H; h++) {                                                                   \
        const T *restrict gy = gdst[h] + hbase[h];                                                          \
        const int64_t hs = s->heads[h * (2 + s->nL) + 2 + last];                                           \
        for (int64_t i = 0; i < inner; i++) g[i] += gy[i * hs];                                            \
    }                                                                                                       \
    int any = 0;                                                                                            \
    for (int64_t i = 0; i < inner; i++) any |= g[i] != 0;                                                  \
    return any;                                                                                             \
}                                                                                                           \
                                                                                                            \
static inline __attribute__((always_inline)) void forward_rows_##SUFFIX(const Step *s, const int64_t *table, int64_t b, T *const *src,      \
                                                                        T *const *dst, int64_t *rbase,      \
                                                                        int64_t *hbase, T *t, int none) {   \
    int64_t coords[MAXDIM];                                                                                 \
    const int64_t last = s->nL - 1, inner = s->sizes[last];                                                \
    memset(coords, 0, sizeof coords);                                                                       \
    do {                                                                                                    \
        item_offsets_##SUFFIX(s, coords, rbase, hbase);                                                     \
        if (none) for (int64_t i = 0; i < inner; i++) t[i] = -INFINITY;                                    \
        else row_terms_##SUFFIX(s, table, b, src, rbase, coords, inner, t);                                           \
        for (int64_t k = inner; k % LANES_##SUFFIX; k++) t[k] = -INFINITY;                                 \
        write_row_##SUFFIX(s, dst, hbase, t, inner);                                                        \
    } while (next(coords, s->sizes, 0, last));                                                              \
}                                                                                                           \
                                                                                                            \
/* the weights of a row of a step's items where several rules write them: g[i] <- exp(term_i - item_i) \
 * g[i] (0 where g[i] is 0; the terms recomputed into t, padded), item_i at item[i * is], clamped to the \
 * finite range as execute._softmax_weights does */                                                       \
static inline __attribute__((always_inline)) void weigh_row_##SUFFIX(const Step *s, const int64_t *table, int64_t b, \
                                                                     T *const *src, const int64_t *rbase,   \
                                                                     int64_t *coords, int64_t inner,        \
                                                                     const T *item, int64_t is, T *t, T *g) { \
    row_terms_##SUFFIX(s, table, b, src, rbase, coords, inner, t);                                          \
    for (int64_t i = 0; i < inner; i++) {                                                                  \
        T it = item[i * is];                                                                                \
        it = it < LOWEST ? LOWEST : it > -LOWEST ? -LOWEST : it;                                            \
        t[i] -= it;                                                                                         \
    }                                                                                                       \
    int64_t k = inner;                                                                                      \
    for (; k % LANES_##SUFFIX; k++) t[k] = -INFINITY;                                                      \
    for (k = 0; k < inner; k += LANES_##SUFFIX) store_##SUFFIX(t + k, exp_##SUFFIX(load_##SUFFIX(t + k)));  \
    for (int64_t i = 0; i < inner; i++) g[i] = g[i] == 0 ? 0 : t[i] * g[i];                                \
}                                                                                                           \
                                                                                                            \
/* g[0:inner], the gradients of a row of a step's instances (one per item), added into its reads'         \
 * gradients */                                                                                             \
static inline __attribute__((always_inline)) void add_grads_row_##SUFFIX(const Step *s, const int64_t *table, int64_t b, \
                                                                         T *const *gsrc, const int64_t *rbase, \
                                                                         int64_t *coords, int64_t inner,    \
                                                                         const T *g) {                      \
    const int64_t last = s->nL - 1;                                                                         \
    for (int64_t r = 0; r < s->R; r++) {                                                                   \
        if (indexed(s, s->rd[r])) {                                                                         \
            EACH_LOCATED(s->rd[r], coords, last, inner, gsrc[r][pos[j]] += g[c + j]);                       \
            continue;                                                                                       \
        }                                                                                                   \
        T *restrict gx = gsrc[r] + rbase[r];                                                                \
        const int64_t st = s->rd[r][2 + last];                                                              \
        if (st == 1) for (int64_t i = 0; i < inner; i++) gx[i] += g[i];                                    \
        else for (int64_t i = 0; i < inner; i++) gx[i * st] += g[i];                                       \
    }                                                                                                       \
}                                                                                                           \
                                                                                                            \
static inline __attribute__((always_inline)) void backward_rows_##SUFFIX(const Step *s, const int64_t *table, int64_t b, T *const *src,     \
                                                                         T *const *dst, T *const *gsrc,     \
                                                                         T *const *gdst, int64_t *rbase,    \
                                                                         int64_t *hbase, T *t) {            \
    int64_t coords[MAXDIM];                                                                                 \
    const int64_t last = s->nL - 1, inner = s->sizes[last];                                                \
    T *restrict g = t + PITCH(inner);                                                                       \
    memset(coords, 0, sizeof coords);                                                                       \
    do {                                                                                                    \
        item_offsets_##SUFFIX(s, coords, rbase, hbase);                                                     \
        if (!grad_row_##SUFFIX(s, gdst, hbase, inner, g)) continue;                                         \
        if (s->shared)                                                                                      \
            weigh_row_##SUFFIX(s, table, b, src, rbase, coords, inner, dst[0] + hbase[0], s->heads[2 + last], t, g); \
        add_grads_row_##SUFFIX(s, table, b, gsrc, rbase, coords, inner, g);                                 \
    } while (next(coords, s->sizes, 0, last));                                                              \
}                                                                                                           \
                                                                                                            \
/* steps with K, a row of items at a time along the last L coordinate: the terms of instance k of   \
 * item i at t[k * pitch + i] (-inf where masked and past the row), every K instance in order */         \
static inline __attribute__((always_inline)) void rowk_terms_##SUFFIX(const Step *s, const int64_t *table, int64_t b, T *const *src,        \
                                                                      const int64_t *rbase, int64_t *coords, \
                                                                      int64_t inner, int64_t pitch, T *t) { \
    int64_t at[MAXREADS];                                                                                   \
    for (int64_t d = s->nL; d < s->n; d++) coords[d] = 0;                                                  \
    int64_t k = 0;                                                                                          \
    do {                                                                                                    \
        for (int64_t r = 0; r < s->R; r++) {                                                               \
            const int64_t *rd = s->rd[r];                                                 \
            at[r] = rbase[r];                                                                               \
            for (int64_t d = s->nL; d < s->n; d++) at[r] += rd[2 + d] * coords[d];                         \
        }                                                                                                   \
        T *restrict out = t + k * pitch;                                                                    \
        row_terms_##SUFFIX(s, table, b, src, at, coords, inner, out);                                                 \
        for (int64_t i = inner; i < pitch; i++) out[i] = -INFINITY;                                        \
        k++;                                                                                                \
    } while (next(coords, s->sizes, s->nL, s->n));                                                          \
}                                                                                                           \
                                                                                                            \
static inline __attribute__((always_inline)) void forward_rowk_##SUFFIX(const Step *s, const int64_t *table, int64_t b, T *const *src,      \
                                                                        T *const *dst, int64_t *rbase,      \
                                                                        int64_t *hbase, T *t) {             \
    int64_t coords[MAXDIM];                                                                                 \
    const int64_t last = s->nL - 1, inner = s->sizes[last], pitch = PITCH(inner), K = s->K;                \
    T *restrict v = t + K * pitch;                                                                          \
    memset(coords, 0, sizeof coords);                                                                       \
    do {                                                                                                    \
        item_offsets_##SUFFIX(s, coords, rbase, hbase);                                                     \
        rowk_terms_##SUFFIX(s, table, b, src, rbase, coords, inner, pitch, t);                                        \
        for (int64_t c = 0; c < pitch; c += LANES_##SUFFIX) {                                               \
            V m = load_##SUFFIX(t + c);                                                                     \
            for (int64_t k = 1; k < K; k++) {                                                               \
                V x = load_##SUFFIX(t + k * pitch + c);                                                     \
                VI gt = x > m;                                                                              \
                m = (V)(((VI)x & gt) | ((VI)m & ~gt));                                                     \
            }                                                                                               \
            const V lo = (V){0} + LOWEST, hi = (V){0} - LOWEST;                                             \
            VI below = m < lo, above = m > hi; /* (NaN stays: compares are false) */                        \
            m = (V)(((VI)lo & below) | ((VI)m & ~below));                                                   \
            m = (V)(((VI)hi & above) | ((VI)m & ~above));                                                   \
            V sum = {0};                                                                                    \
            for (int64_t k = 0; k < K; k++) sum += exp_##SUFFIX(load_##SUFFIX(t + k * pitch + c) - m);     \
            for (int i = 0; i < LANES_##SUFFIX; i++) v[c + i] = LOG(sum[i]) + m[i];                         \
        }                                                                                                   \
        write_row_##SUFFIX(s, dst, hbase, v, inner);                                                        \
    } while (next(coords, s->sizes, 0, last));                                                              \
}                                                                                                           \
                                                                                                            \
static inline __attribute__((always_inline)) void backward_rowk_##SUFFIX(const Step *s, const int64_t *table, int64_t b, T *const *src,     \
                                                                         T *const *dst, T *const *gsrc,     \
                                                                         T *const *gdst, int64_t *rbase,    \
                                                                         int64_t *hbase, T *t) {            \
    int64_t coords[MAXDIM];                                                                                 \
    const int64_t last = s->nL - 1, inner = s->sizes[last], pitch = PITCH(inner), K = s->K;                \
    T *restrict g = t + K * pitch, *restrict item = g + pitch;                                              \
    memset(coords, 0, sizeof coords);                                                                       \
    do {                                                                                                    \
        item_offsets_##SUFFIX(s, coords, rbase, hbase);                                                     \
        for (int64_t i = inner; i < pitch; i++) g[i] = 0;                                                  \
        if (!grad_row_##SUFFIX(s, gdst, hbase, inner, g)) continue;                                         \
        rowk_terms_##SUFFIX(s, table, b, src, rbase, coords, inner, pitch, t);                                        \
        const T *restrict y = dst[0] + hbase[0];                                                            \
        const int64_t hs = s->heads[2 + last];                                                              \
        for (int64_t i = 0; i < pitch; i++) {                                                              \
            T it = i < inner ? y[i * hs] : 0;                                                               \
            item[i] = it < LOWEST ? LOWEST : it > -LOWEST ? -LOWEST : it;                                   \
        }                                                                                                   \
        for (int64_t c = 0; c < pitch; c += LANES_##SUFFIX) {                                               \
            const V gc = load_##SUFFIX(g + c), ic = load_##SUFFIX(item + c);                                \
            const VI zero = gc == (V){0};                                                                   \
            for (int64_t k = 0; k < K; k++) {                                                               \
                V w = exp_##SUFFIX(load_##SUFFIX(t + k * pitch + c) - ic) * gc;                             \
                store_##SUFFIX(t + k * pitch + c, (V)((VI)w & ~zero));                                      \
            }                                                                                               \
        }                                                                                                   \
        for (int64_t d = s->nL; d < s->n; d++) coords[d] = 0;                                              \
        int64_t k = 0;                                                                                      \
        do {                                                                                                \
            const T *restrict w = t + k * pitch;                                                            \
            for (int64_t r = 0; r < s->R; r++) {                                                           \
                const int64_t *rd = s->rd[r];                                             \
                if (indexed(s, rd)) {                                                                       \
                    EACH_LOCATED(rd, coords, last, inner, gsrc[r][pos[j]] += w[c + j]);                     \
                    continue;                                                                               \
                }                                                                                           \
                int64_t at = rbase[r];                                                                      \
                for (int64_t d = s->nL; d < s->n; d++) at += rd[2 + d] * coords[d];                        \
                T *restrict gx = gsrc[r] + at;                                                              \
                const int64_t st = rd[2 + last];                                                            \
                if (st == 1) for (int64_t i = 0; i < inner; i++) gx[i] += w[i];                            \
                else if (st == 0) { T a = 0; for (int64_t i = 0; i < inner; i++) a += w[i]; gx[0] += a; }  \
                else for (int64_t i = 0; i < inner; i++) gx[i * st] += w[i];                               \
            }                                                                                               \
            k++;                                                                                            \
        } while (next(coords, s->sizes, s->nL, s->n));                                                      \
    } while (next(coords, s->sizes, 0, last));                                                              \
}
/* a level's steps over examples [b0, b1), compiled for one instruction set (ISA: a name suffix, TARGET its attribute) */
#define STEPS(T, V, VI, SUFFIX, LOWEST, ISA, TARGET)                                                        \
/* a group's backward (grouped()): each item's gradient and value read once into rows, then each step's  \
 * weights and their adds as backward_rows' */                                                              \
TARGET static void backward_group_##SUFFIX##ISA(const Step *g, int64_t n, int64_t lo, int64_t width, int64_t b0, \
                                                int64_t b1, const int64_t *table, const int64_t *gtable, T *t, \
                                                T **src, T **dst, T **gsrc, T **gdst, int64_t *rbase,       \
                                                int64_t *hbase) {                                           \
    int64_t coords[MAXDIM];                                                                                 \
    const int64_t hs = g[0].heads[2], pitch = PITCH(width), head = g[0].heads[0];                          \
    T *restrict w = t + pitch, *restrict gr = w + pitch, *restrict item = gr + pitch;                       \
    memset(coords, 0, sizeof coords);                                                                       \
    for (int64_t b = b0; b < b1; b++) {                                                                     \
        const int64_t at0 = g[0].heads[1] + lo * hs;                                                        \
        const T *y = (T *)(intptr_t)table[2 * head] + b * table[2 * head + 1] + at0;                        \
        const T *gy = (T *)(intptr_t)gtable[2 * head] + b * gtable[2 * head + 1] + at0;                     \
        int any = 0;                                                                                        \
        for (int64_t i = 0; i < width; i++) {                                                              \
            gr[i] = gy[i * hs];                                                                             \
            any |= gr[i] != 0;                                                                              \
        }                                                                                                   \
        if (!any) continue;                                                                                 \
        for (int64_t i = 0; i < width; i++) item[i] = y[i * hs];                                           \
        for (int64_t k = 0; k < n; k++) {                                                                   \
            const Step *s = g + k;                                                                          \
            const int64_t inner = s->sizes[0], at = (s->heads[1] - g[0].heads[1]) / hs - lo;               \
            if (!inner) continue;                                                                           \
            place_##SUFFIX(s, table, b, src, dst);                                                          \
            place_##SUFFIX(s, gtable, b, gsrc, gdst);                                                       \
            item_offsets_##SUFFIX(s, coords, rbase, hbase);                                                 \
            memcpy(w, gr + at, sizeof(T) * inner);                                                          \
            weigh_row_##SUFFIX(s, table, b, src, rbase, coords, inner, item + at, 1, t, w);                 \
            add_grads_row_##SUFFIX(s, table, b, gsrc, rbase, coords, inner, w);                             \
        }                                                                                                   \
    }                                                                                                       \
}                                                                                                           \
                                                                                                            \
TARGET static void forward_step_##SUFFIX##ISA(const Step *s, int64_t b0, int64_t b1, const int64_t *table, T *t,      \
                                                T **src, T **dst, int64_t *rbase, int64_t *hbase) {         \
    int64_t coords[MAXDIM];                                                                                 \
    const int way = path(s, RUN_LOG);                                                                                \
    if (empty_##SUFFIX(s)) return;                                                                          \
    for (int64_t b = b0; b < b1; b++) {                                                                       \
        place_##SUFFIX(s, table, b, src, dst);                                                              \
        if (way == 1 || (way == 2 && !s->K)) { /* (an empty K: the rows of -inf the row path writes) */    \
            forward_rows_##SUFFIX(s, table, b, src, dst, rbase, hbase, t, !s->K);                                     \
            continue;                                                                                       \
        }                                                                                                   \
        if (way == 2) {                                                                                     \
            forward_rowk_##SUFFIX(s, table, b, src, dst, rbase, hbase, t);                                            \
            continue;                                                                                       \
        }                                                                                                   \
        memset(coords, 0, sizeof coords);                                                                   \
        do {                                                                                                \
            item_offsets_##SUFFIX(s, coords, rbase, hbase);                                                 \
            T v = -INFINITY; /* (an empty K: no instance) */                                                \
            if (s->K) {                                                                                     \
                terms_##SUFFIX(s, table, b, src, rbase, coords, t);                                                   \
                v = s->n == s->nL ? t[0] : logsumexp_##SUFFIX(t, s->K);                                     \
            }                                                                                               \
            for (int64_t h = 0; h < s->H; h++) {                                                           \
                T *y = dst[h] + hbase[h];                                                                   \
                *y = s->accumulate ? logaddexp_##SUFFIX(*y, v) : v;                                         \
            }                                                                                               \
        } while (next(coords, s->sizes, 0, s->nL));                                                         \
    }                                                                                                       \
}                                                                                                           \
                                                                                                            \
TARGET static void backward_step_##SUFFIX##ISA(const Step *s, int64_t b0, int64_t b1, const int64_t *table,           \
                                                 const int64_t *gtable, T *t, T **src, T **dst,             \
                                                 T **gsrc, T **gdst, int64_t *rbase, int64_t *hbase) {      \
    int64_t coords[MAXDIM];                                                                                 \
    const int pass = s->n == s->nL && !s->shared; /* one instance per item: its gradient passes */         \
    const int way = path(s, RUN_LOG);                                                                                \
    if (empty_##SUFFIX(s)) return;                                                                          \
    for (int64_t b = b0; b < b1; b++) {                                                                       \
        place_##SUFFIX(s, table, b, src, dst);                                                              \
        place_##SUFFIX(s, gtable, b, gsrc, gdst);                                                           \
        if (way == 1) {                                                                                     \
            backward_rows_##SUFFIX(s, table, b, src, dst, gsrc, gdst, rbase, hbase, t);                               \
            continue;                                                                                       \
        }                                                                                                   \
        if (way == 2) {                                                                                     \
            if (s->K) backward_rowk_##SUFFIX(s, table, b, src, dst, gsrc, gdst, rbase, hbase, t);                     \
            continue;                                                                                       \
        }                                                                                                   \
        memset(coords, 0, sizeof coords);                                                                   \
        do {                                                                                                \
            item_offsets_##SUFFIX(s, coords, rbase, hbase);                                                 \
            T g = 0;                                                                                        \
            for (int64_t h = 0; h < s->H; h++) g += gdst[h][hbase[h]];                                     \
            if (g == 0 || s->K == 0) continue; /* (exp(.) * 0 is 0 for every finite weight) */             \
            if (pass) {                                                                                     \
                t[0] = g;                                                                                   \
            } else {                                                                                        \
                terms_##SUFFIX(s, table, b, src, rbase, coords, t);                                                   \
                T item = dst[0][hbase[0]];                                                                  \
                if (item < LOWEST) item = LOWEST;                                                           \
                if (item > -LOWEST) item = -LOWEST;                                                         \
                for (int64_t k = 0; k < s->K; k += LANES_##SUFFIX)                                          \
                    store_##SUFFIX(t + k, exp_##SUFFIX(load_##SUFFIX(t + k) - item) * g);                   \
            }                                                                                               \
            for (int64_t d = s->nL; d < s->n; d++) coords[d] = 0;                                          \
            const int64_t last = s->n - 1, inner = s->n > s->nL ? s->sizes[last] : 1;                      \
            int64_t k = 0;                                                                                  \
            do {                                                                                            \
                const T *restrict w = t + k;                                                                \
                for (int64_t r = 0; r < s->R; r++)                                                          \
                    add_row_##SUFFIX(s, table, b, s->rd[r], rbase[r], coords, last, inner, w, gsrc[r]);     \
                k += inner;                                                                                 \
            } while (s->n - 1 > s->nL && next(coords, s->sizes, s->nL, last));                            \
            for (int64_t d = s->nL; d < s->n; d++) coords[d] = 0;                                          \
        } while (next(coords, s->sizes, 0, s->nL));                                                         \
    }                                                                                                       \
}                                                                                                           \
                                                                                                            \
/* Log on pairs: the terms t[0:K] and their tangents tau (0 where a term is -inf: masked, or of weight    \
 * 0), each padded to the vector width */                                                                   \
TARGET static void pair_terms_##SUFFIX##ISA(const Step *s, const int64_t *table, int64_t b, T *const *src,  \
                                            T *const *tsrc, const int64_t *base, int64_t *coords, T *t, T *tau) { \
    terms_##SUFFIX(s, table, b, src, base, coords, t);                                                     \
    terms_##SUFFIX(s, table, b, tsrc, base, coords, tau);                                                  \
    for (int64_t k = 0; k < s->K; k++) if (t[k] == -INFINITY) tau[k] = 0;                                  \
    for (int64_t k = s->K; k % LANES_##SUFFIX; k++) tau[k] = 0;                                            \
}                                                                                                           \
                                                                                                            \
TARGET static void pair_forward_step_##SUFFIX##ISA(const Step *s, int64_t b0, int64_t b1, const int64_t *table, \
                                                   int64_t S, T *t, T **src, T **dst, T **tsrc, T **tdst,  \
                                                   int64_t *rbase, int64_t *hbase) {                        \
    int64_t coords[MAXDIM];                                                                                 \
    T *tau = t + PAIR_PAD(s->K);                                                                            \
    if (empty_##SUFFIX(s)) return;                                                                          \
    for (int64_t b = b0; b < b1; b++) {                                                                     \
        place_##SUFFIX(s, table, b, src, dst);                                                              \
        place_##SUFFIX(s, table + 2 * S, b, tsrc, tdst);                                                    \
        memset(coords, 0, sizeof coords);                                                                   \
        do {                                                                                                \
            item_offsets_##SUFFIX(s, coords, rbase, hbase);                                                 \
            T v = -INFINITY, dv = 0; /* (an empty K: no instance) */                                        \
            if (s->K) {                                                                                     \
                pair_terms_##SUFFIX##ISA(s, table, b, src, tsrc, rbase, coords, t, tau);                    \
                if (s->n == s->nL) {                                                                        \
                    v = t[0];                                                                               \
                    dv = tau[0];                                                                            \
                } else {                                                                                    \
                    T m = LOWEST, z = 0, w = 0;                                                             \
                    for (int64_t k = 0; k < s->K; k++) m = t[k] > m ? t[k] : m;                             \
                    m = m > -LOWEST ? -LOWEST : m;                                                          \
                    for (int64_t k = 0; k < s->K; k += LANES_##SUFFIX)                                      \
                        store_##SUFFIX(t + k, exp_##SUFFIX(load_##SUFFIX(t + k) - m));                      \
                    for (int64_t k = 0; k < s->K; k++) {                                                    \
                        z += t[k];                                                                          \
                        w += t[k] * tau[k];                                                                 \
                    }                                                                                       \
                    v = log_s_##SUFFIX(z) + m;                                                               \
                    dv = w / (z < 1 ? 1 : z); /* (z >= 1 where any term is finite) */                       \
                }                                                                                           \
            }                                                                                               \
            for (int64_t h = 0; h < s->H; h++) {                                                            \
                T *y = dst[h] + hbase[h], *ty = tdst[h] + hbase[h];                                         \
                if (s->accumulate) { /* (y, ty) ⊕ (v, dv) */                                                \
                    T m = *y > v ? *y : v;                                                                  \
                    m = m < LOWEST ? LOWEST : m > -LOWEST ? -LOWEST : m;                                    \
                    const T pa = exp_s_##SUFFIX(*y - m), pb = exp_s_##SUFFIX(v - m), z = pa + pb;           \
                    *ty = (pa * *ty + pb * dv) / (z < 1 ? 1 : z);                                           \
                    *y = log_s_##SUFFIX(z) + m;                                                              \
                } else {                                                                                    \
                    *y = v;                                                                                 \
                    *ty = dv;                                                                               \
                }                                                                                           \
            }                                                                                               \
        } while (next(coords, s->sizes, 0, s->nL));                                                         \
    }                                                                                                       \
}                                                                                                           \
                                                                                                            \
TARGET static void pair_backward_step_##SUFFIX##ISA(const Step *s, int64_t b0, int64_t b1, const int64_t *table, \
                                                    const int64_t *gtable, int64_t S, T *t, T **src, T **dst, \
                                                    T **tsrc, T **tdst, T **gsrc, T **gdst, T **gtsrc,      \
                                                    T **gtdst, int64_t *rbase, int64_t *hbase) {            \
    int64_t coords[MAXDIM];                                                                                 \
    const int pass = s->n == s->nL && !s->shared; /* one instance per item: its gradient passes */         \
    T *tau = t + PAIR_PAD(s->K);                                                                            \
    if (empty_##SUFFIX(s) || !s->R || !s->K) return;                                                        \
    for (int64_t b = b0; b < b1; b++) {                                                                     \
        place_##SUFFIX(s, table, b, src, dst);                                                              \
        place_##SUFFIX(s, table + 2 * S, b, tsrc, tdst);                                                    \
        place_##SUFFIX(s, gtable, b, gsrc, gdst);                                                           \
        place_##SUFFIX(s, gtable + 2 * S, b, gtsrc, gtdst);                                                 \
        memset(coords, 0, sizeof coords);                                                                   \
        do {                                                                                                \
            item_offsets_##SUFFIX(s, coords, rbase, hbase);                                                 \
            T g = 0, dg = 0;                                                                                \
            for (int64_t h = 0; h < s->H; h++) {                                                            \
                g += gdst[h][hbase[h]];                                                                     \
                dg += gtdst[h][hbase[h]];                                                                   \
            }                                                                                               \
            if (g == 0 && dg == 0) continue;                                                                \
            if (pass) {                                                                                     \
                t[0] = g;                                                                                   \
                tau[0] = dg;                                                                                \
            } else {                                                                                        \
                pair_terms_##SUFFIX##ISA(s, table, b, src, tsrc, rbase, coords, t, tau);                    \
                T a = dst[0][hbase[0]];                                                                     \
                a = a < LOWEST ? LOWEST : a > -LOWEST ? -LOWEST : a;                                        \
                const T da = tdst[0][hbase[0]];                                                             \
                for (int64_t k = 0; k < s->K; k += LANES_##SUFFIX)                                          \
                    store_##SUFFIX(t + k, exp_##SUFFIX(load_##SUFFIX(t + k) - a));                          \
                for (int64_t k = 0; k < s->K; k++) {                                                        \
                    tau[k] = t[k] * (dg + g * (tau[k] - da));                                               \
                    t[k] *= g;                                                                              \
                }                                                                                           \
            }                                                                                               \
            for (int64_t d = s->nL; d < s->n; d++) coords[d] = 0;                                           \
            const int64_t last = s->n - 1, inner = s->n > s->nL ? s->sizes[last] : 1;                       \
            int64_t k = 0;                                                                                  \
            do {                                                                                            \
                for (int64_t r = 0; r < s->R; r++) { /* the gradient, then its tangent */                   \
                    add_row_##SUFFIX(s, table, b, s->rd[r], rbase[r], coords, last, inner, t + k, gsrc[r]); \
                    add_row_##SUFFIX(s, table, b, s->rd[r], rbase[r], coords, last, inner, tau + k, gtsrc[r]); \
                }                                                                                           \
                k += inner;                                                                                 \
            } while (s->n - 1 > s->nL && next(coords, s->sizes, s->nL, last));                             \
            for (int64_t d = s->nL; d < s->n; d++) coords[d] = 0;                                           \
        } while (next(coords, s->sizes, 0, s->nL));                                                         \
    }                                                                                                       \
}


/* The Max semiring, item by item: an item is the max of its terms; the backward routes g to the
 * first instance reaching the max (torch.max's), and where several rules write the item, only from
 * a rule whose max is the item, the first such in program order taking it (its heads' gradients are
 * then zeroed: execute._argmax_weights and _claim). NaN propagates, as torch.amax. */
#define MAX_KERNELS(T, V, VI, SUFFIX)                                                                              \
static int64_t best_##SUFFIX(const T *t, int64_t K, T *best) {                                             \
    int64_t kb = 0;                                                                                         \
    T b = t[0];                                                                                             \
    if (b != b) { *best = b; return 0; }                                                                   \
    for (int64_t k = 1; k < K; k++) {                                                                       \
        if (t[k] != t[k]) { *best = t[k]; return k; }                                                      \
        if (t[k] > b) { b = t[k]; kb = k; }                                                                \
    }                                                                                                       \
    *best = b;                                                                                              \
    return kb;                                                                                              \
}                                                                                                           \
                                                                                                            \
/* the best of each item of a row (lanes = items, scratch as rowk_terms) and, where kb, its first     \
 * instance reaching it */                                                                                  \
static inline __attribute__((always_inline)) void row_best_##SUFFIX(const T *t, int64_t K, int64_t pitch,   \
                                                                    T *best, T *kb) {                        \
    for (int64_t c = 0; c < pitch; c += LANES_##SUFFIX) {                                                   \
        V m = load_##SUFFIX(t + c);                                                                         \
        VI at = {0};                                                                                        \
        for (int64_t k = 1; k < K; k++) {                                                                   \
            V x = load_##SUFFIX(t + k * pitch + c);                                                         \
            VI take = (x > m) | ((x != x) & (m == m)); /* (a NaN wins, the first one) */                    \
            m = (V)(((VI)x & take) | ((VI)m & ~take));                                                      \
            at = (((VI){0} + (__typeof__(at[0]))k) & take) | (at & ~take);                                  \
        }                                                                                                   \
        store_##SUFFIX(best + c, m);                                                                        \
        if (kb) memcpy(kb + c, &at, sizeof at);                                                             \
    }                                                                                                       \
}                                                                                                           \
                                                                                                            \
static inline __attribute__((always_inline)) void max_forward_rowk_##SUFFIX(const Step *s, const int64_t *table, int64_t b, T *const *src, T *const *dst, int64_t *rbase,          \
                                      int64_t *hbase, T *t) {                                               \
    int64_t coords[MAXDIM];                                                                                 \
    const int64_t last = s->nL - 1, inner = s->sizes[last], pitch = PITCH(inner), K = s->K;                \
    T *restrict v = t + K * pitch;                                                                          \
    memset(coords, 0, sizeof coords);                                                                       \
    do {                                                                                                    \
        item_offsets_##SUFFIX(s, coords, rbase, hbase);                                                     \
        if (K) {                                                                                            \
            rowk_terms_##SUFFIX(s, table, b, src, rbase, coords, inner, pitch, t);                                    \
            row_best_##SUFFIX(t, K, pitch, v, NULL);                                                        \
        } else {                                                                                            \
            for (int64_t i = 0; i < inner; i++) v[i] = -INFINITY;                                          \
        }                                                                                                   \
        for (int64_t h = 0; h < s->H; h++) {                                                               \
            T *restrict y = dst[h] + hbase[h];                                                              \
            const int64_t hs = s->heads[h * (2 + s->nL) + 2 + last];                                       \
            for (int64_t i = 0; i < inner; i++) {                                                          \
                const T a = y[i * hs], b = v[i];                                                            \
                y[i * hs] = !s->accumulate || b != b || (a == a && b > a) ? b : a;                          \
            }                                                                                               \
        }                                                                                                   \
    } while (next(coords, s->sizes, 0, last));                                                              \
}                                                                                                           \
                                                                                                            \
static inline __attribute__((always_inline)) void max_backward_rowk_##SUFFIX(const Step *s, const int64_t *table, int64_t b, T *const *src, T *const *dst, T *const *gsrc,        \
                                       T *const *gdst, int64_t *rbase, int64_t *hbase, T *t) {              \
    int64_t coords[MAXDIM];                                                                                 \
    const int64_t last = s->nL - 1, inner = s->sizes[last], pitch = PITCH(inner), K = s->K;                \
    T *restrict g = t + K * pitch, *restrict best = g + pitch, *restrict kb = best + pitch;                 \
    if (!K) return;                                                                                         \
    memset(coords, 0, sizeof coords);                                                                       \
    do {                                                                                                    \
        item_offsets_##SUFFIX(s, coords, rbase, hbase);                                                     \
        if (!grad_row_##SUFFIX(s, gdst, hbase, inner, g)) continue;                                         \
        rowk_terms_##SUFFIX(s, table, b, src, rbase, coords, inner, pitch, t);                                        \
        row_best_##SUFFIX(t, K, pitch, best, kb);                                                           \
        int64_t kcoords[MAXDIM];                                                                            \
        for (int64_t i = 0; i < inner; i++) {                                                              \
            if (g[i] == 0) continue;                                                                        \
            if (s->shared) {                                                                                \
                if (!(best[i] == dst[0][hbase[0] + i * s->heads[2 + last]])) continue;                     \
                for (int64_t h = 0; h < s->H; h++) gdst[h][hbase[h] + i * s->heads[h * (2 + s->nL) + 2 + last]] = 0; \
            }                                                                                               \
            VI lane;                                                                                        \
            memcpy(&lane, kb + i / LANES_##SUFFIX * LANES_##SUFFIX, sizeof lane);                          \
            int64_t k = lane[i % LANES_##SUFFIX];                                                           \
            for (int64_t d = s->n - 1; d >= s->nL; d--) { kcoords[d] = k % s->sizes[d]; k /= s->sizes[d]; } \
            for (int64_t d = 0; d < s->nL; d++) kcoords[d] = d == last ? i : coords[d];                    \
            for (int64_t r = 0; r < s->R; r++) {                                                           \
                const int64_t *rd = s->rd[r];                                             \
                int64_t at = rbase[r] + i * rd[2 + last];                                                   \
                for (int64_t d = s->nL; d < s->n; d++) at += rd[2 + d] * kcoords[d];                       \
                gsrc[r][indexed(s, rd) ? located(s, rd, table, b, kcoords) : at] += g[i];           \
            }                                                                                               \
        }                                                                                                   \
    } while (next(coords, s->sizes, 0, last));                                                              \
}
/* the Max semiring's steps over examples [b0, b1), compiled for one instruction set (as STEPS) */
#define MAX_STEPS(T, SUFFIX, ISA, TARGET)                                                                 \
TARGET static void max_forward_step_##SUFFIX##ISA(const Step *s, int64_t b0, int64_t b1, const int64_t *table, T *t,                \
                                      T **src, T **dst, int64_t *rbase, int64_t *hbase) {                   \
    int64_t coords[MAXDIM];                                                                                 \
    if (empty_##SUFFIX(s)) return;                                                                          \
    for (int64_t b = b0; b < b1; b++) {                                                                       \
        place_##SUFFIX(s, table, b, src, dst);                                                              \
        if (path(s, RUN_MAX)) {                                                                                   \
            max_forward_rowk_##SUFFIX(s, table, b, src, dst, rbase, hbase, t);                                        \
            continue;                                                                                       \
        }                                                                                                   \
        memset(coords, 0, sizeof coords);                                                                   \
        do {                                                                                                \
            item_offsets_##SUFFIX(s, coords, rbase, hbase);                                                 \
            T v = -INFINITY;                                                                                \
            if (s->K) {                                                                                     \
                terms_##SUFFIX(s, table, b, src, rbase, coords, t);                                                   \
                best_##SUFFIX(t, s->K, &v);                                                                 \
            }                                                                                               \
            for (int64_t h = 0; h < s->H; h++) {                                                           \
                T *y = dst[h] + hbase[h];                                                                   \
                if (!s->accumulate || v != v) *y = v;                                                       \
                else if (*y == *y && v > *y) *y = v;                                                       \
            }                                                                                               \
        } while (next(coords, s->sizes, 0, s->nL));                                                         \
    }                                                                                                       \
}                                                                                                           \
                                                                                                            \
TARGET static void max_backward_step_##SUFFIX##ISA(const Step *s, int64_t b0, int64_t b1, const int64_t *table,                     \
                                       const int64_t *gtable, T *t, T **src, T **dst, T **gsrc, T **gdst,   \
                                       int64_t *rbase, int64_t *hbase) {                                    \
    int64_t coords[MAXDIM];                                                                                 \
    if (empty_##SUFFIX(s)) return;                                                                          \
    for (int64_t b = b0; b < b1; b++) {                                                                       \
        place_##SUFFIX(s, table, b, src, dst);                                                              \
        place_##SUFFIX(s, gtable, b, gsrc, gdst);                                                           \
        if (path(s, RUN_MAX)) {                                                                                   \
            max_backward_rowk_##SUFFIX(s, table, b, src, dst, gsrc, gdst, rbase, hbase, t);                           \
            continue;                                                                                       \
        }                                                                                                   \
        memset(coords, 0, sizeof coords);                                                                   \
        do {                                                                                                \
            item_offsets_##SUFFIX(s, coords, rbase, hbase);                                                 \
            T g = 0;                                                                                        \
            for (int64_t h = 0; h < s->H; h++) g += gdst[h][hbase[h]];                                     \
            if (g == 0 || s->K == 0) continue;                                                              \
            terms_##SUFFIX(s, table, b, src, rbase, coords, t);                                                       \
            T best;                                                                                         \
            int64_t kb = best_##SUFFIX(t, s->K, &best);                                                     \
            if (s->shared) {                                                                                \
                if (!(best == dst[0][hbase[0]])) continue; /* another rule reached the item */             \
                for (int64_t h = 0; h < s->H; h++) gdst[h][hbase[h]] = 0; /* claimed */                    \
            }                                                                                               \
            for (int64_t d = s->n - 1; d >= s->nL; d--) { coords[d] = kb % s->sizes[d]; kb /= s->sizes[d]; } \
            for (int64_t r = 0; r < s->R; r++) {                                                           \
                const int64_t *rd = s->rd[r];                                             \
                int64_t at = rbase[r];                                                                      \
                for (int64_t d = s->nL; d < s->n; d++) at += rd[2 + d] * coords[d];                        \
                gsrc[r][indexed(s, rd) ? located(s, rd, table, b, coords) : at] += g;                   \
            }                                                                                               \
            for (int64_t d = s->nL; d < s->n; d++) coords[d] = 0;                                          \
        } while (next(coords, s->sizes, 0, s->nL));                                                         \
    }                                                                                                       \
}

KERNELS(double, vd, vid, f64, -DBL_MAX, log, log1p, exp)
KERNELS(float, vf, vif, f32, -FLT_MAX, logf, log1pf, expf)
MAX_KERNELS(double, vd, vid, f64)
MAX_KERNELS(float, vf, vif, f32)

/* Log on pairs (value, tangent), item by item (a Hessian-vector product's passes, execute._DUAL's
 * arithmetic): an item of terms t_k with tangents τ_k is (log Σ e^t_k, Σ p_k τ_k), p = softmax(t); the
 * gradient g (tangent γ) of an item a (tangent α) reaches its instances as w_k = e^(t_k - a) g, with
 * tangent e^(t_k - a) (γ + g (τ_k - α)). The tangents of a buffer are its own buffer: table rows
 * S..2S-1 (the grads table's likewise) hold them, for the sources of rows 0..S-1. */


/* every step function for one instruction set (../_vector.h) */
#define ALL_STEPS(ISA, TARGET)                                \
    STEPS(double, vd, vid, f64, -DBL_MAX, ISA, TARGET)        \
    STEPS(float, vf, vif, f32, -FLT_MAX, ISA, TARGET)         \
    MAX_STEPS(double, f64, ISA, TARGET)                       \
    MAX_STEPS(float, f32, ISA, TARGET)
ALL_STEPS(_base, )
#if ISAS_X86
ALL_STEPS(_avx2, AVX2)
ALL_STEPS(_avx512, AVX512)
#endif

/* A level's facts for running it: its steps' count, scratch sizes (the largest need() and R/H), its
 * instances per example, and whether a buffer it writes is shared by the batch (batch stride 0: the
 * gradient of an input every example reads) */
typedef struct {
    int64_t count, room, maxRH, work;
    int shared_writes;
} Level;

/* whether buffer src of table is one for the whole batch */
static inline int batch_shared(const int64_t *table, int64_t src) { return table[2 * src + 1] == 0; }

/* the level at p (len numbers); returns 0 on a bad descriptor. Writes are the heads (forward: in
 * table) or every read's and head's gradient (backward: in gtable) */
static int scan_level(const int64_t *p, Py_ssize_t len, int mode, const int64_t *table, const int64_t *gtable, Level *lv) {
    const int64_t *end = p + len;
    if (len < 1) return 0;
    lv->count = *p++;
    lv->room = 16; lv->maxRH = 1; lv->work = 0; lv->shared_writes = 0;
    for (int64_t i = 0; i < lv->count; i++) {
        Step s;
        const int64_t *start = p;
        p = parse(p, end, &s);
        if (!p || p > end || !check(&s)) return 0;
        if (need(&s, mode) > lv->room) lv->room = need(&s, mode);
        Step g[GROUP_MAX];
        int64_t lo, width;
        const int64_t *after;
        if (gtable && grouped(start, end, lv->count - i, mode, g, &lo, &width, &after) > 1 && group_need(width) > lv->room)
            lv->room = group_need(width);
        if (s.R > lv->maxRH) lv->maxRH = s.R;
        if (s.H > lv->maxRH) lv->maxRH = s.H;
        int64_t instances = 1;
        for (int64_t d = 0; d < s.n; d++) instances *= s.sizes[d];
        lv->work += instances;
        const int64_t *writes = gtable ? gtable : table;
        for (int64_t h = 0; h < s.H; h++) lv->shared_writes |= batch_shared(writes, s.heads[h * (2 + s.nL)]);
        for (int64_t r = 0; gtable && r < s.R; r++) lv->shared_writes |= batch_shared(gtable, s.rd[r][0]);
    }
    return p == end;
}

#define LINE 64 /* bytes of a cache line */
#define LINES(bytes) (((bytes) + LINE - 1) / LINE * LINE)
#define GRAIN 16384 /* instances a thread is worth (waking a worker costs a few microseconds) */
#define PARTS 4       /* parts per thread: a thread that falls behind (a loaded machine) holds little */

/* A part's share of the buffers (its examples' rows of every buffer the run's table names) is kept
 * within this many bytes where the batch allows: its examples then go through every level of the
 * run while their items are in cache, where a run over the whole batch would evict each level's
 * items before the next level reads them (alignment's anti-diagonals touch a cache line per item) */
static int64_t part_bytes = 1 << 19;

/* how many threads run the level (at most `threads`): examples are split across them, so one
 * where a buffer shared by the batch is written (its sums would depend on the split) */
static int64_t threads_for(const Level *lv, int64_t B, int64_t threads) {
    if (lv->shared_writes) return 1;
    int64_t most = B * lv->work / GRAIN;
    if (threads > most) threads = most;
    if (threads > B) threads = B;
    return threads < 1 ? 1 : threads;
}

/* examples [b0, b1) of the level's steps, in order (scratch: t, ptrs, offs as run() sizes them), with
 * the step functions of one instruction set */
typedef void Examples(const int64_t *p, const int64_t *end, const Level *lv, int mode, int backward, int is_double,
                      int64_t b0, int64_t b1, const int64_t *tab, const int64_t *gtab, int64_t S, void *t, void **ptrs,
                      int64_t *offs);

#define EXAMPLES(ISA)                                                                                             \
static void examples##ISA(const int64_t *p, const int64_t *end, const Level *lv, int mode, int backward,          \
                          int is_double, int64_t b0, int64_t b1, const int64_t *tab, const int64_t *gtab, int64_t S,\
                          void *t, void **ptrs, int64_t *offs) {                                                  \
    const int64_t m = lv->maxRH;                                                                                  \
    const int max = mode == RUN_MAX;                                                                              \
    for (int64_t i = 0; i < lv->count; i++) {                                                                     \
        Step s, g[GROUP_MAX];                                                                                     \
        int64_t lo, width;                                                                                        \
        const int64_t *after;                                                                                     \
        const int64_t n = mode == RUN_LOG && backward ? grouped(p, end, lv->count - i, mode, g, &lo, &width, &after) : 1; \
        if (n > 1) {                                                                                              \
            if (is_double) backward_group_f64##ISA(g, n, lo, width, b0, b1, tab, gtab, t, (double **)ptrs,            \
                                                   (double **)ptrs + m, (double **)ptrs + 2 * m, (double **)ptrs + 3 * m, offs, offs + m); \
            else backward_group_f32##ISA(g, n, lo, width, b0, b1, tab, gtab, t, (float **)ptrs, (float **)ptrs + m, \
                                         (float **)ptrs + 2 * m, (float **)ptrs + 3 * m, offs, offs + m);           \
            p = after;                                                                                            \
            i += n - 1;                                                                                           \
            continue;                                                                                             \
        }                                                                                                         \
        p = parse(p, end, &s); /* (scan_level checked every step) */                                              \
        if (mode == RUN_PAIRS && is_double) {                                                                     \
            double **q = (double **)ptrs;                                                                         \
            if (backward) pair_backward_step_f64##ISA(&s, b0, b1, tab, gtab, S, t, q, q + m, q + 2 * m, q + 3 * m, q + 4 * m, q + 5 * m, q + 6 * m, q + 7 * m, offs, offs + m); \
            else pair_forward_step_f64##ISA(&s, b0, b1, tab, S, t, q, q + m, q + 2 * m, q + 3 * m, offs, offs + m);   \
        } else if (mode == RUN_PAIRS) {                                                                           \
            float **q = (float **)ptrs;                                                                           \
            if (backward) pair_backward_step_f32##ISA(&s, b0, b1, tab, gtab, S, t, q, q + m, q + 2 * m, q + 3 * m, q + 4 * m, q + 5 * m, q + 6 * m, q + 7 * m, offs, offs + m); \
            else pair_forward_step_f32##ISA(&s, b0, b1, tab, S, t, q, q + m, q + 2 * m, q + 3 * m, offs, offs + m);   \
        } else if (is_double) {                                                                                   \
            double **q = (double **)ptrs;                                                                         \
            if (max && backward) max_backward_step_f64##ISA(&s, b0, b1, tab, gtab, t, q, q + m, q + 2 * m, q + 3 * m, offs, offs + m); \
            else if (max) max_forward_step_f64##ISA(&s, b0, b1, tab, t, q, q + m, offs, offs + m);                 \
            else if (backward) backward_step_f64##ISA(&s, b0, b1, tab, gtab, t, q, q + m, q + 2 * m, q + 3 * m, offs, offs + m); \
            else forward_step_f64##ISA(&s, b0, b1, tab, t, q, q + m, offs, offs + m);                              \
        } else {                                                                                                  \
            float **q = (float **)ptrs;                                                                           \
            if (max && backward) max_backward_step_f32##ISA(&s, b0, b1, tab, gtab, t, q, q + m, q + 2 * m, q + 3 * m, offs, offs + m); \
            else if (max) max_forward_step_f32##ISA(&s, b0, b1, tab, t, q, q + m, offs, offs + m);                 \
            else if (backward) backward_step_f32##ISA(&s, b0, b1, tab, gtab, t, q, q + m, q + 2 * m, q + 3 * m, offs, offs + m); \
            else forward_step_f32##ISA(&s, b0, b1, tab, t, q, q + m, offs, offs + m);                              \
        }                                                                                                         \
    }                                                                                                             \
}

/* The instruction sets the kernel is compiled for (ALL_STEPS), best last: the CPU's best is chosen
 * when the module loads (set_isa() may choose a lower one) */
EXAMPLES(_base)
#if ISAS_X86
EXAMPLES(_avx2)
EXAMPLES(_avx512)
static Examples *const ISA_CODE[] = {examples_base, examples_avx2, examples_avx512};
#else
static Examples *const ISA_CODE[] = {examples_base};
#endif

/* A run of levels as parts, part j the examples [B j / parts, B (j + 1) / parts) through every level
 * of the run in turn, on up to n threads, thread i with scratch i. An example's items depend only on
 * its own items and on inputs, so a part may go on to the next level before the other parts finish
 * this one, as long as no level of the run writes a buffer shared by the batch */
typedef struct {
    const int64_t *all, *at; /* level k's descriptor: all[at[k]] .. all[at[k + 1]] */
    const Level *lv;         /* the levels of the run, lv[0 .. count) */
    int64_t count;
    int mode, backward, is_double;
    int64_t B, n, parts;
    const int64_t *tab, *gtab;
    int64_t S; /* sources: the rows of tab (and gtab) past S are the tangents of pairs (RUN_PAIRS) */
    char *mem;            /* thread i's memory: mem + i * block, its scratch, then its pointers, then its offsets */
    size_t block, room, pointers; /* bytes: a thread's memory, its scratch, its scratch and pointers */
} Job;

static void run_part(const Job *w, int64_t j, int64_t i) {
    char *mine = w->mem + i * w->block;
    for (int64_t k = 0; k < w->count; k++)
        ISA_CODE[isa](w->all + w->at[k] + 1, w->all + w->at[k + 1], &w->lv[k], w->mode, w->backward, w->is_double,
                      w->B * j / w->parts, w->B * (j + 1) / w->parts, w->tab, w->gtab, w->S, mine,
                      (void **)(mine + w->room), (int64_t *)(mine + w->pointers));
}

#if defined(_OPENMP)
#include <omp.h>
#include <stdatomic.h>
#define THREADED 1

/* the job's parts, claimed one at a time, on up to w->n threads of the OpenMP runtime that torch's
 * own operations run on (torch's wheel loads its libgomp first, and this extension shares it).
 * Threads of our own (POSIX threads, before) competed for the cores with torch's workers, which
 * spin after each parallel operation: two threads often ran slower than one. Without OpenMP (a
 * compiler without it, setup.py) a job runs on the calling thread. */
static void run_job(const Job *w) {
    if (w->n == 1) {
        for (int64_t j = 0; j < w->parts; j++) run_part(w, j, 0);
        return;
    }
    _Atomic int64_t next = 0;
#pragma omp parallel num_threads(w->n)
    {
        const int64_t i = omp_get_thread_num();
        for (int64_t j; (j = atomic_fetch_add(&next, 1)) < w->parts;) run_part(w, j, i);
    }
}
#else
#define THREADED 0 /* one thread */
static void run_job(const Job *w) {
    for (int64_t j = 0; j < w->parts; j++) run_part(w, j, 0);
}
#endif

/* bytes of one example's rows of the table's buffers (batch stride 0: shared, not counted) */
static int64_t example_bytes(const int64_t *tab, int64_t sources, size_t item) {
    int64_t bytes = 0;
    for (int64_t k = 0; tab && k < sources; k++) bytes += tab[2 * k + 1] * (int64_t)item;
    return bytes;
}

/* the parts of a job of n threads: PARTS a thread, and at least enough that a part's rows fit in
 * part_bytes (one thread included), one example at least; one part where a level writes a buffer
 * shared by the batch (its sums keep the order of one pass over the batch) */
static int64_t parts_for(const Level *whole, int64_t n, int64_t B, int64_t per_example) {
    if (whole->shared_writes) return 1;
    int64_t parts = n == 1 ? 1 : PARTS * n;
    const int64_t fitting = per_example > 0 ? (B * per_example + part_bytes - 1) / part_bytes : 1;
    parts = fitting > parts ? fitting : parts;
    return parts > B ? B : parts < 1 ? 1 : parts;
}

/* levels [k0, k1) as one job (lv: theirs, scanned; none writes a buffer shared by the batch, or there is
 * one level): 0, or 2 where memory ran out */
static int run_levels(const int64_t *all, const int64_t *at, const Level *lv, int64_t k0, int64_t k1, int mode,
                      int backward, int is_double, int64_t B, int64_t threads, const int64_t *tab, const int64_t *gtab,
                      int64_t S, int64_t per_example) {
    Level whole = lv[k0];
    for (int64_t k = k0 + 1; k < k1; k++) {
        whole.room = lv[k].room > whole.room ? lv[k].room : whole.room;
        whole.maxRH = lv[k].maxRH > whole.maxRH ? lv[k].maxRH : whole.maxRH;
        whole.work += lv[k].work;
    }
    const int64_t n = THREADED ? threads_for(&whole, B, threads) : 1;
    const size_t item = is_double ? sizeof(double) : sizeof(float);
    /* per thread: its scratch, pointers and offsets, in cache lines of its own (a line two threads
     * wrote, the offsets every step writes, halved an alignment's speed on two threads) */
    const size_t room = LINES(whole.room * item), pointers = room + LINES(8 * whole.maxRH * sizeof(void *));
    const size_t block = pointers + LINES(2 * whole.maxRH * sizeof(int64_t));
    char *mem = aligned_alloc(LINE, n * block);
    if (!mem) return 2;
    const Job job = {all, at + k0, lv + k0, k1 - k0, mode, backward, is_double, B, n,
                     parts_for(&whole, n, B, per_example), tab, gtab, S, mem, block, room, pointers};
    run_job(&job);
    free(mem);
    return 0;
}

/* forward(max, double, B, threads, table, levels[, starts]) and backward(..., table, grads, levels[,
 * starts]): the level descriptors levels[starts[k]:starts[k+1]] one after the other (without starts:
 * levels is one descriptor), in one call, so that a stretch of levels costs one crossing from Python;
 * pair_forward(double, ...) and pair_backward(double, ...) the same in Log on pairs, their tables
 * twice as long (the tangents' rows after the values') */
static PyObject *run(PyObject *args, int backward, int pairs) {
    int max = 0, is_double;
    Py_ssize_t B, threads;
    Py_buffer table, gtable = {0}, levels, starts = {0};
    if (pairs && backward) {
        if (!PyArg_ParseTuple(args, "pnny*y*y*|y*", &is_double, &B, &threads, &table, &gtable, &levels, &starts)) return NULL;
    } else if (pairs) {
        if (!PyArg_ParseTuple(args, "pnny*y*|y*", &is_double, &B, &threads, &table, &levels, &starts)) return NULL;
    } else if (backward) {
        if (!PyArg_ParseTuple(args, "ppnny*y*y*|y*", &max, &is_double, &B, &threads, &table, &gtable, &levels, &starts)) return NULL;
    } else if (!PyArg_ParseTuple(args, "ppnny*y*|y*", &max, &is_double, &B, &threads, &table, &levels, &starts)) {
        return NULL;
    }
    const int mode = pairs ? RUN_PAIRS : max ? RUN_MAX : RUN_LOG;
    const int64_t S = table.len / (Py_ssize_t)(2 * sizeof(int64_t)) / (pairs ? 2 : 1);
    const int64_t *all = (const int64_t *)levels.buf, *tab = (const int64_t *)table.buf;
    const int64_t *gtab = backward ? (const int64_t *)gtable.buf : NULL;
    const int64_t size = levels.len / (Py_ssize_t)sizeof(int64_t);
    const size_t item = is_double ? sizeof(double) : sizeof(float);
    const int64_t per_example = example_bytes(tab, table.len / (Py_ssize_t)(2 * sizeof(int64_t)), item)
                              + example_bytes(gtab, backward ? gtable.len / (Py_ssize_t)(2 * sizeof(int64_t)) : 0, item);
    const int64_t one[2] = {0, size}, *at = starts.buf ? (const int64_t *)starts.buf : one;
    const int64_t count = starts.buf ? starts.len / (Py_ssize_t)sizeof(int64_t) - 1 : 1;
    Level *lv = malloc((count > 0 ? count : 1) * sizeof(Level));
    int status = lv ? 0 : 2;
    for (int64_t k = 0; k < count && !status; k++)
        if (at[k] < 0 || at[k] > at[k + 1] || at[k + 1] > size || !scan_level(all + at[k], at[k + 1] - at[k], mode, tab, gtab, &lv[k]))
            status = 1;
    Py_BEGIN_ALLOW_THREADS
    /* the levels in jobs: each run of levels that write no buffer shared by the batch is one, split
     * across threads as a whole; a level that writes one is a job of its own (on one thread) */
    for (int64_t k0 = 0, k1; k0 < count && !status; k0 = k1) {
        k1 = k0 + 1;
        while (k1 < count && !lv[k0].shared_writes && !lv[k1].shared_writes) k1++;
        status = run_levels(all, at, lv, k0, k1, mode, backward, is_double, B, threads, tab, gtab, S, per_example);
    }
    Py_END_ALLOW_THREADS
    free(lv);
    PyBuffer_Release(&table);
    if (backward) PyBuffer_Release(&gtable);
    PyBuffer_Release(&levels);
    if (starts.buf) PyBuffer_Release(&starts);
    if (status == 1) PyErr_SetString(PyExc_ValueError, "a malformed level descriptor");
    if (status == 2) PyErr_NoMemory();
    if (status) return NULL;
    Py_RETURN_NONE;
}

static PyObject *forward(PyObject *self, PyObject *args) { return run(args, 0, 0); }
static PyObject *backward(PyObject *self, PyObject *args) { return run(args, 1, 0); }
static PyObject *pair_forward(PyObject *self, PyObject *args) { return run(args, 0, 1); }
static PyObject *pair_backward(PyObject *self, PyObject *args) { return run(args, 1, 1); }

static PyObject *get_part_bytes(PyObject *self, PyObject *unused) { return PyLong_FromLongLong(part_bytes); }

static PyObject *set_part_bytes(PyObject *self, PyObject *args) {
    long long bytes;
    if (!PyArg_ParseTuple(args, "L", &bytes)) return NULL;
    if (bytes < 1) {
        PyErr_SetString(PyExc_ValueError, "set_part_bytes: expected a positive number of bytes");
        return NULL;
    }
    part_bytes = bytes;
    Py_RETURN_NONE;
}




static PyMethodDef methods[] = {
    {"forward", forward, METH_VARARGS, "forward(max, double, B, threads, table, levels[, starts]): the levels' items into their heads"},
    {"backward", backward, METH_VARARGS, "backward(max, double, B, threads, table, grads, levels[, starts]): the levels' gradients"},
    {"pair_forward", pair_forward, METH_VARARGS, "pair_forward(double, B, threads, table, levels[, starts]): forward in Log on pairs (value, tangent)"},
    {"pair_backward", pair_backward, METH_VARARGS, "pair_backward(double, B, threads, table, grads, levels[, starts]): backward in Log on pairs"},
    {"part_bytes", get_part_bytes, METH_NOARGS, "part_bytes(): the bytes of the buffers' rows a part of the batch is kept within"},
    {"set_part_bytes", set_part_bytes, METH_VARARGS, "set_part_bytes(bytes): keep a part of the batch within this many bytes of rows"},
    ISA_METHODS
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kernel(void) {
    choose_best_isa();
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "GRAIN", GRAIN) < 0 || PyModule_AddIntConstant(m, "threaded", THREADED) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
