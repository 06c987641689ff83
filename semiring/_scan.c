/* The Log and Max semirings' scans (semirings.Semiring.scan) on the CPU as one C call each way
 * (semiring/cpu_scan.py calls them): alpha_t[c] = (⊕_y alpha_{t-1}[y] ⊗ xs_t[y, c]) ⊗ unary_t[c] from
 * alpha_{-1} = init, for every example, every step in one loop instead of a handful of torch calls
 * or a level of the language's kernel per step (whose per-level work dominates short rows).
 *
 * Log. The state is kept relative to a running shift: alpha_t = S_t + d_t, S_t (double) the sum of
 * the steps' maxima, d_t <= 0 near 0. The terms of a step, d[y] + x[y, c], are then small numbers
 * whatever t is, so in float32 the weights w[y, c] = exp(d[y] + x[y, c] - m[c]) (m[c] their column
 * maximum) keep their relative precision at any length, where log-space values of size ~t lose it.
 * Where the backward is wanted the forward keeps w and the column sums s[c] = Σ_y w[y, c] (one number
 * per entry of xs): the backward is then products only, no exp,
 *     g = grad_t + carry,  gx_t[y, c] = w[y, c] g[c] / s[c],  carry[y] = Σ_c gx_t[y, c].
 * The forward's per-column log(s[c]) is _vector.h's vector log, and on AVX-512 the forward runs at
 * its own 64-byte width where a row of K is whole vectors of it (example_code).
 * Max. alpha_t[c] = max_y (alpha_{t-1}[y] + x[y, c]) + unary_t[c], the same float operations as
 * the torch calls (so the same bits); the backward is Viterbi's backtrace as a gradient: each state's
 * gradient goes to its first best predecessor.
 *
 * Arguments: forward(max, double, threads, args), backward(max, double, threads, args), args an int64
 * buffer (cpu_scan.py's _args): B, N (steps), K (states), flags (1: unary, 2: keep the weights, 4: one
 * matrix gradient per example, not per step), then (address, strides) of init [B, K], xs [B, N, K, K]
 * (stride 0 where broadcast), unary [B, N, K], and the addresses of alphas [B, N, K], weights
 * [B, N, K, KP] (KP: K padded to the vector width), sums [B, N, K], grad [B, N, K], g_init [B, K],
 * g_xs [B, N or 1, K, K], g_unary [B, N, K] (contiguous; 0 where absent). Examples split across up to
 * `threads` POSIX threads where each gets enough work; each example is computed as on one thread. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_threads.h"
#include "_vector.h"

typedef struct {
    int64_t B, N, K, flags;
    char *init; int64_t si[2];
    char *xs; int64_t sx[4];
    char *unary; int64_t su[3];
    char *alphas, *weights, *sums, *grad, *g_init, *g_xs, *g_unary;
} Args;

#define N_ARGS 23
#define UNARY 1
#define KEEP 2
#define SHARED_GRAD 4
#define PAD_TO 8 /* a row of the scratch and of the weights: a multiple of both vector widths */
#define PAD(K) (((K) + PAD_TO - 1) / PAD_TO * PAD_TO)

/* the scratch one example needs, in numbers: the step's terms [K, KP] and four rows */
static int64_t room(int64_t K) { return (K + 4) * PAD(K); }

#define FORWARD_SCANS(R, V, VI, LANES, EXP, SUFFIX, LOWEST, LOG, ISA, TARGET)                                                \
static inline __attribute__((always_inline)) V load_##SUFFIX##ISA(const R *p) { V v; memcpy(&v, p, sizeof v); return v; } \
static inline __attribute__((always_inline)) void store_##SUFFIX##ISA(R *p, V v) { memcpy(p, &v, sizeof v); } \
                                                                                                            \
/* tile[y, c] = d[y] + xs_t[y, c] (-inf past K), and m[c] its column maximum (clamped to the finite  \
 * range where `clamp`) */                                                                                   \
