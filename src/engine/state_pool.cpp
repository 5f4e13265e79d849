#include "engine/state_pool.h"

#include "core/check.h"

namespace sala {

StatePool::StatePool(int32_t num_slots) : owned_(size_t(num_slots), 0) {
  SALA_CHECK(num_slots >= 0);
  free_.reserve(size_t(num_slots));
  for (int32_t s = num_slots - 1; s >= 0; --s) free_.push_back(s);
}

int32_t StatePool::acquire() {
  if (free_.empty()) return -1;
  const int32_t s = free_.back();
  free_.pop_back();
  SALA_CHECK(!owned_[size_t(s)], "slot {} handed out twice", s);
  owned_[size_t(s)] = 1;
  return s;
}

void StatePool::release(int32_t slot) {
  SALA_CHECK(slot >= 0 && slot < total() && owned_[size_t(slot)], "slot {} freed but not held",
             slot);
  owned_[size_t(slot)] = 0;
  free_.push_back(slot);
}

}  // namespace sala
