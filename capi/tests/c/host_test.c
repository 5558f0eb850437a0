/* mrstack's C API driven from C, on host-only stacks (`system`, `simulated`): what CI runs
 * (capi/tests/c_program.rs builds and runs it). Bad configs, bad frees, zero sizes, forged and
 * destroyed handles, threads, every client's entry points, the report and the log; in runs of
 * their own, the causes the clients' void frees report and a log that cannot be written. Prints
 * one line per failed check and ends with "N passed, M failed". */
#include "mrstack.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static int contains(const char *haystack, const char *needle) {
    return haystack && strstr(haystack, needle) != NULL;
}

/* The stack's statistics JSON, in a static buffer. */
static const char *stats(MrstackStack *s) {
    static char buf[4096];
    size_t n = mrstack_statistics_json(s, buf, sizeof buf);
    if (n >= sizeof buf) buf[0] = 0;
    return buf;
}

static void bad_configs(void) {
    CHECK(mrstack_create(NULL) == NULL, "null config");
    CHECK(contains(mrstack_last_error(), "null"), "names the null");
    CHECK(mrstack_create("system > pool(initial=2MiB, max=1MiB)") == NULL, "contradiction");
    CHECK(contains(mrstack_last_error(), "column"), "names the column");
    CHECK(mrstack_create("no_such_leaf") == NULL, "unknown leaf");
    CHECK(contains(mrstack_last_error(), "no_such_leaf"), "names it");
    CHECK(mrstack_create("pool > system") == NULL, "adaptor first");
    CHECK(mrstack_create("") == NULL, "empty");
    CHECK(mrstack_create("\xff\xfe") == NULL, "not UTF-8");
    CHECK(mrstack_create_ex("system", -1, NULL) == NULL, "negative device");
    CHECK(mrstack_create_ex("system", 0, "/no/such/dir/log.csv") == NULL, "unwritable log");
    CHECK(contains(mrstack_last_error(), "/no/such/dir"), "names the path");
}

static void allocate_write_free(void) {
    MrstackStack *s = mrstack_create("system > pool(initial=1MiB) > binning");
    CHECK(s != NULL, "system stack");
    CHECK(mrstack_properties(s) == MRSTACK_HOST, "host memory only: %d", mrstack_properties(s));
    char text[256];
    size_t n = mrstack_describe(s, text, sizeof text);
    CHECK(n > 0 && contains(text, "system > pool(initial=1 MiB) > binning(min=256 B, max=1 MiB) (gives HostAccessible"), "describe: %s", text);
    CHECK(mrstack_describe(s, NULL, 0) == n, "length without a buffer");
    char tiny[4];
    CHECK(mrstack_describe(s, tiny, sizeof tiny) == n && strlen(tiny) == 3, "truncated, NUL-ended");

    enum { N = 1000 };
    static unsigned char *blocks[N];
    for (int i = 0; i < N; i++) {
        size_t size = 1 + (size_t)(i * 37 % 5000);
        blocks[i] = mrstack_allocate(s, size, (size_t)1 << (i % 9), NULL);
        CHECK(blocks[i] != NULL, "allocation %d", i);
        CHECK(((size_t)blocks[i] & (((size_t)1 << (i % 9)) - 1)) == 0, "aligned %d", i);
        memset(blocks[i], i & 0xff, size);
    }
    for (int i = 0; i < N; i++) {
        size_t size = 1 + (size_t)(i * 37 % 5000);
        int ok = 1;
        for (size_t j = 0; j < size; j++) ok &= blocks[i][j] == (unsigned char)(i & 0xff);
        CHECK(ok, "block %d kept its bytes", i);
        CHECK(mrstack_deallocate(s, blocks[i], size, (size_t)1 << (i % 9), NULL) == 0, "free %d", i);
    }
    CHECK(contains(stats(s), "\"live_blocks\":0,\"live_bytes\":0"), "%s", stats(s));
    CHECK(contains(stats(s), "\"allocations\":1000,\"deallocations\":1000"), "%s", stats(s));
    CHECK(mrstack_destroy(s) == 0, "destroy");
}

