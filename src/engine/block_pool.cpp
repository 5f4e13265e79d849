#include "engine/block_pool.h"

#include "core/check.h"

namespace sala {

BlockPool::BlockPool(int32_t num_pages, int32_t page_size)
    : page_size_(page_size), owned_(size_t(num_pages), 0) {
  SALA_CHECK(num_pages >= 0 && page_size > 0, "pool of {} pages of {}", num_pages, page_size);
  free_.reserve(size_t(num_pages));
  for (int32_t p = num_pages - 1; p >= 0; --p) free_.push_back(p);
}

bool BlockPool::ensure(std::vector<int32_t>& pages, int64_t tokens) {
  const int32_t n = missing(pages, tokens);
  if (n > free_count()) return false;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t p = free_.back();
    free_.pop_back();
    SALA_CHECK(!owned_[size_t(p)], "page {} handed out twice", p);
    owned_[size_t(p)] = 1;
    pages.push_back(p);
  }
  return true;
}

void BlockPool::release(std::vector<int32_t>& pages) {
  for (int32_t p : pages) {
    SALA_CHECK(p >= 0 && p < total() && owned_[size_t(p)], "page {} freed but not held", p);
    owned_[size_t(p)] = 0;
    free_.push_back(p);
  }
  pages.clear();
}

}  // namespace sala
