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

#define SCANS(R, V, VI, SUFFIX, LOWEST, LOG, ISA, TARGET)                                                   \
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
    for (int64_t c = 0; c < KP; c += LANES_##SUFFIX) {                                                     \
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
        for (int64_t c = 0; c < KP; c += LANES_##SUFFIX) store_##SUFFIX##ISA(s + c, (V){0});               \
        for (int64_t y = 0; y < K; y++) {                                                                   \
            for (int64_t c = 0; c < KP; c += LANES_##SUFFIX) {                                             \
                V v = exp_##SUFFIX(load_##SUFFIX##ISA(tile + y * KP + c) - load_##SUFFIX##ISA(m + c));      \
                store_##SUFFIX##ISA(w + y * KP + c, v);                                                     \
                store_##SUFFIX##ISA(s + c, load_##SUFFIX##ISA(s + c) + v);                                  \
            }                                                                                               \
        }                                                                                                   \
        if (a->flags & KEEP) for (int64_t c = 0; c < K; c++) ((R *)a->sums)[(b * N + t) * K + c] = s[c];    \
        const R *u = a->flags & UNARY ? (const R *)a->unary + b * a->su[0] + t * a->su[1] : NULL;           \
        R top = -INFINITY;                                                                                  \
        for (int64_t c = 0; c < K; c++) {                                                                   \
            e[c] = m[c] + LOG(s[c]);                                                                        \
            if (u) e[c] += u[c * a->su[2]];                                                                 \
            top = e[c] > top ? e[c] : top;                                                                  \
        }                                                                                                   \
        R *alpha = (R *)a->alphas + (b * N + t) * K;                                                        \
        for (int64_t c = 0; c < K; c++) alpha[c] = (R)(S + e[c]);                                          \
        if (!isfinite(top)) top = 0;                                                                        \
        S += top;                                                                                           \
        for (int64_t c = 0; c < K; c++) d[c] = e[c] - top;                                                 \
    }                                                                                                       \
}                                                                                                           \
                                                                                                            \
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
            for (; c + LANES_##SUFFIX <= K; c += LANES_##SUFFIX) {                                          \
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
            for (int i = 0; i < LANES_##SUFFIX; i++) total += acc[i];                                       \
            next[y] = total;                                                                                \
        }                                                                                                   \
        for (int64_t y = 0; y < K; y++) carry[y] = next[y];                                                 \
    }                                                                                                       \
    memcpy((R *)a->g_init + b * K, carry, K * sizeof(R));                                                   \
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

#define ALL_SCANS(ISA, TARGET)                                         \
    SCANS(double, vd, vid, f64, -DBL_MAX, log, ISA, TARGET)            \
    SCANS(float, vf, vif, f32, -FLT_MAX, logf, ISA, TARGET)
ALL_SCANS(_base, )
#if ISAS_X86
ALL_SCANS(_avx2, AVX2)
ALL_SCANS(_avx512, AVX512)
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
#else
static Example *const CODE[][2][2][2] = {TABLE(_base)};
#endif

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
    ok = run_all(&a, CODE[isa][max][backward][is_double], is_double ? sizeof(double) : sizeof(float), threads);
    Py_END_ALLOW_THREADS
    if (!ok) {
        PyErr_NoMemory();
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&buf);
    return result;
}

static PyObject *forward(PyObject *self, PyObject *args) { return call(args, 0); }
static PyObject *backward(PyObject *self, PyObject *args) { return call(args, 1); }


static PyMethodDef methods[] = {
    {"forward", forward, METH_VARARGS, "forward(max, double, threads, args): every step's alphas (and, Log, the kept weights)"},
    {"backward", backward, METH_VARARGS, "backward(max, double, threads, args): the gradients of init, xs and unary"},
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
