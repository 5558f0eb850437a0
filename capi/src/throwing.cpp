// The two ways mrstack's `*_or_throw` entry points (src/throwing.rs) report a failure to a C++
// caller that does not check a null return (PyTorch, CuPy): a C++ exception. Called from Rust
// through the "C-unwind" ABI, so the exception unwinds through the Rust frame to the caller.
#include <new>
#include <stdexcept>
#include <string>

extern "C" {

// Throws std::runtime_error(what): a RuntimeError in Python, with the message.
[[noreturn]] void mrstack_throw_runtime_error(const char *what) {
    throw std::runtime_error(std::string(what));
}

// Throws std::bad_alloc: a MemoryError in Python.
[[noreturn]] void mrstack_throw_bad_alloc(void) { throw std::bad_alloc(); }
}
