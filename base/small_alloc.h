#pragma once
// A per-thread cache of small heap blocks, by size class, in front of
// malloc. The request path allocates and frees the same few shapes over and
// over (nghttp3's per-stream buffers and QPACK strings, ngtcp2's
// per-connection objects, response bodies); a worker thread takes them from
// and gives them back to its own free lists, without a lock or a call into
// malloc once warm.
//
// - Blocks up to MAX_SMALL bytes come from 40 size classes (16-byte steps up
//   to 64, then four classes per power of two); larger ones go to malloc.
//   Every block carries a 16-byte header naming its class, so free() needs
//   no size and a block may be freed on any thread (it joins that thread's
//   lists).
// - Bounded: a thread caches at most CACHE_BYTES; past that, freed blocks
//   go back to malloc. What a peer can make the server hold is bounded
//   elsewhere (budgets); this only decides who holds freed memory.
// - Under AddressSanitizer cached blocks are poisoned, so a use after free
//   of a pooled block is still reported.
//
// The C libraries get it through ngtcp2_mem / nghttp3_mem / nghttp2_mem
// tables (quic/, http/) and OpenSSL's CRYPTO_set_mem_functions (http/
// tcp_tls.h); C++ types opt in with XDPQ_SMALL_ALLOC_OPERATORS.

#include <cstddef>
#include <cstdint>

namespace xdpq::small_alloc {

inline constexpr size_t MAX_SMALL = 32768; // OpenSSL's record buffers (~17 KB) fit
inline constexpr size_t CACHE_BYTES = 8u << 20;

void *allocate(size_t n) noexcept; // nullptr when out of memory
void *allocate_zeroed(size_t count, size_t n) noexcept;
void *reallocate(void *p, size_t n) noexcept;
void deallocate(void *p) noexcept; // p may be nullptr

// The calling thread's figures (tests, stats).
struct ThreadStats {
  uint64_t hits = 0;         // served from a free list
  uint64_t misses = 0;       // went to malloc
  uint64_t cached_bytes = 0; // held in free lists now
};
ThreadStats thread_stats() noexcept;
// Returns every cached block of the calling thread to malloc.
void trim() noexcept;

// The bytes p's block holds (its class's size, or what malloc gave a large
// one): what a caller that counts its memory charges for it.
size_t block_size(const void *p) noexcept;

// Size class of an n-byte request (n <= MAX_SMALL) and its block size.
size_t class_of(size_t n) noexcept;
size_t class_size(size_t cls) noexcept;

} // namespace xdpq::small_alloc

// In a class body: new/delete of this type (and its subclasses) go through
// the per-thread cache. Throws std::bad_alloc like the global operator new.
#define XDPQ_SMALL_ALLOC_OPERATORS                                                                 \
  static void *operator new(size_t n) {                                                            \
    if (void *p = ::xdpq::small_alloc::allocate(n))                                                \
      return p;                                                                                    \
    ::xdpq::small_alloc::throw_bad_alloc();                                                        \
  }                                                                                                \
  static void operator delete(void *p) noexcept {                                                  \
    ::xdpq::small_alloc::deallocate(p);                                                            \
  }

namespace xdpq::small_alloc {
[[noreturn]] void throw_bad_alloc();
}

namespace xdpq::small_alloc {

// The allocator table ngtcp2 and nghttp3 take ({user_data, malloc, free,
// calloc, realloc}, the same shape in both):
//   static const ngtcp2_mem MEM = small_alloc::c_table<ngtcp2_mem>();
inline void *c_malloc(size_t n, void *) {
  return allocate(n);
}
inline void c_free(void *p, void *) {
  deallocate(p);
}
inline void *c_calloc(size_t count, size_t n, void *) {
  return allocate_zeroed(count, n);
}
inline void *c_realloc(void *p, size_t n, void *) {
  return reallocate(p, n);
}
template <typename Mem> constexpr Mem c_table() {
  return Mem{nullptr, c_malloc, c_free, c_calloc, c_realloc};
}

// The same, each block charged to an owner at its block's size: owner (the
// user_data) has charge_memory(int64_t), called with + on allocation and
// - on free.
//   mem_ = small_alloc::counted_table<ngtcp2_mem>(this);
template <typename Owner> void *counted_malloc(size_t n, void *ud) {
  void *p = allocate(n);
  if (p) static_cast<Owner *>(ud)->charge_memory(static_cast<int64_t>(block_size(p)));
  return p;
}
template <typename Owner> void counted_free(void *p, void *ud) {
  if (!p) return;
  static_cast<Owner *>(ud)->charge_memory(-static_cast<int64_t>(block_size(p)));
  deallocate(p);
}
template <typename Owner> void *counted_calloc(size_t count, size_t n, void *ud) {
  void *p = allocate_zeroed(count, n);
  if (p) static_cast<Owner *>(ud)->charge_memory(static_cast<int64_t>(block_size(p)));
  return p;
}
template <typename Owner> void *counted_realloc(void *p, size_t n, void *ud) {
  const int64_t before = p ? static_cast<int64_t>(block_size(p)) : 0;
  void *q = reallocate(p, n);
  if (q) static_cast<Owner *>(ud)->charge_memory(static_cast<int64_t>(block_size(q)) - before);
  return q;
}
template <typename Mem, typename Owner> Mem counted_table(Owner *owner) {
  return Mem{owner, counted_malloc<Owner>, counted_free<Owner>, counted_calloc<Owner>,
             counted_realloc<Owner>};
}

// For standard containers on a worker's request path (a container must be
// freed on the thread that filled it, or its blocks join that thread's
// cache).
template <typename T> struct StlAllocator {
  using value_type = T;
  StlAllocator() = default;
  template <typename U> StlAllocator(const StlAllocator<U> &) noexcept {}
  T *allocate(size_t n) {
    if (n > SIZE_MAX / sizeof(T)) throw_bad_alloc();
    if (void *p = small_alloc::allocate(n * sizeof(T))) return static_cast<T *>(p);
    throw_bad_alloc();
  }
  void deallocate(T *p, size_t) noexcept { small_alloc::deallocate(p); }
  template <typename U> bool operator==(const StlAllocator<U> &) const noexcept { return true; }
};

} // namespace xdpq::small_alloc
