// Prompt lookup without rescanning the sequence (issue 21, NGRAM). ngram_draft scans all of a
// sequence's tokens at every step: 0.17 ms at 128K tokens and 0.55 ms at 512K per request and
// step on the development machine, engine-thread time between GPU steps. A sequence's
// committed tokens only grow, so each suffix length n (ngram_min..ngram_max) keeps a hash set
// of its n-grams that have a follower, each mapped to its latest end position; a lookup probes
// levels ngram_max..ngram_min, a few table slots each.
//
// Exactness: draft() returns what ngram_draft returns on the same tokens. The longest match
// length M (capped at ngram_max) is the largest n whose suffix n-gram occurred earlier, and
// ngram_draft's pick (the latest position of length M) is the latest end recorded at level M.
//
// Filling: NgramDrafter::planned() extends the index with each prefill chunk of a request that
// may draft (n-grams of ~2K-8K tokens next to a GPU step of 0.1-1 s), so decoding starts fully
// indexed; a draft() indexes the tokens added since (a few per step), at most `budget` of
// them, and scans the rest as ngram_draft does, so no call costs much more than one scan.
// Memory: 8 bytes per table slot, tables at most half full: ~32-64 bytes per token for the
// default 4 levels (26-34 MB at 512K tokens), under 1 % of the 8 KiB of bf16 KV per token.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sala {

// The suffix match a lookup found: its length (0: none) and whether the matched n-gram
// occurred exactly once before the suffix. A unique match points at one place to copy from;
// a repeated one at the latest of several, whose continuations may differ (tiny-chat, CPU:
// 1-token matches passed 33 % of the time when unique, 1 % when repeated).
struct NgramMatch {
  int32_t len = 0;
  bool unique = false;
};

class NgramIndex {
 public:
  static constexpr int64_t kDefaultBudget = 8192;  // new end positions indexed per call

  NgramIndex(int32_t ngram_min, int32_t ngram_max);

  // ngram_draft(tokens, k, ngram_min, ngram_max, match). The first indexed_len() tokens must
  // be the ones of the previous call (a sequence's committed tokens only grow: drafts are
  // appended after propose and removed before the next); fewer tokens than that reset the
  // index. Indexes up to `budget` more end positions first.
  std::vector<int32_t> draft(const std::vector<int32_t>& tokens, int32_t k,
                             int64_t budget = kDefaultBudget, NgramMatch* match = nullptr);

  // Indexes the n-grams ending before min(end_limit, tokens.size() - 1) (same rule for tokens):
  // the engine calls it with each prefill chunk, so that decoding starts fully indexed.
  void extend(const std::vector<int32_t>& tokens, int64_t end_limit);

  // Tokens the tables depend on: every n-gram ending before indexed_len() is in them.
  int64_t indexed_len() const { return ends_; }
  size_t bytes() const;

 private:
  // Open addressing with linear probing. A slot holds tag << 32 | repeated << 31 | end + 1
  // (0: empty), for the n-gram tokens[end - n + 1 .. end], `repeated` set once the n-gram has
  // ended at more than one indexed position (ends stay below 2^31 - 1); the tag (ngram_tag)
  // picks the home slot, so growing re-places slots without reading tokens.
  struct Level {
    int32_t n = 0;
    int32_t bits = 0;  // slots.size() == 1 << bits (0: no table yet)
    std::vector<uint64_t> slots;
    int64_t used = 0;
  };

  // Grows lv's table (if needed) to hold `entries` at most half full.
  void reserve(Level& lv, int64_t entries);
  void insert(Level& lv, const int32_t* tok, int64_t end);
  // Latest indexed end whose n-gram equals tok[from .. from + n - 1], or -1; *repeated: the
  // n-gram ended at more than one indexed position.
  int64_t find(const Level& lv, const int32_t* tok, int64_t from, bool* repeated) const;

  int32_t min_, max_;
  std::vector<Level> levels_;  // levels_[n - min_]
  int64_t ends_ = 0;           // ends [0, ends_) are indexed (each level where the n-gram fits)
  // draft()'s scratch, per match length n: the latest scanned end of the suffix's n-gram and
  // how many scanned ends it has.
  std::vector<int64_t> tail_, tail_count_;
};

}  // namespace sala
