/* A batch of independent examples split across threads, for the C extensions' batch drivers (the
 * scans, _scan.c; the matrix-tree theorem, structures/spanning/_matrix_tree_c.c): contiguous parts
 * on the OpenMP runtime that torch's own operations use (setup.py builds with OpenMP where the
 * compiler has it; torch's wheel loads its libgomp first, and the extensions share it). POSIX
 * threads of our own, before, competed for the cores with torch's workers, which spin after each
 * parallel operation. Without OpenMP the parts run on the calling thread. Each example is computed
 * as on one thread, so the results do not depend on the split. */
#ifndef SEMIRING_THREADS_H
#define SEMIRING_THREADS_H

#include <stdint.h>

#if defined(_OPENMP)
#define THREADED 1
#else
#define THREADED 0
#endif

#define MAX_PARTS 64

/* runs the examples [b0, b1) of the batch that args describes; 0 where it could not (no memory) */
typedef int PartFn(const void *args, int64_t b0, int64_t b1);

typedef struct {
    PartFn *fn;
    const void *args;
    int64_t b0, b1;
    int ok;
} Part;

static void run_part(Part *p) { p->ok = p->fn(p->args, p->b0, p->b1); }

/* fn over the examples [0, B) in `parts` parts (at least 1, at most B and MAX_PARTS; 1 without
 * threads), one thread each; 1 where every part ran */
static int split_batch(PartFn *fn, const void *args, int64_t B, int64_t parts) {
    if (!THREADED) parts = 1;
    if (parts > B) parts = B;
    if (parts > MAX_PARTS) parts = MAX_PARTS;
    if (parts <= 1) return fn(args, 0, B); /* on the calling thread, without a parallel region */
    Part p[MAX_PARTS];
    for (int64_t i = 0; i < parts; i++) p[i] = (Part){fn, args, B * i / parts, B * (i + 1) / parts, 0};
#pragma omp parallel for schedule(static, 1) num_threads(parts)
    for (int64_t i = 0; i < parts; i++) run_part(&p[i]);
    int ok = 1;
    for (int64_t i = 0; i < parts; i++) ok &= p[i].ok;
    return ok;
}

#endif
