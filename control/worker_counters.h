#pragma once
// The worker's own counters (beside those of its port, endpoint, sessions
// and proxy): gauges, heap traffic and cross-queue hand-offs. Exported by
// control/counters.cc from the X-macro tables below.

#include "base/counters.h"

namespace xdpq::control {

#define XDPQ_WORKER_GAUGES(X)                                                                      \
  X(quic_connections, "QUIC connections open")                                                     \
  X(tcp_connections, "TCP connections open")                                                       \
  X(body_bytes_held, "request body bytes held (and responses made from them)")                     \
  X(body_bytes_limit, "the worker's body budget (--max-body-per-worker)")                          \
  X(block_cache_bytes, "freed small blocks the worker's thread keeps for reuse")                   \
  X(file_read_bytes_held, "large-file bytes read ahead and not yet sent and acknowledged")         \
  X(quic_memory_bytes, "bytes ngtcp2 and nghttp3 hold for the worker's QUIC connections")                     \
  X(proxy_waiting, "proxied requests waiting for an upstream connection (every upstream of "       \
                   "their route at its connection limit)")                                         \
  X(tls_contexts_retired, "QUIC TLS contexts a certificate reload replaced, kept until the "      \
                          "last connection that began with one ends")

struct WorkerGauges {
  XDPQ_COUNTER_FIELDS(XDPQ_WORKER_GAUGES)
  template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_WORKER_GAUGES) }
};

// The worker thread's heap traffic.
#define XDPQ_WORKER_HEAP_COUNTERS(X)                                                               \
  X(block_cache_hits, "small blocks served from the worker's block cache")                         \
  X(block_cache_misses, "small blocks the block cache had to take from malloc")                    \
  X(heap_allocations, "malloc calls on the worker's thread (counted only under the "               \
                      "benchmark shim libxdpq_malloc_count.so; 0 otherwise)")

struct WorkerHeap {
  XDPQ_COUNTER_FIELDS(XDPQ_WORKER_HEAP_COUNTERS)
  template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_WORKER_HEAP_COUNTERS) }
};

// Cross-queue routing: datagrams for a connection another worker owns.
#define XDPQ_WORKER_HANDOFF_COUNTERS(X)                                                            \
  X(handoff_received, "datagrams other workers handed to this one (their owner)")                 \
  X(handoff_wakeups, "wakeups sent to other workers for datagrams handed to them")                 \
  X(handoff_ring_full, "datagrams not handed off: the owner's ring was full")                      \
  X(handoff_too_big, "datagrams not handed off: larger than a hand-off slot")

struct WorkerHandoff {
  XDPQ_COUNTER_FIELDS(XDPQ_WORKER_HANDOFF_COUNTERS)
  template <typename F> void visit(F &&f) const {
    XDPQ_COUNTER_VISIT(XDPQ_WORKER_HANDOFF_COUNTERS)
  }
};

// The worker's passes over its port, and what else it reads and writes.
#define XDPQ_WORKER_PASS_COUNTERS(X)                                                               \
  X(output_flushed_mid_pass, "times a pass sent what it had ready before going on, after "       \
                             "100 us of further work (a burst of handshakes, say)")             \
  X(side_door_datagrams, "datagrams read from the sockets reserving the ports (AF_XDP: UDP "     \
                         "that reached the kernel, from this host or another interface)")       \
  X(access_log_lost_writes, "access log writes that lost lines (a full disk, an I/O error)")     \
  X(file_descriptors_refused, "large files not opened: the worker held its bound of file "       \
                              "descriptors (twice file_cache_entries, and 1,024); 503 unless "  \
                              "a cached copy could be served")

struct WorkerPasses {
  XDPQ_COUNTER_FIELDS(XDPQ_WORKER_PASS_COUNTERS)
  template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_WORKER_PASS_COUNTERS) }
};

} // namespace xdpq::control
