/* log Z of the matrix-tree theorem for small graphs, exactly, in C (structures/_tree_partition.py
 * uses it for short sentences, where a handful of small torch calls would cost more than the
 * arithmetic). Built at install time as the optional extension structures._matrix_tree_c
 * (setup.py); without it the torch path runs.
 *
 * The same subtraction-free elimination as structures/_matrix_tree.py (Grassmann, Taksar & Heyman
 * 1985), one word at a time: the pivot of word k is its margin plus its arcs from the words still
 * kept, never a difference, and eliminating k adds A_ik A_kj / d_k to the arcs and g_k A_kj / d_k to
 * the margins. Every quantity is a sum of products of non-negative numbers: each pivot has a
 * relative error below a small multiple of n u whatever the scale, so log Z = Σ log d_k (plus
 * the column shifts) is within ~n^2 u of the exact value. Single root: the words rooted at the
 * most popular head c0 (margins: the arcs out of c0), then Z = det K (r_c0 + Σ_c r_c v_c) with
 * K v = w (the arcs into c0), v by substitution with the same factors (again additions only).
 *
 * log_partition(theta, B, n1, single_root, logz, ok): theta a C-contiguous float64 [B, n1, n1]
 * buffer (theta[b, h, m], row 0 the root; column 0 and the diagonal are ignored), logz a writable
 * float64 [B] and ok a writable uint8 [B]: 0 where a pivot fell below 1e-250 (underflow, or no
 * tree): the caller computes those examples otherwise.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define LOW 1e-250

#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
#define VECTOR_CLONES __attribute__((target_clones("avx2,fma", "default"))) /* chosen at load time */
#else
#define VECTOR_CLONES
#endif

/* row i of the elimination of word k (row and up are different rows of A) */
VECTOR_CLONES static void eliminate_row(double *restrict row, const double *restrict up, Py_ssize_t k, Py_ssize_t n, double dk) {
    const double a = row[k];
    if (a == 0.0) return;
    for (Py_ssize_t j = k + 1; j < n; j++) row[j] += a * up[j];
    row[k] = a / dk; /* Lo[i, k] */
}

/* one example: A [n, n] (A[h * n + m]: arc h -> m between words, 0 on the diagonal), g [n] margins,
 * root [n] the root's weights; returns log Z of the shifted weights, or NAN when a pivot is too small */
static double example(double *A, double *g, const double *root, Py_ssize_t n, int single_root, double *d, double *w) {
    Py_ssize_t c0 = 0;
    if (single_root) {
        double best = -1.0;
        for (Py_ssize_t h = 0; h < n; h++) {
            double s = 0.0;
            for (Py_ssize_t m = 0; m < n; m++) s += A[h * n + m];
            if (s > best) { best = s; c0 = h; }
        }
        /* the words rooted at c0: margins are c0's arcs, c0 itself is eliminated first with pivot 1 */
        for (Py_ssize_t m = 0; m < n; m++) { g[m] = A[c0 * n + m]; w[m] = A[m * n + c0]; }
        for (Py_ssize_t j = 0; j < n; j++) { A[c0 * n + j] = 0.0; A[j * n + c0] = 0.0; }
        g[c0] = 1.0;
        w[c0] = 0.0;
    } else {
        for (Py_ssize_t m = 0; m < n; m++) g[m] = root[m];
    }
    double logdet = 0.0;
    for (Py_ssize_t k = 0; k < n; k++) {
        double dk = g[k];
        for (Py_ssize_t i = k + 1; i < n; i++) dk += A[i * n + k];
        if (!(dk >= LOW) || dk == INFINITY) return NAN;
        d[k] = dk;
        logdet += log(dk);
        double *const up = A + k * n; /* row k becomes Up[k, j] = A_kj / d_k */
        for (Py_ssize_t j = k + 1; j < n; j++) {
            up[j] /= dk;
            g[j] += g[k] * up[j];
        }
        for (Py_ssize_t i = k + 1; i < n; i++) /* rows i > k: A_ij += A_ik Up[k, j], contiguous in j */
            eliminate_row(A + i * n, up, k, n, dk);
    }
    if (!single_root) return logdet;
    /* K = (I - Lo) D (I - Up): v = (I - Up)^{-1} D^{-1} (I - Lo)^{-1} w, additions only */
    for (Py_ssize_t i = 0; i < n; i++)
        for (Py_ssize_t k = 0; k < i; k++) w[i] += A[i * n + k] * w[k];
    for (Py_ssize_t k = 0; k < n; k++) w[k] /= d[k];
    for (Py_ssize_t k = n - 1; k >= 0; k--)
        for (Py_ssize_t j = k + 1; j < n; j++) w[k] += A[k * n + j] * w[j];
    double q = root[c0];
    for (Py_ssize_t c = 0; c < n; c++)
        if (c != c0) q += root[c] * w[c];
    if (!(q >= LOW) || q == INFINITY) return NAN;
    return logdet + log(q);
}