TARGET static void terms_##SUFFIX##ISA(const Args *a, const R *x, const R *d, R *tile, R *m, int clamp) {  \
    const int64_t K = a->K, KP = PAD(K), s2 = a->sx[2], s3 = a->sx[3];                                     \
    for (int64_t y = 0; y < K; y++) {                                                                       \
        R *restrict row = tile + y * KP;                                                                    \
        const R *restrict xr = x + y * s2;                                                                  \
        const R dy = d[y];                                                                                  \
        if (s3 == 1) for (int64_t c = 0; c < K; c++) row[c] = dy + xr[c];                                  \
        else for (int64_t c = 0; c < K; c++) row[c] = dy + xr[c * s3];                                     \
        for (int64_t c = K; c < KP; c++) row[c] = -INFINITY;                                               \
    }                                                                                                       \
    for (int64_t c = 0; c < KP; c += LANES) {                                                     \
        V mv = load_##SUFFIX##ISA(tile + c);                                                                \
        for (int64_t y = 1; y < K; y++) {                                                                   \
            V v = load_##SUFFIX##ISA(tile + y * KP + c);                                                    \
            VI gt = v > mv;                                                                                 \
            mv = (V)(((VI)v & gt) | ((VI)mv & ~gt));                                                       \
        }                                                                                                   \
        if (clamp) {                                                                                        \
            const V lo = (V){0} + LOWEST, hi = (V){0} - LOWEST;                                             \
            VI below = mv < lo, above = mv > hi;                                                            \
            mv = (V)(((VI)lo & below) | ((VI)mv & ~below));                                                 \
            mv = (V)(((VI)hi & above) | ((VI)mv & ~above));                                                 \
        }                                                                                                   \
        store_##SUFFIX##ISA(m + c, mv);                                                                     \
    }                                                                                                       \
}                                                                                                           \
                                                                                                            \
TARGET static void log_forward_##SUFFIX##ISA(const Args *a, int64_t b, void *room_) {                      \
    R *scratch = room_;                                                                                     \
    const int64_t N = a->N, K = a->K, KP = PAD(K);                                                          \
    R *tile = scratch, *d = tile + K * KP, *m = d + KP, *s = m + KP, *e = s + KP;                          \
    const R *init = (const R *)a->init + b * a->si[0];                                                      \
    double S = -INFINITY;                                                                                   \
    for (int64_t y = 0; y < K; y++) S = init[y * a->si[1]] > S ? init[y * a->si[1]] : S;                  \
    if (!isfinite(S)) S = 0;                                                                                \
    for (int64_t y = 0; y < K; y++) d[y] = (R)(init[y * a->si[1]] - S);                                    \
    for (int64_t t = 0; t < N; t++) {                                                                       \
        const R *x = (const R *)a->xs + b * a->sx[0] + t * a->sx[1];                                        \
        terms_##SUFFIX##ISA(a, x, d, tile, m, 1);                                                           \
        R *w = a->flags & KEEP ? (R *)a->weights + ((b * N + t) * K) * KP : tile;                           \
        for (int64_t c = 0; c < KP; c += LANES) { /* (a column's sum in a register: in memory, each add waited for the last store) */ \
            const V mc = load_##SUFFIX##ISA(m + c);                                                         \
            V sum = {0};                                                                                    \
            for (int64_t y = 0; y < K; y++) {                                                               \
                const V v = EXP(load_##SUFFIX##ISA(tile + y * KP + c) - mc);                                \
                store_##SUFFIX##ISA(w + y * KP + c, v);                                                     \
                sum += v;                                                                                   \
            }                                                                                               \
            store_##SUFFIX##ISA(s + c, sum);                                                                \
        }                                                                                                   \
        if (a->flags & KEEP) for (int64_t c = 0; c < K; c++) ((R *)a->sums)[(b * N + t) * K + c] = s[c];    \
        const R *u = a->flags & UNARY ? (const R *)a->unary + b * a->su[0] + t * a->su[1] : NULL;           \
        for (int64_t c = 0; c < KP; c += LANES)                                                             \
            store_##SUFFIX##ISA(e + c, load_##SUFFIX##ISA(m + c) + LOG(load_##SUFFIX##ISA(s + c)));         \
        if (u) for (int64_t c = 0; c < K; c++) e[c] += u[c * a->su[2]];                                    \
        /* their max (NaN skipped; -inf past K) in a vector, then its lanes pairwise: a chain of K scalar \
         * maxima took a tenth of the forward */                                                           \
        V tv = (V){0} - INFINITY;                                                                           \
        for (int64_t c = 0; c < KP; c += LANES) {                                                           \
            const V v = load_##SUFFIX##ISA(e + c);                                                          \
            const VI gt = v > tv;                                                                           \
            tv = (V)(((VI)v & gt) | ((VI)tv & ~gt));                                                       \
        }                                                                                                   \
        R lanes[LANES];                                                                                     \
        memcpy(lanes, &tv, sizeof tv);                                                                      \
        for (int half = LANES / 2; half >= 1; half /= 2)                                                    \
            for (int i = 0; i < half; i++) lanes[i] = lanes[i + half] > lanes[i] ? lanes[i + half] : lanes[i]; \
        R top = lanes[0];                                                                                   \
        R *alpha = (R *)a->alphas + (b * N + t) * K;                                                        \
        for (int64_t c = 0; c < K; c++) alpha[c] = (R)(S + e[c]);                                          \
        if (!isfinite(top)) top = 0;                                                                        \
        S += top;                                                                                           \
        for (int64_t c = 0; c < K; c++) d[c] = e[c] - top;                                                 \
    }                                                                                                       \
}                                                                                                           \
                                                                                                            \
