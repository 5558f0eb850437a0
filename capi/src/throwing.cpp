// The ways mrstack's `*_or_throw` entry points (src/throwing.rs) report a failure to a C++ caller
// that does not check a null return (PyTorch, CuPy): a C++ exception. Called from Rust through
// the "C-unwind" ABI, so the exception unwinds through the Rust frame to the caller.
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <typeinfo>

namespace {

// c10::SourceLocation (c10/util/Exception.h), which c10::Error's constructor takes by value.
struct SourceLocation {
    const char *function;
    const char *file;
    uint32_t line;
};

// c10::Error::Error(SourceLocation, std::string), called as the constructor it is: the object
// first, the string by invisible reference, as for any C++ call of it.
using ErrorConstructor = void (*)(void *self, SourceLocation, std::string);

// What PyTorch's libraries define for c10::OutOfMemoryError, the exception its Python bindings
// turn into torch.OutOfMemoryError: all of it found, or none of it is used.
struct C10OutOfMemory {
    ErrorConstructor construct = nullptr;
    void **vtable = nullptr;  // the class's vtable symbol: offset-to-top, type_info, slots
    std::type_info *type = nullptr;
    bool found = false;
};

// The sizes c10::Error has had (vptr, message, context, backtrace, lazy what, caller) stay far
// below this; the object is built in the exception's own buffer, so room to spare costs nothing.
constexpr size_t ERROR_ROOM = 1024;

void *symbol(const char *name) {
    if (void *s = dlsym(RTLD_DEFAULT, name)) {
        return s;
    }
    // PyTorch loads its libraries privately (RTLD_LOCAL): look in each by its soname, loading
    // none that is not there already.
    for (const char *lib : {"libc10.so", "libc10_cuda.so", "libtorch_cpu.so", "libtorch_python.so"}) {
        if (void *h = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD)) {
            void *s = dlsym(h, name);
            dlclose(h);
            if (s) {
                return s;
            }
        }
    }
    return nullptr;
}

C10OutOfMemory find_c10() {
    C10OutOfMemory c;
    // The constructors are named for the C++11 std::string of the libstdc++ this library is
    // built with: a PyTorch built with another string finds none, and the fallback is used.
    void *ctor = symbol(
        "_ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");
    if (!ctor) {
        ctor = symbol(
            "_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");
    }
    c.construct = reinterpret_cast<ErrorConstructor>(ctor);
    c.vtable = static_cast<void **>(symbol("_ZTVN3c1016OutOfMemoryErrorE"));
    // The type thrown is the one the vtable names (a library may hold its own copy of both),
    // and it must be the class: a catch matches it by this name.
    if (c.vtable) {
        c.type = static_cast<std::type_info *>(c.vtable[1]);
    }
    c.found = c.construct && c.type && std::strcmp(c.type->name(), "N3c1016OutOfMemoryErrorE") == 0;
    return c;
}

// Destroys the thrown object through its vtable's first slot, the complete-object destructor
// (the Itanium C++ ABI's order for a class whose first virtual function is its destructor, as
// std::exception's is).
void destroy(void *object) {
    void **vptr = *static_cast<void ***>(object);
    reinterpret_cast<void (*)(void *)>(vptr[0])(object);
}

}  // namespace

extern "C" {

// Throws std::runtime_error(what): a RuntimeError in Python, with the message.
[[noreturn]] void mrstack_throw_runtime_error(const char *what) {
    throw std::runtime_error(std::string(what));
}

// Throws c10::OutOfMemoryError(what), which PyTorch's bindings raise as torch.OutOfMemoryError,
// where this process has PyTorch's libraries loaded; std::runtime_error(what) otherwise.
[[noreturn]] void mrstack_throw_torch_out_of_memory(const char *what) {
    // Looked up at each throw (an out-of-memory error is rare; a few microseconds): PyTorch's
    // libraries may be loaded after the first failure, and no cache is shared between threads.
    const C10OutOfMemory c10 = find_c10();
    if (!c10.found) {
        mrstack_throw_runtime_error(what);
    }
    void *object = __cxxabiv1::__cxa_allocate_exception(ERROR_ROOM);
    // Built as a c10::Error, then made the derived class, which adds no member and inherits the
    // constructor: the vtable symbol's address point is past offset-to-top and type_info.
    try {
        c10.construct(object, SourceLocation{"mrstack_torch_malloc_or_throw", __FILE__, __LINE__},
                      std::string(what));
    } catch (...) {
        __cxxabiv1::__cxa_free_exception(object);
        throw;
    }
    *static_cast<void ***>(object) = c10.vtable + 2;
    __cxxabiv1::__cxa_throw(object, c10.type, destroy);
}

// Throws std::bad_alloc: a MemoryError in Python.
[[noreturn]] void mrstack_throw_bad_alloc(void) { throw std::bad_alloc(); }
}
