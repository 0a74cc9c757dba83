#include "base/small_alloc.h"

#include <malloc.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#define XDPQ_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define XDPQ_ASAN 1
#endif
#endif
#ifdef XDPQ_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace xdpq::small_alloc {

namespace {

constexpr size_t NCLASS = 40;
static_assert(NCLASS == 4 + 4 * (std::bit_width(MAX_SMALL) - 1 - 6));
constexpr uint32_t LARGE = 0xffffffffu;

// Sits before every block; 16 bytes keep the block 16-byte aligned (what
// malloc promises). While cached, next links the free list (the header is
// never poisoned, the block is).
struct alignas(16) Header {
  uint32_t cls; // size class, or LARGE
  uint32_t pad;
  Header *next; // free-list link while cached
};
static_assert(sizeof(Header) == 16);

struct Cache {
  Header *heads[NCLASS];
  uint64_t cached_bytes;
  uint64_t hits;
  uint64_t misses;
  bool registered; // the flush at thread exit is registered
  bool dead;       // this thread's cache was flushed at thread exit
};
// Trivially destructible: still usable by other thread-exit destructors.
thread_local Cache cache;

void flush(Cache &c) noexcept {
  for (size_t i = 0; i < NCLASS; ++i) {
    while (Header *h = c.heads[i]) {
      c.heads[i] = h->next;
      UNPOISON(h + 1, class_size(i));
      std::free(h);
    }
  }
  c.cached_bytes = 0;
}

// Flushes the cache when the thread ends; later frees bypass it.
struct ThreadExit {
  ~ThreadExit() {
    flush(cache);
    cache.dead = true;
  }
};
thread_local ThreadExit thread_exit;

// First use of the non-trivial thread_local registers its destructor.
void register_thread_exit(Cache &c) noexcept {
  if (!c.registered) {
    c.registered = true;
    (void)&thread_exit;
  }
}

Header *header_of(void *p) noexcept {
  return static_cast<Header *>(p) - 1;
}

} // namespace

size_t class_of(size_t n) noexcept {
  if (n <= 64)
    return n == 0 ? 0 : (n - 1) / 16;
  // 2^(p-1) < n <= 2^p: four classes of 2^(p-3) bytes each.
  unsigned p = std::bit_width(n - 1);
  size_t step = size_t{1} << (p - 3);
  return 4 + (p - 7) * 4 + (n - 1 - (size_t{1} << (p - 1))) / step;
}

size_t class_size(size_t cls) noexcept {
  if (cls < 4)
    return 16 * (cls + 1);
  unsigned p = static_cast<unsigned>(7 + (cls - 4) / 4);
  size_t sub = (cls - 4) % 4;
  return (size_t{1} << (p - 1)) + (sub + 1) * (size_t{1} << (p - 3));
}

void *allocate(size_t n) noexcept {
  if (n > MAX_SMALL) {
    auto *h = static_cast<Header *>(std::malloc(sizeof(Header) + n));
    if (!h)
      return nullptr;
    h->cls = LARGE;
    return h + 1;
  }
  size_t cls = class_of(n);
  Cache &c = cache;
  if (Header *h = c.heads[cls]) {
    c.heads[cls] = h->next;
    c.cached_bytes -= class_size(cls);
    c.hits += 1;
    UNPOISON(h + 1, class_size(cls));
    return h + 1;
  }
  c.misses += 1;
  auto *h = static_cast<Header *>(std::malloc(sizeof(Header) + class_size(cls)));
  if (!h)
    return nullptr;
  h->cls = static_cast<uint32_t>(cls);
  return h + 1;
}

void deallocate(void *p) noexcept {
  if (!p)
    return;
  Header *h = header_of(p);
  Cache &c = cache;
  if (h->cls == LARGE || c.dead || c.cached_bytes + class_size(h->cls) > CACHE_BYTES) {
    std::free(h);
    return;
  }
  register_thread_exit(c); // the block stays with this thread until it ends
  size_t size = class_size(h->cls);
  POISON(p, size);
  h->next = c.heads[h->cls];
  c.heads[h->cls] = h;
  c.cached_bytes += size;
}

size_t block_size(const void *p) noexcept {
  const Header *h = header_of(const_cast<void *>(p));
  if (h->cls == LARGE) return malloc_usable_size(const_cast<Header *>(h)) - sizeof(Header);
  return class_size(h->cls);
}

void *allocate_zeroed(size_t count, size_t n) noexcept {
  size_t total;
  if (__builtin_mul_overflow(count, n, &total))
    return nullptr;
  void *p = allocate(total);
  if (p)
    std::memset(p, 0, total);
  return p;
}

void *reallocate(void *p, size_t n) noexcept {
  if (!p)
    return allocate(n);
  Header *h = header_of(p);
  if (h->cls == LARGE) {
    if (n > MAX_SMALL) {
      auto *g = static_cast<Header *>(std::realloc(h, sizeof(Header) + n));
      return g ? g + 1 : nullptr;
    }
    // Shrinking into a small class: the first n bytes are all that count.
    void *q = allocate(n);
    if (!q)
      return nullptr;
    std::memcpy(q, p, n);
    std::free(h);
    return q;
  }
  size_t have = class_size(h->cls);
  if (n <= have && (n > have / 2 || have <= 64))
    return p; // fits, not wastefully
  void *q = allocate(n);
  if (!q)
    return nullptr;
  std::memcpy(q, p, n < have ? n : have);
  deallocate(p);
  return q;
}

ThreadStats thread_stats() noexcept {
  const Cache &c = cache;
  return ThreadStats{c.hits, c.misses, c.cached_bytes};
}

void trim() noexcept {
  flush(cache);
}

void throw_bad_alloc() {
  throw std::bad_alloc();
}

} // namespace xdpq::small_alloc
