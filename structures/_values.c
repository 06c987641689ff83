/* The potentials' value check of structures/validation.py in one pass over a contiguous float32 or
 * float64 CPU buffer (optional: without it, torch's reductions run):
 *
 *   scan(address, count, f32) -> (nan, posinf, largest)
 *
 * nan, posinf: whether any entry is NaN / +inf; largest: the largest magnitude of a finite entry (0
 * without one). address is a tensor's data_ptr(): the caller holds the tensor for the call. One
 * entry point, because each torch reduction and read costs tens of microseconds when the caches are
 * cold, far more than the pass itself. The pass is compiled for each of _vector.h's instruction
 * sets (the CPU's best chosen when the module loads); the GIL is released for it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../semiring/_vector.h"

typedef struct {
    int nan, posinf;
    double largest;
} Stats;

#define INLINE static inline __attribute__((always_inline))

/* The passes over count entries of type T (as integers U; 32-byte vectors of LANES integer lanes VI, the
 * magnitude's bits under ABS, +inf's bits INF), four vectors in flight, comparing magnitudes as
 * integers (the order of the magnitudes' bits is theirs, +inf's above every finite one and NaN's above
 * it). The first takes the largest |x| of all: below INF, there is no NaN and no infinite entry, and
 * that is the answer. Otherwise the second (``exact``) takes the largest below INF and tells NaN (above
 * it) and +inf (INF, sign 0) from -inf, which is allowed: it forbids a part. */
#define SCAN(T, U, VI, LANES, ABS, INF)                                                                   \
    INLINE U largest_##T(const T *x, Py_ssize_t count, int exact, Stats *s) {                             \
        const VI zero = {0}, inf = zero + (U)(INF);                                                       \
        VI big[4] = {zero, zero, zero, zero}, nans = zero, posinfs = zero;                                \
        Py_ssize_t i = 0;                                                                                 \
        for (; i + 4 * LANES <= count; i += 4 * LANES)                                                    \
            for (int u = 0; u < 4; u++) {                                                                 \
                VI b;                                                                                     \
                memcpy(&b, x + i + u * LANES, sizeof b);                                                  \
                const VI v = b & ABS;                                                                     \
                VI up = v > big[u];                                                                       \
                if (exact) {                                                                              \
                    nans |= v > inf;                                                                      \
                    posinfs |= b == inf;                                                                  \
                    up &= v < inf;                                                                        \
                }                                                                                         \
                big[u] = (v & up) | (big[u] & ~up);                                                       \
            }                                                                                             \
        U top = 0;                                                                                        \
        for (int t = 0; t < LANES; t++) {                                                                 \
            for (int u = 0; u < 4; u++) top = (U)big[u][t] > top ? (U)big[u][t] : top;                    \
            s->nan |= nans[t] != 0;                                                                       \
            s->posinf |= posinfs[t] != 0;                                                                 \
        }                                                                                                 \
        for (; i < count; i++) {                                                                          \
            U b;                                                                                          \
            memcpy(&b, x + i, sizeof b);                                                                  \
            const U v = b & ABS;                                                                          \
            if (exact) {                                                                                  \
                s->nan |= v > INF;                                                                        \
                s->posinf |= b == INF;                                                                    \
            }                                                                                             \
            top = v > top && (!exact || v < INF) ? v : top;                                               \
        }                                                                                                 \
        return top;                                                                                       \
    }                                                                                                     \
    INLINE void scan_##T(const T *x, Py_ssize_t count, Stats *s) {                                        \
        U top = largest_##T(x, count, 0, s);                                                              \
        if (top >= INF) top = largest_##T(x, count, 1, s);                                               \
        T largest;                                                                                        \
        memcpy(&largest, &top, sizeof largest);                                                           \
        s->largest = largest;                                                                             \
    }
SCAN(float, uint32_t, vif, LANES_f32, 0x7fffffff, 0x7f800000u)
SCAN(double, uint64_t, vid, LANES_f64, 0x7fffffffffffffffLL, 0x7ff0000000000000ULL)

typedef void ScanFn(const void *x, Py_ssize_t count, int f32, Stats *s);

#define DRIVER(ISA, TARGET)                                                                               \
    TARGET static void scan##ISA(const void *x, Py_ssize_t count, int f32, Stats *s) {                    \
        if (f32) scan_float(x, count, s);                                                                 \
        else scan_double(x, count, s);                                                                    \
    }
DRIVER(_base, )
#if ISAS_X86
DRIVER(_avx2, AVX2)
DRIVER(_avx512, AVX512)
static ScanFn *const RUN[] = {scan_base, scan_avx2, scan_avx512};
#else
static ScanFn *const RUN[] = {scan_base};
#endif

static PyObject *scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "scan(address, count, f32) takes 3 arguments");
        return NULL;
    }
    const void *x = PyLong_AsVoidPtr(args[0]);
    const Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    const int f32 = PyObject_IsTrue(args[2]);
    if (PyErr_Occurred()) return NULL;
    if (!x || count < 0) {
        PyErr_SetString(PyExc_ValueError, "scan: expected a data address and a count >= 0");
        return NULL;
    }
    Stats s = {0, 0, 0.0};
    Py_BEGIN_ALLOW_THREADS
    RUN[isa](x, count, f32, &s);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(OOd)", s.nan ? Py_True : Py_False, s.posinf ? Py_True : Py_False, s.largest);
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(address, count, f32) -> (nan, posinf, largest finite magnitude) of a contiguous float32/float64 buffer"},
    ISA_METHODS
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_values", NULL, -1, methods};

PyMODINIT_FUNC PyInit__values(void) {
    choose_best_isa();
    return PyModule_Create(&module);
}