TARGET static void max_forward_##SUFFIX##ISA(const Args *a, int64_t b, void *room_) {                      \
    R *scratch = room_;                                                                                     \
    const int64_t N = a->N, K = a->K, KP = PAD(K);                                                          \
    R *tile = scratch, *d = tile + K * KP, *m = d + KP;                                                     \
    const R *init = (const R *)a->init + b * a->si[0];                                                      \
    for (int64_t y = 0; y < K; y++) d[y] = init[y * a->si[1]];                                             \
    for (int64_t t = 0; t < N; t++) {                                                                       \
        terms_##SUFFIX##ISA(a, (const R *)a->xs + b * a->sx[0] + t * a->sx[1], d, tile, m, 0);              \
        const R *u = a->flags & UNARY ? (const R *)a->unary + b * a->su[0] + t * a->su[1] : NULL;           \
        R *alpha = (R *)a->alphas + (b * N + t) * K;                                                        \
        for (int64_t c = 0; c < K; c++) d[c] = alpha[c] = u ? m[c] + u[c * a->su[2]] : m[c];               \
    }                                                                                                       \
}                                                                                                           \

/* the backward loops, at the 32-byte width (at AVX-512's, a row's gradient sum, one horizontal sum per row of
 * 16 floats, made them slower), using FORWARD_SCANS' loads and stores */
