/* Tarjan's dense maximum arborescence (structures/decode/arborescence.py, _tarjan) in C: the same
 * algorithm, the same weights and the same tie-breaking, as one loop in machine code instead of
 * O(n) numpy calls on rows. Built at install time as the optional extension
 * structures.decode._tarjan_c (setup.py); without it the numpy version runs.
 *
 * tarjan(Wt, Ws, lex, root_last, heads): Wt and Ws are C-contiguous float64 [n1, n1] buffers laid
 * out by incoming arcs (W[m, h]: the arc h -> m), Wt the exact integer tiers (read only with lex),
 * Ws the scores; heads a writable int64 [n1] buffer that receives the head of every node (0 at 0).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXCL (-1125899906842624.0) /* -(2**50): tier of the arcs that do not exist */

typedef struct {
    Py_ssize_t n1;
    int lex, root_last;
    double *Is, *It; /* [cap, n1]: reduced weights of the best arc from each original node */
    int64_t *Im;     /* [cap, n1]: ... and its modifier (original node) */
    double *in_t, *in_s;
} Graph;

/* the best incoming arc of super-node x: its original source; its tier and score in *t, *s */
static Py_ssize_t best_in(const Graph *g, Py_ssize_t x, double *t, double *s) {
    const Py_ssize_t n1 = g->n1;
    const double *rs = g->Is + x * n1;
    Py_ssize_t u = 0;
    if (g->lex) {
        const double *rt = g->It + x * n1;
        double tm = -INFINITY, best = -INFINITY;
        int found = 0;
        for (Py_ssize_t j = 0; j < n1; j++)
            if (rt[j] > tm) tm = rt[j];
        for (Py_ssize_t j = 0; j < n1; j++)
            if (rt[j] == tm && (!found || rs[j] > best)) { best = rs[j]; u = j; found = 1; }
        *t = tm;
        *s = best;
        return u;
    }
    Py_ssize_t start = g->root_last ? 1 : 0;
    double best = -INFINITY;
    u = -1;
    for (Py_ssize_t j = start; j < n1; j++)
        if (u < 0 || rs[j] > best) { best = rs[j]; u = j; }
    if (g->root_last && best == -INFINITY) { u = 0; best = rs[0]; }
    *t = 0.0;
    *s = best;
    return u;
}

