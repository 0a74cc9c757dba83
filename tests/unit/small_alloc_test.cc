#include "base/small_alloc.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define XDPQ_TEST_ASAN 1
#endif

namespace sa = xdpq::small_alloc;

TEST(SmallAlloc, ClassesCoverEverySizeTightly) {
  size_t prev_cls = 0;
  for (size_t n = 1; n <= sa::MAX_SMALL; ++n) {
    size_t c = sa::class_of(n);
    ASSERT_GE(sa::class_size(c), n) << n;
    if (c > 0) {
      ASSERT_LT(sa::class_size(c - 1), n) << n; // the smallest class that fits
    }
    ASSERT_GE(c, prev_cls);
    // At most a quarter wasted above 64 bytes.
    if (n > 64) {
      ASSERT_LE(sa::class_size(c) - n, n / 4 + 1) << n;
    }
    prev_cls = c;
  }
  EXPECT_EQ(sa::class_size(sa::class_of(sa::MAX_SMALL)), sa::MAX_SMALL);
}

TEST(SmallAlloc, FreedBlockIsReusedForTheSameClass) {
  sa::trim();
  void *a = sa::allocate(100);
  ASSERT_NE(a, nullptr);
  std::memset(a, 0xab, 100);
  auto before = sa::thread_stats();
  sa::deallocate(a);
  EXPECT_EQ(sa::thread_stats().cached_bytes,
            before.cached_bytes + sa::class_size(sa::class_of(100)));
  void *b = sa::allocate(110); // same class (97..112)
  EXPECT_EQ(a, b);
  EXPECT_EQ(sa::thread_stats().hits, before.hits + 1);
  void *c = sa::allocate(100); // the list is empty again: from malloc
  EXPECT_NE(c, b);
  EXPECT_EQ(sa::thread_stats().misses, before.misses + 1);
  sa::deallocate(b);
  sa::deallocate(c);
  sa::trim();
  EXPECT_EQ(sa::thread_stats().cached_bytes, 0u);
}

TEST(SmallAlloc, LargeBlocksBypassTheCache) {
  sa::trim();
  void *p = sa::allocate(sa::MAX_SMALL + 1);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, sa::MAX_SMALL + 1);
  sa::deallocate(p);
  EXPECT_EQ(sa::thread_stats().cached_bytes, 0u);
}

TEST(SmallAlloc, CacheIsBounded) {
  sa::trim();
  std::vector<void *> blocks;
  size_t n = sa::CACHE_BYTES / 4096 + 100;
  for (size_t i = 0; i < n; ++i)
    blocks.push_back(sa::allocate(4096));
  for (void *p : blocks)
    sa::deallocate(p);
  EXPECT_LE(sa::thread_stats().cached_bytes, sa::CACHE_BYTES);
  EXPECT_GT(sa::thread_stats().cached_bytes, sa::CACHE_BYTES - 4096 - 1);
  sa::trim();
}

TEST(SmallAlloc, ReallocKeepsContentAcrossClassesAndToLarge) {
  auto *p = static_cast<unsigned char *>(sa::allocate(10));
  for (int i = 0; i < 10; ++i)
    p[i] = static_cast<unsigned char>(i);
  p = static_cast<unsigned char *>(sa::reallocate(p, 1000));
  for (int i = 0; i < 10; ++i)
    ASSERT_EQ(p[i], i);
  for (int i = 0; i < 1000; ++i)
    p[i] = static_cast<unsigned char>(i * 7);
  p = static_cast<unsigned char *>(sa::reallocate(p, sa::MAX_SMALL * 4));
  for (int i = 0; i < 1000; ++i)
    ASSERT_EQ(p[i], static_cast<unsigned char>(i * 7));
  p = static_cast<unsigned char *>(sa::reallocate(p, 20)); // back into a small class
  for (int i = 0; i < 20; ++i)
    ASSERT_EQ(p[i], static_cast<unsigned char>(i * 7));
  sa::deallocate(p);
  sa::deallocate(nullptr);
}

TEST(SmallAlloc, CallocZeroesAndRefusesOverflow) {
  void *a = sa::allocate(256);
  std::memset(a, 0xff, 256);
  sa::deallocate(a);
  auto *z = static_cast<unsigned char *>(sa::allocate_zeroed(16, 16)); // reuses a
  for (int i = 0; i < 256; ++i)
    ASSERT_EQ(z[i], 0);
  sa::deallocate(z);
  EXPECT_EQ(sa::allocate_zeroed(SIZE_MAX / 2, 3), nullptr);
}

TEST(SmallAlloc, BlocksFreedOnAnotherThreadAndThreadExitFlushes) {
  void *p = sa::allocate(48);
  uint64_t cached_there = 0;
  std::thread t([&] {
    sa::deallocate(p); // joins this thread's lists...
    cached_there = sa::thread_stats().cached_bytes;
  }); // ...and goes back to malloc when the thread ends (LSan would see a leak)
  t.join();
  EXPECT_EQ(cached_there, sa::class_size(sa::class_of(48)));
}

struct Pooled {
  XDPQ_SMALL_ALLOC_OPERATORS
  virtual ~Pooled() = default;
  char pad[40];
};
struct PooledBigger : Pooled {
  char more[200];
};

TEST(SmallAlloc, ClassOperatorsReuseBlocksForSubclasses) {
  sa::trim();
  auto *a = new PooledBigger;
  Pooled *base = a;
  delete base; // virtual destructor: the block goes back whole
  auto hits = sa::thread_stats().hits;
  auto *b = new PooledBigger;
  EXPECT_EQ(static_cast<void *>(b), static_cast<void *>(a));
  EXPECT_EQ(sa::thread_stats().hits, hits + 1);
  delete b;
  sa::trim();
}

#ifdef XDPQ_TEST_ASAN
TEST(SmallAlloc, CachedBlocksArePoisonedUnderAsan) {
  sa::trim();
  void *p = sa::allocate(64);
  EXPECT_FALSE(__asan_address_is_poisoned(p));
  sa::deallocate(p);
  EXPECT_TRUE(__asan_address_is_poisoned(p)); // a use after free is still caught
  void *q = sa::allocate(64);
  EXPECT_FALSE(__asan_address_is_poisoned(q));
  sa::deallocate(q);
  sa::trim();
}
#endif
