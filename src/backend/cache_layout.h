// Where a sparse layer's KV and compressed keys live in the paged caches (docs/ARCHITECTURE.md
// "Memory"): the one definition of the arithmetic, for host C++ (CPU backend, pool sizing)
// and CUDA device code (SALA_HD is __host__ __device__ under nvcc).
//
// Caches of one sparse layer, in elements (one element per kv head and dim, `row` = kvh * d
// per token):
//   K, V  [num_pages, page_size, kvh, d]              token p: page p / page_size, slot p % page_size
//   C1    [num_pages, page_size / s1, kvh, d]         level-1 entry j (tokens j*s1 .. j*s1+k1-1)
//   C2    [num_pages, page_size / s2, kvh, d]         level-2 entry j (stride s2 = 4 s1)
// A compressed entry lives in the page of its first token; page_size is a multiple of
// block_size, which is a multiple of 4 * kernel_stride, so every page holds whole entries.
// `pages` is one sequence's page list in position order (StepMeta::page_table slice).
#pragma once
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define SALA_HD __host__ __device__ __forceinline__
#else
#define SALA_HD inline
#endif

namespace sala::cache_layout {

// Index into the sequence's page list of the page holding token p.
SALA_HD int64_t page_index(int64_t p, int page_size) { return p / page_size; }
// Slot of token p within its page.
SALA_HD int64_t page_slot(int64_t p, int page_size) { return p % page_size; }
// Pages a sequence of `tokens` tokens needs.
SALA_HD int64_t pages_for(int64_t tokens, int page_size) {
  return (tokens + page_size - 1) / page_size;
}

// Element offset of token p's row in K or V.
SALA_HD int64_t token_offset(const int32_t* pages, int64_t p, int page_size, int64_t row) {
  return (int64_t(pages[page_index(p, page_size)]) * page_size + page_slot(p, page_size)) * row;
}

// Compressed entries of a level (window w, stride s) that fit in one page.
SALA_HD int entries_per_page(int page_size, int s) { return page_size / s; }
// Element offset of compressed entry j (stride s) in C1 / C2: in the page of its first
// token j * s.
SALA_HD int64_t entry_offset(const int32_t* pages, int64_t j, int s, int page_size, int64_t row) {
  const int64_t p = j * s;
  return (int64_t(pages[page_index(p, page_size)]) * entries_per_page(page_size, s) +
          page_slot(p, page_size) / s) * row;
}

// Compressed entries of a level (window w, stride s) over L tokens: windows wholly inside
// the sequence (SPEC §9.3).
SALA_HD int64_t num_entries(int64_t L, int w, int s) { return L >= w ? (L - w) / s + 1 : 0; }
// The entry that token p completes (p is the last token of its window), or -1.
SALA_HD int64_t entry_completed_at(int64_t p, int w, int s) {
  return (p + 1 >= w && (p + 1 - w) % s == 0) ? (p + 1 - w) / s : -1;
}

// Elements one page takes in one sparse layer: K and V, plus the level-1 and level-2
// compressed keys of its tokens (pool sizing; the allocations are num_pages times this).
SALA_HD int64_t page_elements(int page_size, int64_t row, int s1, int s2) {
  return (2 * int64_t(page_size) + entries_per_page(page_size, s1) +
          entries_per_page(page_size, s2)) * row;
}

}  // namespace sala::cache_layout
