/* The checks of the C and C++ test programs: CHECK(cond, printf-style message) counts a pass or
 * prints the failure with the library's last error; a program ends by printing
 * "N passed, M failed". Included once per program. */
#ifndef MRSTACK_TEST_CHECK_H
#define MRSTACK_TEST_CHECK_H

#include <stdio.h>

#include "mrstack.h"

static int passed, failed;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            passed++;                                                           \
        } else {                                                                \
            failed++;                                                           \
            printf("FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);            \
            printf(__VA_ARGS__);                                                \
            printf(" (last error: %s)\n", mrstack_last_error());                \
        }                                                                       \
    } while (0)

#endif
