/* A few lines of test harness for the C tests: CHECK counts and prints
 * failures, EQ says what the two sides were. */
#ifndef BPFMAPS_CHECK_H
#define BPFMAPS_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__,         \
                    __LINE__, #cond);                                      \
            failures++;                                                    \
        }                                                                  \
    } while (0)

#define EQ(got, want)                                                      \
    do {                                                                   \
        long long got_ = (long long)(got), want_ = (long long)(want);      \
        if (got_ != want_) {                                               \
            fprintf(stderr, "%s:%d: %s is %lld, want %s (%lld)\n",         \
                    __FILE__, __LINE__, #got, got_, #want, want_);         \
            failures++;                                                    \
        }                                                                  \
    } while (0)

/* The call returned -e and set errno to e. */
#define ERR(call, e)                                                       \
    do {                                                                   \
        errno = 0;                                                         \
        EQ((call), -(e));                                                  \
        EQ(errno, (e));                                                    \
    } while (0)

#define DONE()                                                             \
    do {                                                                   \
        if (failures)                                                      \
            fprintf(stderr, "%d checks failed\n", failures);               \
        return failures != 0;                                              \
    } while (0)

#endif