static int solve(const double *Wt, const double *Ws, Py_ssize_t n1, int lex, int root_last, int64_t *heads) {
    const Py_ssize_t cap = 2 * n1;
    heads[0] = 0;
    if (n1 <= 1) return 0;
    Graph g = {n1, lex, root_last, NULL, NULL, NULL, NULL, NULL};
    g.Is = malloc(sizeof(double) * cap * n1);
    g.It = lex ? malloc(sizeof(double) * cap * n1) : NULL;
    g.Im = malloc(sizeof(int64_t) * cap * n1);
    int64_t *ibuf = malloc(sizeof(int64_t) * (n1 + 9 * cap));
    double *dbuf = malloc(sizeof(double) * 2 * cap);
    char *flags = calloc(2 * cap, 1);
    if (!g.Is || (lex && !g.It) || !g.Im || !ibuf || !dbuf || !flags) {
        free(g.Is); free(g.It); free(g.Im); free(ibuf); free(dbuf); free(flags);
        return -1;
    }
    int64_t *top = ibuf, *first = top + n1, *last = first + cap, *nxt_mem = last + cap;
    int64_t *cyc_nodes = nxt_mem + cap, *cyc_start = cyc_nodes + cap, *cyc_len = cyc_start + cap;
    int64_t *in_h = cyc_len + cap, *in_m = in_h + cap, *path = in_m + cap;
    g.in_t = dbuf;
    g.in_s = dbuf + cap;
    char *done = flags, *onpath = flags + cap;
    memcpy(g.Is, Ws, sizeof(double) * n1 * n1);
    if (lex) memcpy(g.It, Wt, sizeof(double) * n1 * n1);
    for (Py_ssize_t v = 0; v < n1; v++) {
        for (Py_ssize_t j = 0; j < n1; j++) g.Im[v * n1 + j] = v;
        top[v] = first[v] = last[v] = v;
    }
    memset(cyc_len, 0, sizeof(int64_t) * cap);
    Py_ssize_t n_cyc = 0, nxt = n1;
    done[0] = 1;
    for (Py_ssize_t start = 1; start < n1; start++) {
        Py_ssize_t x = top[start];
        if (done[x]) continue;
        Py_ssize_t plen = 1;
        path[0] = x;
        onpath[x] = 1;
        for (;;) {
            double t, s;
            Py_ssize_t u = best_in(&g, x, &t, &s);
            g.in_t[x] = t;
            g.in_s[x] = s;
            in_h[x] = u;
            in_m[x] = g.Im[x * n1 + u];
            Py_ssize_t y = top[u];
            if (done[y]) { /* the path hangs from the finished part: it is final */
                for (Py_ssize_t i = 0; i < plen; i++) { done[path[i]] = 1; onpath[path[i]] = 0; }
                break;
            }
            if (!onpath[y]) {
                path[plen++] = y;
                onpath[y] = 1;
                x = y;
                continue;
            }
            /* a cycle: contract the path from y on into a new super-node c */
            Py_ssize_t i = plen - 1;
            while (path[i] != y) i--;
            Py_ssize_t c = nxt++;
            cyc_start[c] = n_cyc;
            cyc_len[c] = plen - i;
            for (Py_ssize_t k = i; k < plen; k++) { cyc_nodes[n_cyc++] = path[k]; onpath[path[k]] = 0; }
            plen = i;
            /* the row of c: for every source, the best reduced arc into a member (first wins ties) */
            double *cs = g.Is + c * n1, *ct = lex ? g.It + c * n1 : NULL;
            int64_t *cm = g.Im + c * n1;
            for (Py_ssize_t j = 0; j < n1; j++) {
                double bt = -INFINITY, bs = -INFINITY;
                int64_t bm = -1;
                for (Py_ssize_t k = 0; k < cyc_len[c]; k++) {
                    Py_ssize_t v = cyc_nodes[cyc_start[c] + k];
                    double st = lex ? g.It[v * n1 + j] - g.in_t[v] : 0.0;
                    double ss = g.Is[v * n1 + j] - g.in_s[v];
                    if (bm < 0 || st > bt || (st == bt && ss > bs)) { bt = st; bs = ss; bm = g.Im[v * n1 + j]; }
                }
                cs[j] = bs;
                if (lex) ct[j] = bt;
                cm[j] = bm;
            }
            /* members of c: those of its cycle, in cycle order */
            Py_ssize_t prev = -1;
            for (Py_ssize_t k = 0; k < cyc_len[c]; k++) {
                Py_ssize_t v = cyc_nodes[cyc_start[c] + k];
                if (prev < 0) first[c] = first[v]; else nxt_mem[last[prev]] = first[v];
                prev = v;
            }
            last[c] = last[prev];
            for (Py_ssize_t w = first[c];; w = nxt_mem[w]) {
                top[w] = c;
                if (lex) ct[w] = EXCL; else cs[w] = -INFINITY;
                if (w == last[c]) break;
            }
            path[plen++] = c;
            onpath[c] = 1;
            x = c;
        }
    }
    /* expansion, outermost super-node first: the child holding the entering arc's modifier takes
     * that arc, the other children of the cycle keep their cycle arcs (top becomes the super-node
     * of every original node at the level being undone) */
    for (Py_ssize_t c = nxt - 1; c >= n1; c--) {
        for (Py_ssize_t k = 0; k < cyc_len[c]; k++) {
            Py_ssize_t w = cyc_nodes[cyc_start[c] + k];
            for (Py_ssize_t m = first[w];; m = nxt_mem[m]) {
                top[m] = w;
                if (m == last[w]) break;
            }
        }
        Py_ssize_t v = top[in_m[c]];
        for (Py_ssize_t k = 0; k < cyc_len[c]; k++) {
            Py_ssize_t w = cyc_nodes[cyc_start[c] + k];
            if (w == v) { in_h[w] = in_h[c]; in_m[w] = in_m[c]; }
        }
    }
    for (Py_ssize_t v = 1; v < n1; v++) heads[v] = in_h[v];
    free(g.Is); free(g.It); free(g.Im); free(ibuf); free(dbuf); free(flags);
    return 0;
}

static PyObject *tarjan(PyObject *self, PyObject *args) {
    Py_buffer wt, ws, out;
    int lex, root_last;
    if (!PyArg_ParseTuple(args, "y*y*ppw*", &wt, &ws, &lex, &root_last, &out)) return NULL;
    Py_ssize_t n1 = out.len / (Py_ssize_t)sizeof(int64_t);
    PyObject *result = NULL;
    if (ws.len != n1 * n1 * (Py_ssize_t)sizeof(double) || (lex && wt.len != ws.len)) {
        PyErr_SetString(PyExc_ValueError, "tarjan: expected float64 [n1, n1] weights and an int64 [n1] output");
    } else {
        int status;
        Py_BEGIN_ALLOW_THREADS
        status = solve(wt.buf, ws.buf, n1, lex, root_last, out.buf);
        Py_END_ALLOW_THREADS
        if (status) PyErr_NoMemory(); else result = Py_None, Py_INCREF(Py_None);
    }
    PyBuffer_Release(&wt);
    PyBuffer_Release(&ws);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"tarjan", tarjan, METH_VARARGS, "tarjan(Wt, Ws, lex, root_last, heads): Tarjan's maximum arborescence, heads in place."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tarjan_c", NULL, -1, methods};

PyMODINIT_FUNC PyInit__tarjan_c(void) { return PyModule_Create(&module); }
