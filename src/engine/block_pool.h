// Free list of the KV pages of the sparse layers. The engine thread owns it; nothing here is
// thread-safe. A request's page list lives in its Sequence (scheduler.h), in position order:
// position p of the sequence is in page pages[p / page_size].
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cache_layout.h"

namespace sala {

class BlockPool {
 public:
  BlockPool(int32_t num_pages, int32_t page_size);

  int32_t page_size() const { return page_size_; }
  int32_t total() const { return int32_t(owned_.size()); }
  int32_t free_count() const { return int32_t(free_.size()); }
  int32_t used() const { return total() - free_count(); }
  // Pages needed to hold `tokens` positions.
  int32_t pages_for(int64_t tokens) const {
    return int32_t(cache_layout::pages_for(tokens, page_size_));
  }
  // Extra pages `pages` needs to cover `tokens` positions (0 if it already does).
  int32_t missing(const std::vector<int32_t>& pages, int64_t tokens) const {
    const int32_t need = pages_for(tokens) - int32_t(pages.size());
    return need > 0 ? need : 0;
  }
  // Grows `pages` to cover `tokens` positions. All or nothing: false (pages unchanged) when
  // the free list is too short.
  bool ensure(std::vector<int32_t>& pages, int64_t tokens);
  // Returns every page of the list to the free list and clears it.
  void release(std::vector<int32_t>& pages);

 private:
  int32_t page_size_;
  std::vector<int32_t> free_;     // stack; the lowest ids are handed out first
  std::vector<uint8_t> owned_;    // 1 while a page is held (double-free / leak checks)
};

}  // namespace sala