#define BACKWARD_SCANS(R, V, VI, LANES, SUFFIX, ISA, TARGET)                                                \
TARGET static void log_backward_##SUFFIX##ISA(const Args *a, int64_t b, void *room_) {                     \
    R *scratch = room_;                                                                                     \
    const int64_t N = a->N, K = a->K, KP = PAD(K);                                                          \
    R *carry = scratch, *next = carry + KP, *q = next + KP;                                                 \
    for (int64_t c = 0; c < KP; c++) carry[c] = q[c] = 0;                                                  \
    const int shared = a->flags & SHARED_GRAD;                                                              \
    if (shared) memset((R *)a->g_xs + b * K * K, 0, K * K * sizeof(R));                                     \
    for (int64_t t = N - 1; t >= 0; t--) {                                                                  \
        const R *grad = (const R *)a->grad + (b * N + t) * K, *sums = (const R *)a->sums + (b * N + t) * K; \
        R *gu = a->flags & UNARY ? (R *)a->g_unary + (b * N + t) * K : NULL;                                \
        for (int64_t c = 0; c < K; c++) {                                                                   \
            const R g = grad[c] + carry[c];                                                                 \
            if (gu) gu[c] = g;                                                                              \
            q[c] = g / (sums[c] > 1 ? sums[c] : 1); /* (a column of sum 0 has weights 0) */                \
        }                                                                                                   \
        const R *w = (const R *)a->weights + ((b * N + t) * K) * KP;                                        \
        if (t) for (int64_t i = 0; i < K * KP; i += 64 / sizeof(R)) __builtin_prefetch(w - K * KP + i); /* (walked backwards: not prefetched) */ \
        R *gx = (R *)a->g_xs + (shared ? b * K * K : (b * N + t) * K * K);                                  \
        for (int64_t y = 0; y < K; y++) {                                                                   \
            const R *restrict wy = w + y * KP;                                                              \
            R *restrict gy = gx + y * K;                                                                    \
            V acc = {0};                                                                                    \
            int64_t c = 0;                                                                                  \
            for (; c + LANES <= K; c += LANES) {                                          \
                V v = load_##SUFFIX##ISA(wy + c) * load_##SUFFIX##ISA(q + c);                               \
                store_##SUFFIX##ISA(gy + c, shared ? load_##SUFFIX##ISA(gy + c) + v : v);                   \
                acc += v;                                                                                   \
            }                                                                                               \
            R total = 0;                                                                                    \
            for (; c < K; c++) {                                                                            \
                const R v = wy[c] * q[c];                                                                   \
                gy[c] = shared ? gy[c] + v : v;                                                             \
                total += v;                                                                                 \
            }                                                                                               \
            for (int i = 0; i < LANES; i++) total += acc[i];                                       \
            next[y] = total;                                                                                \
        }                                                                                                   \
        for (int64_t y = 0; y < K; y++) carry[y] = next[y];                                                 \
    }                                                                                                       \
    memcpy((R *)a->g_init + b * K, carry, K * sizeof(R));                                                   \
}                                                                                                           \
                                                                                                            \
TARGET static void max_backward_##SUFFIX##ISA(const Args *a, int64_t b, void *room_) {                     \
    R *scratch = room_;                                                                                     \
    const int64_t N = a->N, K = a->K, KP = PAD(K);                                                          \
    R *carry = scratch, *next = carry + KP, *g = next + KP, *d = g + KP;                                   \
    for (int64_t c = 0; c < K; c++) carry[c] = 0;                                                          \
    const int shared = a->flags & SHARED_GRAD;                                                              \
    memset((R *)a->g_xs + (shared ? b * K * K : b * N * K * K), 0, (shared ? 1 : N) * K * K * sizeof(R));  \
    const R *init = (const R *)a->init + b * a->si[0];                                                      \
    for (int64_t t = N - 1; t >= 0; t--) {                                                                  \
        const R *grad = (const R *)a->grad + (b * N + t) * K;                                               \
        R *gu = a->flags & UNARY ? (R *)a->g_unary + (b * N + t) * K : NULL;                                \
        for (int64_t c = 0; c < K; c++) {                                                                   \
            g[c] = grad[c] + carry[c];                                                                      \
            if (gu) gu[c] = g[c];                                                                           \
            next[c] = 0;                                                                                    \
        }                                                                                                   \
        const R *prev = t ? (const R *)a->alphas + (b * N + t - 1) * K : NULL;                             \
        for (int64_t y = 0; y < K; y++) d[y] = prev ? prev[y] : init[y * a->si[1]];                        \
        const R *x = (const R *)a->xs + b * a->sx[0] + t * a->sx[1];                                        \
        R *gx = (R *)a->g_xs + (shared ? b * K * K : (b * N + t) * K * K);                                  \
        for (int64_t c = 0; c < K; c++) {                                                                   \
            if (g[c] == 0) continue; /* (its gradient adds nothing anywhere) */                             \
            int64_t best = 0;                                                                               \
            R top = d[0] + x[c * a->sx[3]];                                                                 \
            for (int64_t y = 1; y < K; y++) {                                                               \
                const R v = d[y] + x[y * a->sx[2] + c * a->sx[3]];                                          \
                if (v > top) { top = v; best = y; }                                                         \
            }                                                                                               \
            next[best] += g[c];                                                                             \
            gx[best * K + c] += g[c];                                                                       \
        }                                                                                                   \
        memcpy(carry, next, K * sizeof(R));                                                                 \
    }                                                                                                       \
    memcpy((R *)a->g_init + b * K, carry, K * sizeof(R));                                                   \
}

