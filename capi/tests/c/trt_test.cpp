// mrstack_tensorrt.hpp compiled against the stand-in TensorRT declaration and used the way
// TensorRT uses an allocator (through the interface, synchronous and asynchronous calls), over a
// host stack. Prints "N passed, M failed".
#include "NvInferRuntime.h"
#include "mrstack_tensorrt.hpp"

#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

static int passed, failed;
#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (cond) {                                                                     \
            passed++;                                                                   \
        } else {                                                                        \
            failed++;                                                                   \
            std::printf("FAILED %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond,           \
                        mrstack_last_error());                                          \
        }                                                                               \
    } while (0)

int main() {
    MrstackStack *stack = mrstack_create("system > pool > binning");
    CHECK(stack != nullptr);
    mrstack::TensorRtAllocator adapter(stack);
    nvinfer1::IGpuAllocator *alloc = &adapter; // as TensorRT holds it
    CHECK(std::strcmp(alloc->getInterfaceInfo().kind, "IGpuAllocator") == 0);

    CHECK(alloc->allocateAsync(0, 0, 0, nullptr) == nullptr); // size 0
    void *p = alloc->allocateAsync(1000, 0, 0, nullptr);      // alignment 0: any
    CHECK(p != nullptr);
    std::memset(p, 7, 1000);
    void *q = alloc->allocate(4096, 512, 0); // the synchronous call reaches allocateAsync
    CHECK(q != nullptr && reinterpret_cast<uintptr_t>(q) % 512 == 0);
    CHECK(alloc->allocateAsync(64, 3, 0, nullptr) == nullptr); // not a power of two
    CHECK(alloc->reallocate(p, 0, 2000) == nullptr);            // not offered
    CHECK(alloc->deallocateAsync(p, nullptr));
    CHECK(!alloc->deallocateAsync(p, nullptr)); // twice: false, nothing freed
    CHECK(alloc->deallocate(q));
    CHECK(alloc->deallocate(nullptr)); // a null free is nothing to free, and succeeds

    // Thread-safe: four threads allocate and free through one adapter.
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; t++) {
        threads.emplace_back([alloc, t] {
            for (int i = 0; i < 5000; i++) {
                void *b = alloc->allocateAsync(1 + (i * 131 + t) % 70000, 256, 0, nullptr);
                if (b == nullptr || !alloc->deallocateAsync(b, nullptr)) {
                    std::printf("thread %d failed at %d: %s\n", t, i, mrstack_last_error());
                    return;
                }
            }
        });
    }
    for (auto &t : threads) t.join();
    char stats[1024];
    mrstack_statistics_json(stack, stats, sizeof stats);
    CHECK(std::strstr(stats, "\"allocations\":20002,\"deallocations\":20002") != nullptr);
    CHECK(std::strstr(stats, "\"live_blocks\":0") != nullptr);
    CHECK(mrstack_destroy(stack) == 0);
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