static void bad_input(void) {
    MrstackStack *s = mrstack_create("simulated(capacity=64MiB) > pool");
    CHECK(s != NULL, "simulated stack");
    CHECK(mrstack_properties(s) == 0, "simulated memory is nobody's");
    /* Zero bytes: null, not an error; freeing null is nothing. */
    CHECK(mrstack_allocate(s, 0, 0, NULL) == NULL, "zero size");
    CHECK(mrstack_deallocate(s, NULL, 0, 0, NULL) == 0, "free null");
    /* Alignments. */
    CHECK(mrstack_allocate(s, 64, 3, NULL) == NULL, "alignment 3");
    CHECK(contains(mrstack_last_error(), "power of two"), "says why");
    void *p = mrstack_allocate(s, 1000, 0, NULL);
    CHECK(p != NULL, "alignment 0 is any");
    /* Bad frees: a foreign pointer, a wrong size, then a double free. */
    int local;
    CHECK(mrstack_deallocate(s, &local, 4, 4, NULL) == -1, "foreign pointer");
    CHECK(contains(mrstack_last_error(), "not a live block"), "says why");
    CHECK(mrstack_deallocate(s, p, 999, 0, NULL) == -1, "wrong size");
    CHECK(contains(mrstack_last_error(), "allocated with size 1000"), "says what it was");
    CHECK(mrstack_deallocate(s, p, 1000, 0, NULL) == 0, "right size");
    CHECK(mrstack_deallocate(s, p, 1000, 0, NULL) == -1, "double free");
    /* Out of memory is an error, and the stack goes on. */
    CHECK(mrstack_allocate(s, (size_t)1 << 40, 0, NULL) == NULL, "too much");
    CHECK(contains(mrstack_last_error(), "out of memory") || contains(mrstack_last_error(), "Out of memory") ||
              contains(mrstack_last_error(), "memory"), "says so");
    CHECK(mrstack_allocate(s, (size_t)-1, 0, NULL) == NULL, "SIZE_MAX");
    p = mrstack_allocate(s, 4096, 256, NULL);
    CHECK(p != NULL, "goes on after a failure");
    CHECK(mrstack_deallocate(s, p, 4096, 256, NULL) == 0, "free");
    CHECK(contains(stats(s), "\"bad_frees\":3"), "%s", stats(s));
    CHECK(contains(stats(s), "\"failed_allocations\":3"), "%s", stats(s));
    CHECK(contains(stats(s), "\"live_blocks\":0"), "%s", stats(s));
    /* Handles: null, forged, destroyed. A block left live goes back at destroy. */
    CHECK(mrstack_allocate(NULL, 8, 0, NULL) == NULL, "null handle");
    CHECK(mrstack_allocate((MrstackStack *)&local, 8, 0, NULL) == NULL, "forged handle");
    CHECK(contains(mrstack_last_error(), "not a live stack"), "says why");
    CHECK(mrstack_allocate(s, 100, 0, NULL) != NULL, "left live");
    CHECK(mrstack_destroy(s) == 0, "destroy");
    CHECK(mrstack_destroy(s) == -1, "destroy twice");
    CHECK(mrstack_allocate(s, 8, 0, NULL) == NULL, "use after destroy");
    CHECK(mrstack_statistics_json(s, NULL, 0) == 0, "statistics after destroy");
    CHECK(mrstack_properties(s) == -1, "properties after destroy");
    /* A stack made after a destroy never gets the destroyed one's handle, so a stale handle
       cannot reach (or destroy) it, even where the allocator reuses the address. */
    {
        MrstackStack *next = mrstack_create("system > pool");
        CHECK(next != NULL && next != s, "a new handle");
        CHECK(mrstack_destroy(s) == -1, "a stale destroy");
        CHECK(mrstack_allocate(s, 8, 0, NULL) == NULL, "a stale allocate");
        p = mrstack_allocate(next, 64, 0, NULL);
        CHECK(p != NULL, "the new stack serves");
        CHECK(mrstack_deallocate(next, p, 64, 0, NULL) == 0, "and frees");
        CHECK(mrstack_destroy(next) == 0, "destroy the new one");
    }
}

static MrstackStack *shared;

static void *worker(void *arg) {
    size_t seed = (size_t)arg * 2654435761u;
    void *held[64] = {0};
    size_t sizes[64] = {0};
    for (int i = 0; i < 20000; i++) {
        seed = seed * 6364136223846793005u + 1442695040888963407u;
        int k = (int)((seed >> 33) % 64);
        if (held[k]) {
            if (mrstack_deallocate(shared, held[k], sizes[k], 0, NULL) != 0) return (void *)1;
            held[k] = NULL;
        } else {
            sizes[k] = 1 + (size_t)((seed >> 20) % 100000);
            held[k] = mrstack_allocate(shared, sizes[k], 0, NULL);
            if (!held[k]) return (void *)2;
            memset(held[k], k, sizes[k] < 64 ? sizes[k] : 64);
        }
    }
    for (int k = 0; k < 64; k++)
        if (held[k] && mrstack_deallocate(shared, held[k], sizes[k], 0, NULL) != 0) return (void *)3;
    return NULL;
}