#define ALL_SCANS(ISA, TARGET)                                                             \
    FORWARD_SCANS(double, vd, vid, LANES_f64, exp_f64, f64, -DBL_MAX, log_f64, ISA, TARGET)    \
    FORWARD_SCANS(float, vf, vif, LANES_f32, exp_f32, f32, -FLT_MAX, log_f32, ISA, TARGET)    \
    BACKWARD_SCANS(double, vd, vid, LANES_f64, f64, ISA, TARGET)                           \
    BACKWARD_SCANS(float, vf, vif, LANES_f32, f32, ISA, TARGET)
ALL_SCANS(_base, )
#if ISAS_X86
ALL_SCANS(_avx2, AVX2)
ALL_SCANS(_avx512, AVX512)
/* the forward loops at AVX-512's own width, where a row of K (padded to PAD_TO) is whole vectors of it */
FORWARD_SCANS(double, vd8, vid8, 8, exp_f64x8, f64, -DBL_MAX, log_f64x8, _avx512w, AVX512)
FORWARD_SCANS(float, vf16, vif16, 16, exp_f32x16, f32, -FLT_MAX, log_f32x16, _avx512w, AVX512)
#endif

typedef void Example(const Args *a, int64_t b, void *scratch);
/* per instruction set: {log, max} x {forward, backward} x {float, double} */
#define TABLE(ISA)                                                                                        \
    {{{log_forward_f32##ISA, log_forward_f64##ISA},                                \
      {log_backward_f32##ISA, log_backward_f64##ISA}},                             \
     {{max_forward_f32##ISA, max_forward_f64##ISA},                                \
      {max_backward_f32##ISA, max_backward_f64##ISA}}}
#if ISAS_X86
static Example *const CODE[][2][2][2] = {TABLE(_base), TABLE(_avx2), TABLE(_avx512)};
static Example *const WIDE_FORWARD[2][2] = {{log_forward_f32_avx512w, log_forward_f64_avx512w},
                                             {max_forward_f32_avx512w, max_forward_f64_avx512w}};
#define AVX512_ISA 2 /* (ISA_NAMES' index) */
#else
static Example *const CODE[][2][2][2] = {TABLE(_base)};
#endif

/* the loop of one example for this call: a forward at AVX-512's 64 bytes where a row of K is whole vectors of it */
static Example *example_code(int max, int backward, int is_double, int64_t K) {
#if ISAS_X86
    if (isa == AVX512_ISA && !backward && PAD(K) % (is_double ? 8 : 16) == 0) return WIDE_FORWARD[max][is_double];
#endif
    return CODE[isa][max][backward][is_double];
}

#define GRAIN (1 << 18) /* terms (K^2 per step) a thread is worth: starting one costs tens of microseconds */

/* the examples [b0, b1) of one scan (a Job), with scratch of their own; PartFn of _threads.h */
typedef struct {
    const Args *a;
    Example *run;
    int64_t size;
} Job;

static int run_examples(const void *job_, int64_t b0, int64_t b1) {
    const Job *job = job_;
    void *scratch = malloc(room(job->a->K) * job->size);
    if (!scratch) return 0;
    for (int64_t b = b0; b < b1; b++) job->run(job->a, b, scratch);
    free(scratch);
    return 1;
}

/* every example, split across up to `threads` threads; 0 where scratch could not be had */
static int run_all(const Args *a, Example *run, int64_t size, int64_t threads) {
    const int64_t worth = a->B * a->N * a->K * a->K / GRAIN;
    const Job job = {a, run, size};
    return split_batch(run_examples, &job, a->B, threads < worth ? threads : worth);
}

static PyObject *call(PyObject *args, int backward) {
    int max, is_double;
    Py_ssize_t threads;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "ppny*", &max, &is_double, &threads, &buf)) return NULL;
    PyObject *result = NULL;
    if (buf.len != N_ARGS * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "a malformed scan descriptor");
        goto done;
    }
    const int64_t *v = buf.buf;
    Args a = {v[0], v[1], v[2], v[3],
              (char *)v[4], {v[5], v[6]},
              (char *)v[7], {v[8], v[9], v[10], v[11]},
              (char *)v[12], {v[13], v[14], v[15]},
              (char *)v[16], (char *)v[17], (char *)v[18], (char *)v[19], (char *)v[20], (char *)v[21], (char *)v[22]};
    if (a.B < 0 || a.N < 0 || a.K < 1 || (!max && (backward || (a.flags & KEEP)) && !a.weights)) {
        PyErr_SetString(PyExc_ValueError, "a malformed scan descriptor");
        goto done;
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = run_all(&a, example_code(max, backward, is_double, a.K), is_double ? sizeof(double) : sizeof(float), threads);
    Py_END_ALLOW_THREADS
    result = ok ? Py_NewRef(Py_None) : PyErr_NoMemory();
done:
    PyBuffer_Release(&buf);
    return result;
}

static PyObject *forward(PyObject *self, PyObject *args) { return call(args, 0); }
static PyObject *backward(PyObject *self, PyObject *args) { return call(args, 1); }


/* Pairs (value, tangent): the Log scan and its gradient with their forward-mode derivatives in the
 * direction of the inputs' tangents, what a Hessian-vector product runs (language/autodiff.py), in
 * double whatever the inputs' dtype (cpu_scan.pair_forward converts). Every array is [2, ...]:
 * component 0 the value, 1 the tangent. With p_t[y, c] = exp(alpha_{t-1}[y] + x_t[y, c] - lse_t[c])
 * (lse_t[c] = alpha_t[c] - unary_t[c]):
 *     alpha'_t[c] = Σ_y p_t[y, c] (alpha'_{t-1}[y] + x'_t[y, c]) + unary'_t[c]            (forward)
 *     G_t = grad_t + carry_t,  g_x_t[y, c] = p_t[y, c] G_t[c],  carry_{t-1}[y] = Σ_c g_x_t[y, c]
 *     g_x'_t[y, c] = p_t[y, c] (G'_t[c] + G_t[c] (alpha'_{t-1}[y] + x'_t[y, c] - lse'_t[c]))  (backward)
 * A state no path reaches has alpha -inf, tangent 0 and weights 0.
 *
 * pair_forward(threads, args) / pair_backward(threads, args), args int64 (cpu_scan._pair_args): B, T, K,
 * flags (1: unary, 4: one matrix for every step: its gradient summed over them), then the address
 * and element strides of init [2, B, K], xs [2, B, T, K, K], unary [2, B, T, K] (stride 0 where
 * broadcast), and the addresses of alpha [2, B, T, K], grad [2, B, T, K], g_init [2, B, K], g_xs
 * [2, B, T or 1, K, K], g_unary [2, B, T, K] (contiguous). */
typedef struct {
    int64_t B, T, K, flags;
    const double *init; int64_t si[3];
    const double *xs; int64_t sx[5];
    const double *unary; int64_t su[4];
    double *alpha;
    const double *grad;
    double *g_init, *g_xs, *g_unary;
} Pairs;

#define PAIR_ARGS 24
#define X(a, comp, b, t, y, c) ((a)->xs[(comp) * (a)->sx[0] + (b) * (a)->sx[1] + (t) * (a)->sx[2] + (y) * (a)->sx[3] + (c) * (a)->sx[4]])
#define U(a, comp, b, t, c) ((a)->flags & UNARY ? (a)->unary[(comp) * (a)->su[0] + (b) * (a)->su[1] + (t) * (a)->su[2] + (c) * (a)->su[3]] : 0.0)

/* the state before step t of example b, value (comp 0) or tangent (comp 1), at y */
static double before(const Pairs *a, int comp, int64_t b, int64_t t, int64_t y) {
    const int64_t B = a->B, T = a->T, K = a->K;
    return t ? a->alpha[((comp * B + b) * T + t - 1) * K + y] : a->init[comp * a->si[0] + b * a->si[1] + y * a->si[2]];
}

static int pair_forward_part(const void *a_, int64_t b0, int64_t b1) {
    const Pairs *a = a_;
    const int64_t B = a->B, T = a->T, K = a->K;
    for (int64_t b = b0; b < b1; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < K; c++) {
                double m = -INFINITY;
                for (int64_t y = 0; y < K; y++) {
                    const double v = before(a, 0, b, t, y) + X(a, 0, b, t, y, c);
                    m = v > m ? v : m;
                }
                double value = -INFINITY, tangent = 0;
                if (isfinite(m)) {
                    double z = 0, dz = 0;
                    for (int64_t y = 0; y < K; y++) {
                        const double e = exp(before(a, 0, b, t, y) + X(a, 0, b, t, y, c) - m);
                        z += e;
                        if (e) dz += e * (before(a, 1, b, t, y) + X(a, 1, b, t, y, c));
                    }
                    value = m + log(z);
                    tangent = dz / z;
                }
                value += U(a, 0, b, t, c);
                a->alpha[(b * T + t) * K + c] = value;
                a->alpha[((B + b) * T + t) * K + c] = isfinite(value) ? tangent + U(a, 1, b, t, c) : 0;
            }
    return 1;
}

static int pair_backward_part(const void *a_, int64_t b0, int64_t b1) {
    const Pairs *a = a_;
    const int64_t B = a->B, T = a->T, K = a->K, per_step = !(a->flags & SHARED_GRAD);
    double *room = malloc(6 * K * sizeof(double));
    if (!room) return 0;
    double *carry = room, *dcarry = carry + K, *next = dcarry + K, *dnext = next + K, *G = dnext + K, *dG = G + K;
    for (int64_t b = b0; b < b1; b++) {
        for (int64_t y = 0; y < K; y++) carry[y] = dcarry[y] = 0;
        const int64_t steps = per_step ? T : 1;
        double *gx = a->g_xs + b * steps * K * K, *dgx = a->g_xs + (B + b) * steps * K * K;
        if (!per_step) for (int64_t i = 0; i < K * K; i++) gx[i] = dgx[i] = 0;
        for (int64_t t = T - 1; t >= 0; t--) {
            const int64_t at = (b * T + t) * K, dat = ((B + b) * T + t) * K;
            for (int64_t c = 0; c < K; c++) {
                G[c] = a->grad[at + c] + carry[c];
                dG[c] = a->grad[dat + c] + dcarry[c];
                if (a->flags & UNARY) {
                    a->g_unary[at + c] = G[c];
                    a->g_unary[dat + c] = dG[c];
                }
            }
            for (int64_t y = 0; y < K; y++) next[y] = dnext[y] = 0;
            double *gxt = gx + (per_step ? t * K * K : 0), *dgxt = dgx + (per_step ? t * K * K : 0);
            for (int64_t y = 0; y < K; y++) {
                const double prev = before(a, 0, b, t, y), dprev = before(a, 1, b, t, y);
                for (int64_t c = 0; c < K; c++) {
                    const double lse = a->alpha[at + c] - U(a, 0, b, t, c);
                    const double p = isfinite(lse) ? exp(prev + X(a, 0, b, t, y, c) - lse) : 0;
                    double w = 0, dw = 0;
                    if (p) {
                        const double dlse = a->alpha[dat + c] - U(a, 1, b, t, c);
                        w = p * G[c];
                        dw = p * (dG[c] + G[c] * (dprev + X(a, 1, b, t, y, c) - dlse));
                    }
                    if (per_step) {
                        gxt[y * K + c] = w;
                        dgxt[y * K + c] = dw;
                    } else {
                        gxt[y * K + c] += w;
                        dgxt[y * K + c] += dw;
                    }
                    next[y] += w;
                    dnext[y] += dw;
                }
            }
            memcpy(carry, next, K * sizeof(double));
            memcpy(dcarry, dnext, K * sizeof(double));
        }
        memcpy(a->g_init + b * K, carry, K * sizeof(double));
        memcpy(a->g_init + (B + b) * K, dcarry, K * sizeof(double));
    }
    free(room);
    return 1;
}

static PyObject *pair_call(PyObject *args, int backward) {
    Py_ssize_t threads;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "ny*", &threads, &buf)) return NULL;
    PyObject *result = NULL;
    const int64_t *v = buf.buf;
    if (buf.len != PAIR_ARGS * (Py_ssize_t)sizeof(int64_t) || v[0] < 0 || v[1] < 0 || v[2] < 1
        || !v[4] || !v[8] || ((v[3] & UNARY) && !v[14]) || !v[19]
        || (backward && (!v[20] || !v[21] || !v[22] || ((v[3] & UNARY) && !v[23])))) {
        PyErr_SetString(PyExc_ValueError, "a malformed pair scan descriptor");
        goto done;
    }
    const Pairs a = {v[0], v[1], v[2], v[3],
                     (const double *)v[4], {v[5], v[6], v[7]},
                     (const double *)v[8], {v[9], v[10], v[11], v[12], v[13]},
                     (const double *)v[14], {v[15], v[16], v[17], v[18]},
                     (double *)v[19], (const double *)v[20], (double *)v[21], (double *)v[22], (double *)v[23]};
    const int64_t worth = a.B * a.T * a.K * a.K / (GRAIN / 8); /* (the scalar loops: about 8 times a vector term's work) */
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = split_batch(backward ? pair_backward_part : pair_forward_part, &a, a.B, threads < worth ? threads : worth);
    Py_END_ALLOW_THREADS
    result = ok ? Py_NewRef(Py_None) : PyErr_NoMemory();
done:
    PyBuffer_Release(&buf);
    return result;
}

static PyObject *pair_forward(PyObject *self, PyObject *args) { return pair_call(args, 0); }
static PyObject *pair_backward(PyObject *self, PyObject *args) { return pair_call(args, 1); }

static PyMethodDef methods[] = {
    {"forward", forward, METH_VARARGS, "forward(max, double, threads, args): every step's alphas (and, Log, the kept weights)"},
    {"backward", backward, METH_VARARGS, "backward(max, double, threads, args): the gradients of init, xs and unary"},
    {"pair_forward", pair_forward, METH_VARARGS, "pair_forward(threads, args): the Log scan's alphas on pairs (value, tangent), in double"},
    {"pair_backward", pair_backward, METH_VARARGS, "pair_backward(threads, args): the gradients of init, xs and unary on pairs, in double"},
    ISA_METHODS
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__scan(void) {
    choose_best_isa();
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "PAD_TO", PAD_TO) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
