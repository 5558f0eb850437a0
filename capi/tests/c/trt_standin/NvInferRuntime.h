/* A stand-in for TensorRT's NvInferRuntime.h, for compiling mrstack_tensorrt.hpp in CI where
 * TensorRT is not installed: the declarations an IGpuAsyncAllocator implementation sees, with the
 * same virtual functions in the same order as TensorRT 10.16 / 11.1's (so the same vtable
 * layout), and nothing else. Never include it beside the real header. */
#pragma once
#include <cstdint>
typedef struct CUstream_st* cudaStream_t;   // same tag as CUDA's driver_types.h
namespace nvinfer1 {
using InterfaceKind = char const*;
class InterfaceInfo { public: InterfaceKind kind; int32_t major; int32_t minor; };
enum class APILanguage : int32_t { kCPP = 0, kPYTHON = 1 };
class IVersionedInterface {
public:
    virtual APILanguage getAPILanguage() const noexcept { return APILanguage::kCPP; }
    virtual InterfaceInfo getInterfaceInfo() const noexcept = 0;
    virtual ~IVersionedInterface() noexcept = default;
protected:
    IVersionedInterface() = default;
    IVersionedInterface(IVersionedInterface const&) = default;
    IVersionedInterface(IVersionedInterface&&) = default;
    IVersionedInterface& operator=(IVersionedInterface const&) & = default;
    IVersionedInterface& operator=(IVersionedInterface&&) & = default;
};
enum class AllocatorFlag : int32_t { kRESIZABLE = 0 };
using AllocatorFlags = uint32_t;
namespace v_1_0 {
class IGpuAllocator : public IVersionedInterface {
public:
    virtual void* allocate(uint64_t const size, uint64_t const alignment, AllocatorFlags const flags) noexcept = 0;
    ~IGpuAllocator() override = default;
    IGpuAllocator() = default;
    virtual void* reallocate(void* const, uint64_t, uint64_t) noexcept { return nullptr; }
    virtual bool deallocate(void* const memory) noexcept = 0;
    virtual void* allocateAsync(uint64_t const size, uint64_t const alignment, AllocatorFlags const flags,
        cudaStream_t) noexcept { return allocate(size, alignment, flags); }
    virtual bool deallocateAsync(void* const memory, cudaStream_t) noexcept { return deallocate(memory); }
    InterfaceInfo getInterfaceInfo() const noexcept override { return {"IGpuAllocator", 1, 0}; }
protected:
    IGpuAllocator(IGpuAllocator const&) = default;
    IGpuAllocator(IGpuAllocator&&) = default;
    IGpuAllocator& operator=(IGpuAllocator const&) & = default;
    IGpuAllocator& operator=(IGpuAllocator&&) & = default;
};
class IGpuAsyncAllocator : public IGpuAllocator {
public:
    IGpuAsyncAllocator() = default;
    ~IGpuAsyncAllocator() override = default;
    void* allocateAsync(uint64_t const size, uint64_t const alignment, AllocatorFlags const flags,
        cudaStream_t) noexcept override = 0;
    bool deallocateAsync(void* const memory, cudaStream_t) noexcept override = 0;
    void* allocate(uint64_t const size, uint64_t const alignment, AllocatorFlags const flags) noexcept override
    { return allocateAsync(size, alignment, flags, nullptr); }
    bool deallocate(void* const memory) noexcept override { return deallocateAsync(memory, nullptr); }
    InterfaceInfo getInterfaceInfo() const noexcept override { return {"IGpuAllocator", 1, 0}; }
};
} // namespace v_1_0
using IGpuAllocator = v_1_0::IGpuAllocator;
using IGpuAsyncAllocator = v_1_0::IGpuAsyncAllocator;
} // namespace nvinfer1