static int solve(const double *theta, Py_ssize_t B, Py_ssize_t n1, int single_root, double *logz, uint8_t *ok) {
    const Py_ssize_t n = n1 - 1;
    double *buf = malloc(sizeof(double) * (n * n + 4 * n + 1));
    if (!buf) return -1;
    double *A = buf, *g = A + n * n, *root = g + n, *d = root + n, *w = d + n;
    for (Py_ssize_t b = 0; b < B; b++) {
        const double *t = theta + b * n1 * n1;
        double shift = 0.0;
        for (Py_ssize_t m = 1; m < n1; m++) { /* each word's heads shifted by their max */
            double c = -INFINITY;
            for (Py_ssize_t h = 0; h < n1; h++)
                if (h != m && t[h * n1 + m] > c) c = t[h * n1 + m];
            if (c == -INFINITY) c = 0.0;
            shift += c;
            root[m - 1] = exp(t[m] - c);
            for (Py_ssize_t h = 1; h < n1; h++) A[(h - 1) * n + (m - 1)] = h == m ? 0.0 : exp(t[h * n1 + m] - c);
        }
        double z = n ? example(A, g, root, n, single_root, d, w) : 0.0;
        ok[b] = !isnan(z);
        logz[b] = z + shift;
    }
    free(buf);
    return 0;
}

static PyObject *log_partition(PyObject *self, PyObject *args) {
    Py_buffer theta, logz, ok;
    Py_ssize_t B, n1;
    int single_root;
    if (!PyArg_ParseTuple(args, "y*nnpw*w*", &theta, &B, &n1, &single_root, &logz, &ok)) return NULL;
    PyObject *result = NULL;
    if (n1 < 1 || theta.len != B * n1 * n1 * (Py_ssize_t)sizeof(double) || logz.len != B * (Py_ssize_t)sizeof(double) || ok.len != B) {
        PyErr_SetString(PyExc_ValueError, "log_partition: expected float64 theta [B, n1, n1], float64 logz [B], uint8 ok [B]");
    } else {
        int status;
        Py_BEGIN_ALLOW_THREADS
        status = solve(theta.buf, B, n1, single_root, logz.buf, ok.buf);
        Py_END_ALLOW_THREADS
        if (status) PyErr_NoMemory(); else result = Py_None, Py_INCREF(Py_None);
    }
    PyBuffer_Release(&theta);
    PyBuffer_Release(&logz);
    PyBuffer_Release(&ok);
    return result;
}

static PyMethodDef methods[] = {
    {"log_partition", log_partition, METH_VARARGS,
     "log_partition(theta, B, n1, single_root, logz, ok): exact log Z of small matrix-tree problems, in place."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_matrix_tree_c", NULL, -1, methods};

PyMODINIT_FUNC PyInit__matrix_tree_c(void) { return PyModule_Create(&module); }
