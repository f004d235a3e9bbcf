/* Minimal assertion helpers for the simulator's C tests. */
#ifndef TESSERA_SIM_CHECK_H
#define TESSERA_SIM_CHECK_H
#include <stdio.h>
#include <stdlib.h>

static int check_failures;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            check_failures++;                                                        \
        }                                                                            \
    } while (0)

#define CHECK_EQ(a, b)                                                                        \
    do {                                                                                      \
        long long a_ = (long long)(a), b_ = (long long)(b);                                   \
        if (a_ != b_) {                                                                       \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %lld, expected %s == %lld\n",      \
                    __FILE__, __LINE__, #a, a_, #b, b_);                                      \
            check_failures++;                                                                 \
        }                                                                                     \
    } while (0)

#define CHECK_DONE()                                                  \
    do {                                                              \
        if (check_failures) {                                         \
            fprintf(stderr, "%d check(s) failed\n", check_failures);  \
            return 1;                                                 \
        }                                                             \
        printf("ok\n");                                               \
        return 0;                                                     \
    } while (0)
#endif