static void threads(void) {
    shared = mrstack_create("system > pool > binning");
    CHECK(shared != NULL, "stack");
    pthread_t t[8];
    for (long i = 0; i < 8; i++) pthread_create(&t[i], NULL, worker, (void *)(i + 1));
    for (int i = 0; i < 8; i++) {
        void *r;
        pthread_join(t[i], &r);
        CHECK(r == NULL, "thread %d: %ld", i, (long)r);
    }
    CHECK(contains(stats(shared), "\"live_blocks\":0,\"live_bytes\":0"), "%s", stats(shared));
    CHECK(contains(stats(shared), "\"bad_frees\":0"), "%s", stats(shared));
    CHECK(mrstack_destroy(shared) == 0, "destroy");
}

static void clients(const char *report, const char *log) {
    MrstackStack *host = mrstack_create("system > binning");
    /* CuPy: no size on free. */
    void *p = mrstack_cupy_malloc(host, 1000, 0);
    CHECK(p != NULL && ((size_t)p % 256) == 0, "cupy malloc, 256-aligned");
    mrstack_cupy_free(host, p, 0);
    CHECK(contains(stats(host), "\"live_blocks\":0"), "cupy free found the size");
    /* CV-CUDA: a host stack serves host requests and refuses device ones at creation. */
    CHECK(mrstack_cvcuda_check(host, MRSTACK_CVCUDA_HOST) == 0, "host allocator");
    CHECK(mrstack_cvcuda_check(host, MRSTACK_CVCUDA_DEVICE) == -1, "device refused");
    CHECK(contains(mrstack_last_error(), "cannot serve"), "says why");
    CHECK(mrstack_cvcuda_check(host, MRSTACK_CVCUDA_HOST_PINNED) == -1, "pinned refused");
    CHECK(mrstack_cvcuda_check(host, 99) == -1, "unknown type");
    p = mrstack_cvcuda_alloc(host, 4096, 512);
    CHECK(p != NULL && ((size_t)p % 512) == 0, "cvcuda alloc");
    CHECK(mrstack_cvcuda_alloc(host, -1, 16) == NULL, "negative size");
    mrstack_cvcuda_free(host, p, 4096, 512);
    /* TensorRT: size 0 is null, alignment 0 is any, free needs no size. */
    CHECK(mrstack_trt_allocate(host, 0, 0, 0, NULL) == NULL, "size 0");
    p = mrstack_trt_allocate(host, 12345, 0, 0, NULL);
    CHECK(p != NULL, "alignment 0");
    CHECK(mrstack_trt_deallocate(host, p, NULL), "free");
    CHECK(!mrstack_trt_deallocate(host, p, NULL), "double free is false");
    CHECK(contains(stats(host), "\"live_blocks\":0"), "%s", stats(host));
    mrstack_destroy(host);

    /* PyTorch: per-device stacks from the environment, logged and reported. A host stack, which
       the doors refuse unless told that no kernel will run. */
    setenv("MRSTACK_STACK", "system > pool > binning", 1);
    setenv("MRSTACK_LOG", log, 1);
    setenv("MRSTACK_REPORT", report, 1);
    CHECK(mrstack_torch_malloc(8, 0, NULL) == NULL, "a host stack refused");
    CHECK(contains(mrstack_last_error(), "MRSTACK_ALLOW_HOST_MEMORY"), "%s", mrstack_last_error());
    /* MRSTACK_ALLOW_HOST_MEMORY is a boolean: a false value refuses as no value does, and a value
       that is neither is an error naming the variable and the value. */
    {
        static const char *const no[] = {"0", "false", "No", "OFF", ""};
        for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
            setenv("MRSTACK_ALLOW_HOST_MEMORY", no[i], 1);
            CHECK(mrstack_torch_malloc(8, 0, NULL) == NULL, "refused with \"%s\"", no[i]);
            CHECK(contains(mrstack_last_error(), "MRSTACK_ALLOW_HOST_MEMORY"), "\"%s\"", no[i]);
            CHECK(mrstack_device_stack(0) == NULL, "no handle with \"%s\"", no[i]);
        }
        setenv("MRSTACK_ALLOW_HOST_MEMORY", "maybe", 1);
        CHECK(mrstack_torch_malloc(8, 0, NULL) == NULL, "\"maybe\" is no boolean");
        CHECK(contains(mrstack_last_error(), "MRSTACK_ALLOW_HOST_MEMORY") &&
                  contains(mrstack_last_error(), "maybe"),
              "names the variable and the value");
        static const char *const yes[] = {"TRUE", "yes", "On", "1"};
        for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
            setenv("MRSTACK_ALLOW_HOST_MEMORY", yes[i], 1);
            CHECK(mrstack_device_stack(0) != NULL, "allowed with \"%s\"", yes[i]);
        }
    }
    void *t[100];
    for (int i = 0; i < 100; i++) {
        t[i] = mrstack_torch_malloc(512 * (i + 1), 0, NULL);
        CHECK(t[i] != NULL && ((size_t)t[i] % 256) == 0, "torch malloc %d", i);
    }
    for (int i = 0; i < 100; i++) mrstack_torch_free(t[i], 512 * (i + 1), 0, NULL);
    CHECK(mrstack_torch_malloc(-5, 0, NULL) == NULL, "negative size");
    CHECK(mrstack_torch_malloc(8, -1, NULL) == NULL, "negative device");
    CHECK(mrstack_torch_malloc(8, 1000, NULL) == NULL, "device past the table");
    MrstackStack *dev0 = mrstack_device_stack(0);
    CHECK(dev0 != NULL && contains(stats(dev0), "\"allocations\":100,\"deallocations\":100"),
          "%s", dev0 ? stats(dev0) : "null");
    CHECK(mrstack_destroy(dev0) == -1, "a per-device stack is not destroyed");
    CHECK(contains(mrstack_last_error(), "per-device"), "says why");
    CHECK(mrstack_device_stack(0) == dev0 && mrstack_properties(dev0) >= 0, "and still works");
    CHECK(mrstack_report(NULL) == 0, "report");
}

