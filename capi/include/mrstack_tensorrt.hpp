/* mrstack as TensorRT's GPU allocator: a header-only nvinfer1::IGpuAsyncAllocator over an mrstack
 * stack (libmrstack_c). Include TensorRT's NvInferRuntime.h before this header.
 *
 *     MrstackStack *stack = mrstack_create("cuda_async > binning");
 *     mrstack::TensorRtAllocator alloc(stack);
 *     runtime->setGpuAllocator(&alloc);          // or builder->setGpuAllocator(&alloc)
 *     ...                                        // the stack and `alloc` outlive the runtime
 *
 * Semantics (IGpuAsyncAllocator's): size 0 gives nullptr, alignment 0 means any, every call is
 * thread-safe, allocations and frees are ordered on the stream given (nullptr: the legacy
 * default stream, which TensorRT's synchronous calls pass). A free of a pointer the stack did
 * not hand out returns false. Resizing (AllocatorFlag::kRESIZABLE) is not offered: reallocate
 * keeps the base class's answer, nullptr. */
#ifndef MRSTACK_TENSORRT_HPP
#define MRSTACK_TENSORRT_HPP

#include "mrstack.h"

#include <cstdint>

namespace mrstack {

class TensorRtAllocator : public nvinfer1::IGpuAsyncAllocator {
public:
    /* Borrows `stack`, which must outlive this allocator and every TensorRT object using it. */
    explicit TensorRtAllocator(MrstackStack *stack) noexcept : stack_(stack) {}

    void *allocateAsync(uint64_t const size, uint64_t const alignment,
                        nvinfer1::AllocatorFlags const flags, cudaStream_t stream) noexcept override {
        return mrstack_trt_allocate(stack_, size, alignment, flags, static_cast<void *>(stream));
    }

    bool deallocateAsync(void *const memory, cudaStream_t stream) noexcept override {
        return mrstack_trt_deallocate(stack_, memory, static_cast<void *>(stream));
    }

    MrstackStack *stack() const noexcept { return stack_; }

private:
    MrstackStack *stack_;
};

} // namespace mrstack

#endif // MRSTACK_TENSORRT_HPP
