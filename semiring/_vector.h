/* Vector arithmetic shared by the C extensions of the semirings (the language's levels,
 * language/_kernel.c; the scans, _scan.c): 32-byte vector types, an exact vector exp, and the
 * instruction sets each extension compiles its loops for, one of which it picks when it loads. */
#ifndef SEMIRING_VECTOR_H
#define SEMIRING_VECTOR_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp of 8 floats / 4 doubles at a time (GCC vector extensions: AVX2 where the CPU has it,
 * chosen at load time (ISA_NAMES below), else pairs of SSE2 registers): Cody-Waite reduction x = n ln2 + r, a Taylor
 * polynomial of r (|r| <= ln2/2: degree 7 for float, 13 for double, both below half an ulp), times 2^n
 * built in the exponent bits. Below -87.3 (float) / -708 (double) it gives 0, not the subnormal
 * (weights under 1e-38 / 1e-307 of the largest, which the sums they enter cannot hold anyway);
 * above 88 / 709 the lanes are recomputed by libm (only +inf terms reach there). EXP_F32 and EXP_F64
 * define it for a vector type of any width (ATTR: its functions' target attribute); exp_f32 and
 * exp_f64 are the 32-byte ones, the others (AVX-512's 64 bytes, below) the same operations lane by lane. */
typedef float vf __attribute__((vector_size(32)));
typedef int32_t vif __attribute__((vector_size(32)));
typedef double vd __attribute__((vector_size(32)));
typedef int64_t vid __attribute__((vector_size(32)));
typedef uint64_t vu64 __attribute__((vector_size(32)));
typedef uint32_t vu32 __attribute__((vector_size(32)));
#define LANES_f32 8
#define LANES_f64 4
/* whether any lane of a 32-byte comparison's mask is set, without a branch per lane */
static inline __attribute__((always_inline)) int any_x4(vu64 m) { return (m[0] | m[1] | m[2] | m[3]) != 0; }

#define EXP_F32(NAME, V, VI, VU, ANY, ATTR)                                                                  \
ATTR static inline __attribute__((always_inline)) V NAME(V x) {                                              \
    const V zero = {0}, lo = zero + -87.3f, hi = zero + 88.0f;                                               \
    const VI under = x < lo, over = x > hi; /* (their lanes' garbage, -inf's NaN included, is replaced below) */ \
    const V magic = zero + 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */                     \
    V fx = x * 1.44269504088896341f + magic;                                                                 \
    VI e = (VI)((((VU)fx - 0x4B400000u) + 127u) << 23); /* (unsigned: out-of-range lanes wrap, no overflow) */ \
    V n = fx - magic;                                                                                        \
    V r = x - n * 0.693359375f - n * -2.12194440e-4f;                                                        \
    V r2 = r * r, r4 = r2 * r2; /* Estrin's scheme: a shorter chain of dependent operations */               \
    V p = ((r + 1.0f) + r2 * (0.5f + r * (1.0f / 6))) + r4 * ((1.0f / 24 + r * (1.0f / 120)) + r2 * (1.0f / 720 + r * (1.0f / 5040))); \
    V y = p * (V)e;                                                                                          \
    y = (V)((VI)y & ~under);                                                                                 \
    if (__builtin_expect(ANY(over), 0))                                                                      \
        for (unsigned i = 0; i < sizeof x / sizeof x[0]; i++) if (over[i]) y[i] = expf(x[i]);              \
    return y;                                                                                                \
}

#define EXP_F64(NAME, V, VI, VU, ANY, ATTR)                                                                  \
ATTR static inline __attribute__((always_inline)) V NAME(V x) {                                              \
    const V zero = {0}, lo = zero + -708.0, hi = zero + 709.0;                                               \
    const VI under = x < lo, over = x > hi; /* (their lanes' garbage, -inf's NaN included, is replaced below) */ \
    const V magic = zero + 6755399441055744.0; /* 1.5 * 2^52 */                                              \
    V fx = x * 1.4426950408889634074 + magic;                                                                \
    VI e = (VI)((((VU)fx - 0x4338000000000000ULL) + 1023u) << 52); /* (unsigned: as above) */                \
    V n = fx - magic;                                                                                        \
    V r = x - n * 6.93145751953125e-1 - n * 1.42860682030941723212e-6;                                       \
    V r2 = r * r, r4 = r2 * r2, r8 = r4 * r4; /* Estrin's scheme, coefficients 1/k! */                       \
    V p = ((r + 1.0) + r2 * (1.0 / 2 + r * (1.0 / 6))) + r4 * ((1.0 / 24 + r * (1.0 / 120)) + r2 * (1.0 / 720 + r * (1.0 / 5040))) \
         + r8 * (((1.0 / 40320 + r * (1.0 / 362880)) + r2 * (1.0 / 3628800 + r * (1.0 / 39916800)))        \
                 + r4 * (1.0 / 479001600 + r * (1.0 / 6227020800.0)));                                       \
    V y = p * (V)e;                                                                                          \
    y = (V)((VI)y & ~under);                                                                                 \
    if (__builtin_expect(ANY(over), 0))                                                                      \
        for (unsigned i = 0; i < sizeof x / sizeof x[0]; i++) if (over[i]) y[i] = exp(x[i]);               \
    return y;                                                                                                \
}

/* log of 8 floats / 4 doubles at a time (LOG_F32 and LOG_F64 define it for a vector type of any width, as
 * EXP_F32 does): x = 2^k m with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s) = 2s + s R(s^2), s = (m-1)/(m+1),
 * |s| <= 0.172, R's Taylor series to s^8 (float) / s^20 (double), summed as fdlibm does (2s = f - f^2/2 + s f^2/2,
 * f = m - 1 exact: the division's rounding only in the small terms), k ln 2 in two parts: within an ulp of
 * libm's. 0 gives -inf; subnormal, infinite, negative and NaN lanes are recomputed by libm. */
#define LOG_F32(NAME, V, VI, ANY, ATTR)                                                                      \
ATTR static inline __attribute__((always_inline)) V NAME(V x) {                                              \
    const V zero = {0};                                                                                      \
    const VI bits = (VI)x, big_m = ((bits & 0x007fffff) | 0x3f800000) > 0x3fb504f3; /* m > sqrt 2 */         \
    const V m = (V)((bits & 0x007fffff) | (0x3f800000 - (big_m & 0x00800000))); /* halved where big */    \
    const V k = __builtin_convertvector(((bits >> 23) & 0xff) - 127 - big_m, V);                             \
    const V f = m - 1.0f, s = f / (f + 2.0f), z = s * s;                                                    \
    const V R = z * (2.0f / 3 + z * (2.0f / 5 + z * (2.0f / 7 + z * (2.0f / 9))));                          \
    const V hfsq = 0.5f * f * f;                                                                             \
    V y = k * 0.693359375f - ((hfsq - (s * (hfsq + R) + k * -2.12194440e-4f)) - f);                          \
    const VI zeros = x == zero, odd = ~(((x >= zero + 1.17549435e-38f) & (x <= zero + 3.40282347e38f)) | zeros); \
    y = (V)(((VI)(zero - INFINITY) & zeros) | ((VI)y & ~zeros));                                             \
    if (__builtin_expect(ANY(odd), 0))                                                                       \
        for (unsigned i = 0; i < sizeof x / sizeof x[0]; i++) if (odd[i]) y[i] = logf(x[i]);               \
    return y;                                                                                                \
}

#define LOG_F64(NAME, V, VI, ANY, ATTR)                                                                      \
ATTR static inline __attribute__((always_inline)) V NAME(V x) {                                              \
    const V zero = {0};                                                                                      \
    const VI bits = (VI)x, mb = (bits & 0x000fffffffffffffLL) | 0x3ff0000000000000LL;                          \
    const VI big_m = mb > 0x3ff6a09e667f3bccLL; /* m > sqrt 2 */                                             \
    const V m = (V)(mb - (big_m & 0x0010000000000000LL)); /* halved where big */                             \
    /* k as a double without a 64-bit integer conversion: the exponent bits below 2^52's mantissa */         \
    const V k = (V)(((bits >> 52) & 0x7ff) | 0x4330000000000000LL) - (4503599627370496.0 + 1023) + (V)(big_m & 0x3ff0000000000000LL); \
    const V f = m - 1.0, s = f / (f + 2.0), z = s * s;                                                      \
    const V R = z * (2.0 / 3 + z * (2.0 / 5 + z * (2.0 / 7 + z * (2.0 / 9 + z * (2.0 / 11 + z * (2.0 / 13       \
              + z * (2.0 / 15 + z * (2.0 / 17 + z * (2.0 / 19 + z * (2.0 / 21))))))))));                      \
    const V hfsq = 0.5 * f * f;                                                                              \
    V y = k * 6.93147180369123816490e-01 - ((hfsq - (s * (hfsq + R) + k * 1.90821492927058770002e-10)) - f); \
    const VI zeros = x == zero, odd = ~(((x >= zero + 2.2250738585072014e-308) & (x <= zero + 1.7976931348623157e308)) | zeros); \
    y = (V)(((VI)(zero - INFINITY) & zeros) | ((VI)y & ~zeros));                                             \
    if (__builtin_expect(ANY(odd), 0))                                                                       \
        for (unsigned i = 0; i < sizeof x / sizeof x[0]; i++) if (odd[i]) y[i] = log(x[i]);                \
    return y;                                                                                                \
}

#define ANY_X4(mask) any_x4((vu64)(mask))
EXP_F32(exp_f32, vf, vif, vu32, ANY_X4, )
EXP_F64(exp_f64, vd, vid, vu64, ANY_X4, )
LOG_F32(log_f32, vf, vif, ANY_X4, )
LOG_F64(log_f64, vd, vid, ANY_X4, )

/* The instruction sets: SSE2 (x86-64's baseline, or another CPU's own) and, on x86-64, AVX2 with
 * FMA and AVX-512 (an extension compiles its loops once per set, with TARGET's attribute). The vectors
 * stay 32 bytes wide; AVX2 holds one in a register, FMA fuses the polynomials' multiply-adds (one
 * rounding per term), AVX-512 adds 32 registers and masks */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
#define ISAS_X86 1
/* AVX-512's own width, for loops whose rows are a multiple of it (the scans'): 16 floats / 8 doubles */
typedef float vf16 __attribute__((vector_size(64)));
typedef int32_t vif16 __attribute__((vector_size(64)));
typedef double vd8 __attribute__((vector_size(64)));
typedef int64_t vid8 __attribute__((vector_size(64)));
typedef uint32_t vu32x16 __attribute__((vector_size(64)));
typedef uint64_t vu64x8 __attribute__((vector_size(64)));
/* (AVX-512's mask test: extracting and or-ing eight 64-bit lanes took a sixth of the scans' forward) */
AVX512 static inline __attribute__((always_inline)) int any_x8(__m512i m) { return _mm512_test_epi64_mask(m, m) != 0; }
#define ANY_X8(mask) any_x8((__m512i)(mask))
EXP_F32(exp_f32x16, vf16, vif16, vu32x16, ANY_X8, AVX512)
EXP_F64(exp_f64x8, vd8, vid8, vu64x8, ANY_X8, AVX512)
LOG_F32(log_f32x16, vf16, vif16, ANY_X8, AVX512)
LOG_F64(log_f64x8, vd8, vid8, ANY_X8, AVX512)
static const char *const ISA_NAMES[] = {"sse2", "avx2+fma", "avx512"};

/* whether the CPU runs instruction set i */
static int has_isa(int i) {
    __builtin_cpu_init();
    if (i >= 1 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return 0;
    if (i >= 2 && !(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))) return 0;
    return 1;
}
#else
#define ISAS_X86 0
static const char *const ISA_NAMES[] = {"generic"};
static int has_isa(int i) { return i == 0; }
#endif
#define N_ISAS ((int)(sizeof ISA_NAMES / sizeof ISA_NAMES[0])) /* (an extension's table per set has as many rows) */

/* The instruction set in use, an index of ISA_NAMES: the CPU's best when the module loads
 * (choose_best_isa()), or the one set_isa() chose. The module's Python functions isas(), isa() and
 * set_isa(name) below read and set it (an extension including this header includes Python.h first). */
static int isa;

static void choose_best_isa(void) {
    for (int i = 0; i < N_ISAS; i++) if (has_isa(i)) isa = i;
}

static PyObject *isas(PyObject *self, PyObject *args) {
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i < N_ISAS; i++) {
        if (!has_isa(i)) continue;
        PyObject *name = PyUnicode_FromString(ISA_NAMES[i]);
        if (!name || PyList_Append(out, name) < 0) Py_CLEAR(out);
        Py_XDECREF(name);
    }
    return out;
}

static PyObject *get_isa(PyObject *self, PyObject *args) { return PyUnicode_FromString(ISA_NAMES[isa]); }

static PyObject *set_isa(PyObject *self, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    for (int i = 0; i < N_ISAS; i++) {
        if (strcmp(name, ISA_NAMES[i]) == 0 && has_isa(i)) {
            isa = i;
            Py_RETURN_NONE;
        }
    }
    PyErr_Format(PyExc_ValueError, "isa: %s is not one of this CPU's (isas())", name);
    return NULL;
}

#define ISA_METHODS                                                                                         \
    {"isas", isas, METH_NOARGS, "isas(): the instruction sets the module can run on this CPU, best last"},  \
    {"isa", get_isa, METH_NOARGS, "isa(): the instruction set in use (the CPU's best unless set_isa chose another)"}, \
    {"set_isa", set_isa, METH_VARARGS, "set_isa(name): run on one of isas()"},

#endif
