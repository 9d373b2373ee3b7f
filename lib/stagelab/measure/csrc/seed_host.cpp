// The seed engine's host path, as plain C functions for ctypes:
//  * the copy's destination, a value-initialised std::vector<float> (every element zeroed, so
//    every page is touched before the copy) that its destructor frees when the step ends;
//  * GatherLogprobs: per row, the target's rank (entries >= its value) and the top K by a
//    std::partial_sort of an index vector by descending value; one thread, one row at a time.
#include <algorithm>
#include <cstdint>
#include <new>
#include <numeric>
#include <vector>

extern "C" {

// A new vector of `numel` zeroed floats; its data pointer goes to *data. nullptr when the
// allocation fails (an exception must not cross into C and terminate the process).
void* sl_vector_new(int64_t numel, float** data) {
    try {
        auto* vec = new std::vector<float>(static_cast<size_t>(numel));
        *data = vec->data();
        return vec;
    } catch (const std::bad_alloc&) {
        return nullptr;
    }
}

void sl_vector_free(void* vec) { delete static_cast<std::vector<float>*>(vec); }

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
