// The seed engine's host path, as plain C functions for ctypes:
//  * the copy's destination, a value-initialised std::vector<float> (every element zeroed, so
//    every page is touched before the copy) that its destructor frees when the step ends, under
//    one of two allocation regimes: glibc's malloc as the engine gets it (regime 0: its dynamic
//    mmap threshold decides between fresh pages and reused heap, and that threshold moves with
//    whatever the process freed before), or every vector mapped fresh (regime 1: mmap and munmap
//    of its own, as glibc does above its threshold, never touching the process's heap, so its
//    cost cannot depend on what other code allocated);
//  * GatherLogprobs: per row, the target's rank (entries >= its value) and the top K by a
//    std::partial_sort of an index vector by descending value; one thread, one row at a time.
#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <numeric>
#include <vector>

namespace {

// Every allocation its own fresh anonymous mapping, unmapped when freed.
template <class T>
struct MappedAllocator {
    using value_type = T;
    MappedAllocator() = default;
    template <class U>
    MappedAllocator(const MappedAllocator<U>&) noexcept {}
    T* allocate(size_t n) {
        void* p = mmap(nullptr, std::max<size_t>(n * sizeof(T), 1), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        return static_cast<T*>(p);
    }
    void deallocate(T* p, size_t n) noexcept { munmap(p, std::max<size_t>(n * sizeof(T), 1)); }
    template <class U>
    bool operator==(const MappedAllocator<U>&) const noexcept { return true; }
    template <class U>
    bool operator!=(const MappedAllocator<U>&) const noexcept { return false; }
};

using HeapVector = std::vector<float>;
using MappedVector = std::vector<float, MappedAllocator<float>>;

template <class Vector>
void* make(int64_t numel, float** data) {
    auto* vec = new Vector(static_cast<size_t>(numel));
    *data = vec->data();
    return vec;
}

}  // namespace

extern "C" {

// A new vector of `numel` zeroed floats under `regime` (0: glibc's malloc, 1: mapped fresh);
// its data pointer goes to *data. nullptr when the allocation fails or the regime is unknown
// (an exception must not cross into C and terminate the process).
void* sl_vector_new(int64_t numel, int32_t regime, float** data) {
    try {
        if (regime == 0) return make<HeapVector>(numel, data);
        if (regime == 1) return make<MappedVector>(numel, data);
        return nullptr;
    } catch (const std::bad_alloc&) {
        return nullptr;
    }
}

void sl_vector_free(void* vec, int32_t regime) {
    if (regime == 0) delete static_cast<HeapVector*>(vec);
    if (regime == 1) delete static_cast<MappedVector*>(vec);
}

// Whether glibc served a malloc'd block from a fresh mapping: the IS_MMAPPED bit (0x2) of the
// chunk's size word just before it, as glibc lays chunks out. 1 or 0; -1 for a null pointer.
int32_t sl_glibc_mmapped(const void* data) {
    if (data == nullptr) return -1;
    const size_t size_word = reinterpret_cast<const size_t*>(data)[-1];
    return (size_word & 0x2) ? 1 : 0;
}

// Row-major logprobs [rows, vocab]; outputs [rows, k + 1] (column 0: the target) and ranks [rows].
// Returns -1, or the first row whose target lies outside [0, vocab) (nothing written from it on).
int64_t sl_gather_logprobs(const float* logprobs, int64_t rows, int64_t vocab,
                           const int64_t* targets, int64_t k, int32_t* ids, float* values,
                           int32_t* ranks) {
    std::vector<int32_t> index(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < rows; ++i) {
        const float* row = logprobs + i * vocab;
        const int64_t target = targets[i];
        if (target < 0 || target >= vocab) return i;
        const float target_value = row[target];
        int64_t rank = 0;
        for (int64_t j = 0; j < vocab; ++j) rank += row[j] >= target_value;
        ranks[i] = static_cast<int32_t>(rank);
        int32_t* row_ids = ids + i * (k + 1);
        float* row_values = values + i * (k + 1);
        row_ids[0] = static_cast<int32_t>(target);
        row_values[0] = target_value;
        if (k == 0) continue;
        std::iota(index.begin(), index.end(), 0);
        std::partial_sort(index.begin(), index.begin() + k, index.end(),
                          [row](int32_t a, int32_t b) { return row[a] > row[b]; });
        for (int64_t j = 0; j < k; ++j) {
            row_ids[j + 1] = index[j];
            row_values[j + 1] = row[index[j]];
        }
    }
    return -1;
}

}  // extern "C"
