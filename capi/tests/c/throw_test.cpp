// mrstack_torch_malloc_or_throw as PyTorch calls it: an allocation the stack has no memory for
// throws c10::OutOfMemoryError (torch.OutOfMemoryError in Python) once PyTorch's libc10.so is
// loaded, std::runtime_error before; any other failure throws std::runtime_error. Run with the
// path of the c10 stand-in (tests/c/c10_standin) as its argument; prints "N passed, F failed".
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <typeinfo>

#include "mrstack.h"

#include "check.h"

// What a call of the throwing entry point threw: the exception's class name (mangled, as
// typeid gives it) and message, or "none" when it returned.
struct Thrown {
    std::string type;
    std::string what;
};

static Thrown call(ptrdiff_t size) {
    try {
        void *p = mrstack_torch_malloc_or_throw(size, 0, nullptr);
        if (p != nullptr) {
            mrstack_torch_free(p, size, 0, nullptr);
        }
        return {"none", ""};
    } catch (const std::exception &e) {
        return {typeid(e).name(), e.what()};
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        std::printf("usage: throw_test PATH/libc10.so\n");
        return 2;
    }
    setenv("MRSTACK_STACK", "system > limiting(limit=1MiB)", 1);
    setenv("MRSTACK_ALLOW_HOST_MEMORY", "1", 1);

    Thrown t = call(4096);
    CHECK(t.type == "none", "a request that fits returns memory, threw %s", t.type.c_str());

    // Without PyTorch's libraries: the standard exception, naming the cause.
    t = call(2 << 20);
    CHECK(t.type == typeid(std::runtime_error).name(), "threw %s", t.type.c_str());
    CHECK(mrstack_last_error_kind() == MRSTACK_ERROR_OUT_OF_MEMORY, "kind %d", mrstack_last_error_kind());
    CHECK(std::strstr(t.what.c_str(), "limit") != nullptr, "names the cause: %s", t.what.c_str());

    void *c10 = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK(c10 != nullptr, "load the stand-in: %s", dlerror());
    if (c10 == nullptr) {
        std::printf("%d passed, %d failed\n", passed, failed);
        return 1;
    }
    auto throws = reinterpret_cast<int (*)()>(dlsym(c10, "c10_standin_throws"));
    CHECK(throws != nullptr && throws() == 1, "the stand-in works");

    // With them: c10::OutOfMemoryError, built by c10's own constructor, with the message.
    for (int i = 0; i < 3; i++) {
        t = call(2 << 20);
        CHECK(t.type == "N3c1016OutOfMemoryErrorE", "threw %s", t.type.c_str());
        CHECK(std::strstr(t.what.c_str(), "limit") != nullptr &&
                  std::strstr(t.what.c_str(), "mrstack_torch_malloc_or_throw") != nullptr,
              "the message, through c10's constructor: %s", t.what.c_str());
    }
    // Another failure is no out-of-memory error.
    t = call(-5);
    CHECK(t.type == typeid(std::runtime_error).name(), "a negative size threw %s", t.type.c_str());
    CHECK(mrstack_last_error_kind() == MRSTACK_ERROR_OTHER, "kind %d", mrstack_last_error_kind());
    // And memory is served after all that.
    t = call(4096);
    CHECK(t.type == "none", "memory after the failures, threw %s", t.type.c_str());

    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
