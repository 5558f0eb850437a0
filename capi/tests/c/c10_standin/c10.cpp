// A stand-in for PyTorch's libc10.so: c10::Error and c10::OutOfMemoryError with the constructor,
// the classes' names and the vtable layout the library's torch entry point looks for, so that a
// test without PyTorch can check that an out-of-memory error is thrown as c10::OutOfMemoryError.
// Built as a shared library whose soname is libc10.so, and loaded privately (RTLD_LOCAL), as
// PyTorch loads its own.
#include <cstdint>
#include <exception>
#include <string>

namespace c10 {

struct SourceLocation {
    const char *function;
    const char *file;
    uint32_t line;
};

class Error : public std::exception {
  public:
    Error(SourceLocation where, std::string msg);
    ~Error() override;
    const char *what() const noexcept override;

  private:
    std::string what_;
};

class OutOfMemoryError : public Error {
  public:
    using Error::Error;
    ~OutOfMemoryError() override;
};

Error::Error(SourceLocation where, std::string msg)
    : what_(std::move(msg) + " (thrown in " + where.function + ")") {}
Error::~Error() = default;
const char *Error::what() const noexcept { return what_.c_str(); }
OutOfMemoryError::~OutOfMemoryError() = default;

}  // namespace c10

// Makes the stand-in throw once, so that its classes are used the way PyTorch's are.
extern "C" int c10_standin_throws(void) {
    try {
        throw c10::OutOfMemoryError({"c10_standin_throws", __FILE__, __LINE__}, "stand-in");
    } catch (const c10::OutOfMemoryError &) {
        return 1;
    }
}
