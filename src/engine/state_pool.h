// Free list of lightning-state slots: one per running sequence. A sequence that starts (or
// restarts after preemption) at past_len 0 has its slot zeroed by the backend, so a slot
// needs no clearing here. Engine thread only; not thread-safe.
#pragma once
#include <cstdint>
#include <vector>

namespace sala {

class StatePool {
 public:
  explicit StatePool(int32_t num_slots);

  int32_t total() const { return int32_t(owned_.size()); }
  int32_t free_count() const { return int32_t(free_.size()); }
  int32_t used() const { return total() - free_count(); }
  // A free slot, or -1 when none is left.
  int32_t acquire();
  void release(int32_t slot);

 private:
  std::vector<int32_t> free_;  // stack; the lowest ids are handed out first
  std::vector<uint8_t> owned_;
};

}  // namespace sala
