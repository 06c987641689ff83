/* A batch of independent examples split across POSIX threads, for the C extensions' batch drivers
 * (the scans, _scan.c; the matrix-tree theorem, structures/spanning/_matrix_tree_c.c): contiguous
 * parts, the first on the calling thread, one new thread per other part (starting one costs tens
 * of microseconds: the callers ask for parts only where each has enough work). Each example is
 * computed as on one thread, so the results do not depend on the split. */
#ifndef SEMIRING_THREADS_H
#define SEMIRING_THREADS_H

#include <stdint.h>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
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

static void *run_part(void *arg) {
    Part *p = arg;
    p->ok = p->fn(p->args, p->b0, p->b1);
    return NULL;
}

/* fn over the examples [0, B) in `parts` parts (at least 1, at most B and MAX_PARTS; 1 without
 * threads), a part whose thread could not start run on the calling thread; 1 where every part ran */
static int split_batch(PartFn *fn, const void *args, int64_t B, int64_t parts) {
    if (!THREADED || parts > B) parts = THREADED ? B : 1;
    if (parts > MAX_PARTS) parts = MAX_PARTS;
    if (parts < 1) parts = 1;
    Part p[MAX_PARTS];
    for (int64_t i = 0; i < parts; i++) p[i] = (Part){fn, args, B * i / parts, B * (i + 1) / parts, 0};
#if THREADED
    pthread_t ids[MAX_PARTS];
    int started[MAX_PARTS] = {0};
    for (int64_t i = 1; i < parts; i++) started[i] = pthread_create(&ids[i], NULL, run_part, &p[i]) == 0;
    run_part(&p[0]);
    for (int64_t i = 1; i < parts; i++) {
        if (started[i]) pthread_join(ids[i], NULL);
        else run_part(&p[i]);
    }
#else
    run_part(&p[0]);
#endif
    int ok = 1;
    for (int64_t i = 0; i < parts; i++) ok &= p[i].ok;
    return ok;
}

#endif