/* The last error, after a call that must have failed for `cause`: it names that, not a
   placeholder. */
static void names_cause(const char *call, const char *cause) {
    const char *e = mrstack_last_error();
    CHECK(contains(e, cause) && !contains(e, "internal error"), "%s names \"%s\"", call, cause);
}

/* The clients' frees return nothing: a failure is reported on standard error (which the Rust
   side reads) and in the last error, naming its cause. Every per-device stack fails to build. */
static int void_frees(void) {
    setenv("MRSTACK_STACK", "no_such_leaf", 1);
    unsetenv("MRSTACK_LOG");
    unsetenv("MRSTACK_REPORT");
    MrstackStack *s = mrstack_create("system > binning");
    void *p = mrstack_cvcuda_alloc(s, 4096, 256);
    CHECK(p != NULL, "cvcuda alloc");
    /* Negative sizes and alignments. */
    mrstack_cvcuda_free(s, p, -1, 256);
    names_cause("cvcuda free of size -1", "size -1 < 0");
    mrstack_cvcuda_free(s, p, 4096, -8);
    names_cause("cvcuda free at alignment -8", "alignment -8 < 0");
    mrstack_torch_free(p, -5, 0, NULL);
    names_cause("torch free of size -5", "size -5 < 0");
    /* No stack for the device. */
    mrstack_torch_free(p, 4096, 0, NULL);
    names_cause("torch free without a stack", "no_such_leaf");
    mrstack_cupy_free(NULL, p, 1);
    names_cause("cupy free without a stack", "no_such_leaf");
    mrstack_torch_init(2);
    names_cause("torch init without a stack", "no_such_leaf");
    /* A block the stack did not hand out. */
    int local;
    mrstack_cupy_free(s, &local, 0);
    names_cause("cupy free of a foreign pointer", "not a live block");
    /* A dead handle. */
    CHECK(mrstack_destroy(s) == 0, "destroy");
    mrstack_cupy_free(s, p, 0);
    names_cause("cupy free on a dead handle", "not a live stack");
    mrstack_cvcuda_free(s, p, 4096, 256);
    names_cause("cvcuda free on a dead handle", "not a live stack");
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

/* Lines of the file at `path` that contain `needle`; -1 when it cannot be read. */
static int lines_with(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) n += contains(line, needle);
    fclose(f);
    return n;
}

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* A log that cannot be written (`/dev/full`): its first failed write is reported on standard
   error as it happens, before anyone flushes, and once; mrstack_destroy returns the failure,
   naming the file. A log that can be written destroys with 0, the frees of the blocks left live
   in it. Standard error goes to `captured`, read back here while the program runs. */
