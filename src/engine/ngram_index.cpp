#include "engine/ngram_index.h"

#include <algorithm>
#include <limits>

#include "core/check.h"

namespace sala {
namespace {

// A slot's tag: the token itself for 1-grams (exact: no token is read to compare), else the top
// half of a 64-bit hash of the n tokens (a token comparison confirms a tag match).
uint32_t ngram_tag(const int32_t* t, int32_t n) {
  if (n == 1) return uint32_t(t[0]);
  uint64_t h = 0x243f6a8885a308d3ULL;
  for (int32_t i = 0; i < n; ++i) h = (h ^ uint32_t(t[i])) * 0x9e3779b97f4a7c15ULL;
  return uint32_t((h ^ (h >> 29)) >> 32);
}

// Home slot of a tag in a table of 2^bits slots (Fibonacci hashing: top bits of the product).
size_t home_slot(uint32_t tag, int32_t bits) { return size_t(uint32_t(tag * 0x9e3779b1u) >> (32 - bits)); }

constexpr uint64_t kRepeated = uint64_t(1) << 31;

// A slot's end (its low 31 bits hold end + 1).
int64_t slot_end(uint64_t s) { return int64_t(s & 0x7fffffffu) - 1; }

bool same_ngram(const int32_t* a, const int32_t* b, int32_t n) {
  for (int32_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

}  // namespace

NgramIndex::NgramIndex(int32_t ngram_min, int32_t ngram_max) : min_(ngram_min), max_(ngram_max) {
  SALA_CHECK(ngram_min >= 1 && ngram_max >= ngram_min, "n-gram sizes {}..{}", ngram_min,
             ngram_max);
  for (int32_t n = ngram_min; n <= ngram_max; ++n) levels_.push_back(Level{n, 0, {}, 0});
}

size_t NgramIndex::bytes() const {
  size_t b = 0;
  for (const Level& lv : levels_) b += lv.slots.size() * sizeof(uint64_t);
  return b;
}

void NgramIndex::reserve(Level& lv, int64_t entries) {
  int32_t bits = std::max(lv.bits, 10);
  while ((int64_t(1) << bits) < 2 * entries) ++bits;  // at most half full
  if (bits == lv.bits) return;
  SALA_CHECK(bits <= 32, "n-gram table of 2^{} slots", bits);
  std::vector<uint64_t> old = std::move(lv.slots);
  lv.bits = bits;
  lv.slots.assign(size_t(1) << bits, 0);
  const size_t mask = lv.slots.size() - 1;
  for (uint64_t s : old) {  // the tags give the new home slots: no token is read
    if (s == 0) continue;
    size_t i = home_slot(uint32_t(s >> 32), bits);
    while (lv.slots[i] != 0) i = (i + 1) & mask;
    lv.slots[i] = s;
  }
}

void NgramIndex::insert(Level& lv, const int32_t* tok, int64_t end) {
  const int32_t n = lv.n;
  const int32_t* gram = tok + end - n + 1;
  const uint32_t tag = ngram_tag(gram, n);
  const uint64_t entry = uint64_t(tag) << 32 | uint64_t(end + 1);
  const size_t mask = lv.slots.size() - 1;
  for (size_t i = home_slot(tag, lv.bits);; i = (i + 1) & mask) {
    const uint64_t s = lv.slots[i];
    if (s == 0) {
      lv.slots[i] = entry;
      ++lv.used;
      return;
    }
    const int64_t at = slot_end(s);
    if (uint32_t(s >> 32) == tag && (n == 1 || same_ngram(tok + at - n + 1, gram, n))) {
      lv.slots[i] = entry | kRepeated;  // ends are inserted in increasing order: the latest
      return;
    }
  }
}

int64_t NgramIndex::find(const Level& lv, const int32_t* tok, int64_t from,
                         bool* repeated) const {
  *repeated = false;
  if (lv.used == 0) return -1;
  const int32_t n = lv.n;
  const uint32_t tag = ngram_tag(tok + from, n);
  const size_t mask = lv.slots.size() - 1;
  for (size_t i = home_slot(tag, lv.bits);; i = (i + 1) & mask) {
    const uint64_t s = lv.slots[i];
    if (s == 0) return -1;
    const int64_t at = slot_end(s);
    if (uint32_t(s >> 32) == tag && (n == 1 || same_ngram(tok + at - n + 1, tok + from, n))) {
      *repeated = (s & kRepeated) != 0;
      return at;
    }
  }
}

void NgramIndex::extend(const std::vector<int32_t>& tokens, int64_t end_limit) {
  const int64_t L = int64_t(tokens.size());
  SALA_CHECK(L < int64_t(std::numeric_limits<int32_t>::max()), "{} tokens", L);
  if (L - 1 < ends_) {  // fewer tokens than indexed: not the same sequence any more
    for (Level& lv : levels_) lv = Level{lv.n, 0, {}, 0};
    ends_ = 0;
  }
  end_limit = std::min(end_limit, L - 1);  // an end has a follower
  if (end_limit <= ends_) return;
  const int32_t* tok = tokens.data();
  constexpr int64_t kAhead = 8;  // home slots prefetched ahead: large tables miss the caches
  for (Level& lv : levels_) {
    const int64_t first = std::max<int64_t>(ends_, lv.n - 1);
    if (first >= end_limit) continue;
    reserve(lv, lv.used + (end_limit - first));
    for (int64_t e = first; e < end_limit; ++e) {
      if (e + kAhead < end_limit)
        __builtin_prefetch(&lv.slots[home_slot(ngram_tag(tok + e + kAhead - lv.n + 1, lv.n), lv.bits)]);
      insert(lv, tok, e);
    }
  }
  ends_ = end_limit;
}

std::vector<int32_t> NgramIndex::draft(const std::vector<int32_t>& tokens, int32_t k,
                                       int64_t budget, NgramMatch* match) {
  if (match) *match = {};
  const int64_t L = int64_t(tokens.size());
  if (k <= 0 || L < 2) return {};
  extend(tokens, std::min(L, ends_ + std::max<int64_t>(budget, 0)));

  // Ends not indexed yet, [ends_, L - 2]: scanned as ngram_draft does (a few per step once
  // the prompt is indexed). tail[n]: the latest of them whose n-gram equals the suffix's
  // (match length >= n), tail_count[n]: how many.
  const int32_t* tok = tokens.data();
  const int32_t last = tok[L - 1];
  std::vector<int64_t>& tail = tail_;
  std::vector<int64_t>& tail_count = tail_count_;
  tail.assign(size_t(max_) + 1, -1);
  tail_count.assign(size_t(max_) + 1, 0);
  for (int64_t j = L - 2; j >= ends_; --j) {
    if (tok[j] != last) continue;
    int32_t m = 1;
    while (m < max_ && j - m >= 0 && tok[j - m] == tok[L - 1 - m]) ++m;
    for (int32_t n = 1; n <= m; ++n) {
      if (tail[size_t(n)] < 0) tail[size_t(n)] = j;
      ++tail_count[size_t(n)];
    }
  }
  // The longest match wins, then the latest position: a tail end is later than any indexed.
  // Its n-gram is unique when it ended once among the tail and the indexed ends together.
  for (int32_t n = max_; n >= min_; --n) {
    bool repeated = false;
    const int64_t indexed =
        n <= L - 1 ? find(levels_[size_t(n - min_)], tok, L - n, &repeated) : -1;
    const int64_t j = tail[size_t(n)] >= 0 ? tail[size_t(n)] : indexed;
    if (j < 0) continue;
    const int64_t count = tail_count[size_t(n)] + (indexed < 0 ? 0 : repeated ? 2 : 1);
    const int64_t from = j + 1, to = std::min<int64_t>(L, from + k);
    if (match) *match = {n, count == 1};
    return {tokens.begin() + from, tokens.begin() + to};
  }
  return {};
}

}  // namespace sala
