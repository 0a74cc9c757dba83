// Allocation counter for benchmarks: LD_PRELOAD=build/release/libxdpq_malloc_count.so
// counts every malloc-family call per thread and passes it on to glibc.
// xdpqd finds xdpq_thread_malloc_count() at start (dlsym) and reports each
// worker thread's count as the heap_allocations counter, so bench/run.py can
// divide it by the requests served. Not for production: it only counts.

#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static __thread uint64_t count __attribute__((tls_model("initial-exec")));

__attribute__((visibility("default"))) uint64_t xdpq_thread_malloc_count(void) {
  return count;
}

void *malloc(size_t n) {
  count++;
  return __libc_malloc(n);
}

void *calloc(size_t k, size_t n) {
  count++;
  return __libc_calloc(k, n);
}

void *realloc(void *p, size_t n) {
  count++;
  return __libc_realloc(p, n);
}

void free(void *p) {
  __libc_free(p);
}

void *memalign(size_t align, size_t n) {
  count++;
  return __libc_memalign(align, n);
}

void *aligned_alloc(size_t align, size_t n) {
  count++;
  return __libc_memalign(align, n);
}

int posix_memalign(void **out, size_t align, size_t n) {
  count++;
  void *p = __libc_memalign(align, n);
  if (!p)
    return 12; // ENOMEM
  *out = p;
  return 0;
}

void *valloc(size_t n) {
  count++;
  return __libc_memalign(4096, n);
}