static int full_log(const char *captured, const char *good_log) {
    fflush(stderr);
    int fd = open(captured, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0 && dup2(fd, 2) == 2, "standard error to %s", captured);
    if (fd >= 0) close(fd);

    MrstackStack *full = mrstack_create_ex("system > pool", 0, "/dev/full");
    CHECK(full != NULL, "a stack logged to /dev/full");
    /* ~40,000 lines, ~1.8 MB: the log's 64 KiB buffer fills and is written many times over. */
    for (int i = 0; i < 20000; i++) {
        size_t size = 64 + (size_t)(i % 1000) * 8;
        void *p = mrstack_allocate(full, size, 0, NULL);
        CHECK(p != NULL, "allocation %d", i);
        CHECK(mrstack_deallocate(full, p, size, 0, NULL) == 0, "free %d", i);
    }
    int seen = 0;
    for (int waited = 0; waited < 10000 && seen == 0; waited += 10) {
        seen = lines_with(captured, "/dev/full");
        if (seen == 0) sleep_ms(10);
    }
    CHECK(seen == 1, "the failed write reported as it happened, once: %d lines", seen);
    for (int i = 0; i < 2000; i++) {
        void *p = mrstack_allocate(full, 4096, 0, NULL);
        mrstack_deallocate(full, p, 4096, 0, NULL);
    }
    CHECK(mrstack_allocate(full, 100, 0, NULL) != NULL, "a block left live");
    CHECK(mrstack_destroy(full) == -1, "destroy returns the log's failure");
    CHECK(contains(mrstack_last_error(), "/dev/full"), "names the file: %s", mrstack_last_error());
    CHECK(mrstack_destroy(full) == -1 && contains(mrstack_last_error(), "not a live stack"),
          "destroyed all the same");
    sleep_ms(100);
    CHECK(lines_with(captured, "/dev/full") == 1, "reported once: %d lines",
          lines_with(captured, "/dev/full"));

    MrstackStack *good = mrstack_create_ex("system > pool", 0, good_log);
    CHECK(good != NULL, "a stack logged to %s", good_log);
    char text[512];
    mrstack_describe(good, text, sizeof text);
    CHECK(contains(text, "system > pool > logging(path=") && contains(text, good_log),
          "the description names the log: %s", text);
    for (int i = 0; i < 10; i++)
        CHECK(mrstack_allocate(good, 256 * (size_t)(i + 1), 0, NULL) != NULL, "allocation %d", i);
    CHECK(mrstack_destroy(good) == 0, "a log that can be written destroys with 0");
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

/* MRSTACK_LOG alone, no report: the log is complete once the program exits normally (the
   per-device stacks are never dropped, so only the exit hook flushes it). */
static int log_only(const char *log) {
    setenv("MRSTACK_STACK", "system > pool", 1);
    setenv("MRSTACK_ALLOW_HOST_MEMORY", "1", 1);
    setenv("MRSTACK_LOG", log, 1);
    unsetenv("MRSTACK_REPORT");
    for (int i = 0; i < 10; i++) {
        void *p = mrstack_torch_malloc(256 * (i + 1), 0, NULL);
        CHECK(p != NULL, "torch malloc %d", i);
        mrstack_torch_free(p, 256 * (i + 1), 0, NULL);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

/* A stack of its own with a log, never destroyed: the exit writes its last lines. */
static int kept_log(const char *log) {
    MrstackStack *stack = mrstack_create_ex("system > pool", 0, log);
    CHECK(stack != NULL, "create with a log: %s", mrstack_last_error());
    for (int i = 0; i < 7 && stack != NULL; i++) {
        void *p = mrstack_allocate(stack, 512 * (i + 1), 256, NULL);
        CHECK(p != NULL, "allocate %d", i);
        CHECK(mrstack_deallocate(stack, p, 512 * (i + 1), 256, NULL) == 0, "free %d", i);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--log-only") == 0) return log_only(argv[2]);
    if (argc == 3 && strcmp(argv[1], "--kept-log") == 0) return kept_log(argv[2]);
    if (argc == 2 && strcmp(argv[1], "--void-frees") == 0) return void_frees();
    if (argc == 4 && strcmp(argv[1], "--full-log") == 0) return full_log(argv[2], argv[3]);
    if (argc < 3) {
        fprintf(stderr, "usage: host_test REPORT.json LOG.csv | host_test --log-only LOG.csv | host_test --kept-log LOG.csv | "
                        "host_test --void-frees | host_test --full-log STDERR.txt LOG.csv\n");
        return 2;
    }
    CHECK(strcmp(mrstack_last_error(), "") == 0, "no error yet");
    bad_configs();
    allocate_write_free();
    bad_input();
    threads();
    clients(argv[1], argv[2]);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
