#include "dataplane/handoff_ring.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>
#include <vector>

using namespace xdpq::dataplane;

namespace {

struct Copy {
  std::vector<uint8_t> data;
  Path path;
  uint8_t ecn;
  uint64_t link;
};

RxDatagram datagram(std::vector<uint8_t> &bytes, uint16_t port, uint64_t link = 7) {
  RxDatagram dg{};
  dg.data = bytes.data();
  dg.len = bytes.size();
  dg.path.local = *parse_address("10.0.0.1:443");
  dg.path.remote = *parse_address("10.0.0.2:" + std::to_string(port));
  dg.ecn = 2;
  dg.link = link;
  return dg;
}

std::vector<Copy> drain_all(HandoffRing &r, size_t max = SIZE_MAX) {
  std::vector<Copy> out;
  r.drain(
      [&](const RxDatagram &dg) {
        out.push_back(Copy{{dg.data, dg.data + dg.len}, dg.path, dg.ecn, dg.link});
      },
      max);
  return out;
}

} // namespace

TEST(HandoffRing, CopiesDatagramWithItsPathInOrder) {
  HandoffRing r(4);
  std::vector<uint8_t> a{1, 2, 3}, b(1400, 0x5a);
  ASSERT_EQ(r.push(datagram(a, 5000, 0x11)), HandoffRing::Push::ok);
  ASSERT_EQ(r.push(datagram(b, 5001, 0x22)), HandoffRing::Push::ok);
  a[0] = 99; // the ring holds its own copy
  auto got = drain_all(r);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].data, (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(got[0].path.remote.port(), 5000);
  EXPECT_EQ(got[0].path.local, *parse_address("10.0.0.1:443"));
  EXPECT_EQ(got[0].ecn, 2);
  EXPECT_EQ(got[0].link, 0x11u);
  EXPECT_EQ(got[1].data, b);
  EXPECT_EQ(got[1].link, 0x22u);
  EXPECT_TRUE(r.empty());
  EXPECT_TRUE(drain_all(r).empty());
}

TEST(HandoffRing, RefusesWhenFullOrTooBigAndRecovers) {
  HandoffRing r(3); // rounded up to 4
  EXPECT_EQ(r.capacity(), 4u);
  std::vector<uint8_t> small{1}, big(HandoffRing::MAX_PAYLOAD + 1, 0);
  EXPECT_EQ(r.push(datagram(big, 1)), HandoffRing::Push::too_big);
  for (uint16_t i = 0; i < 4; ++i) EXPECT_EQ(r.push(datagram(small, i)), HandoffRing::Push::ok);
  EXPECT_EQ(r.push(datagram(small, 9)), HandoffRing::Push::full);
  // Draining part of it makes room for exactly that much, and the order
  // survives the wrap.
  auto first = drain_all(r, 2);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[1].path.remote.port(), 1);
  EXPECT_EQ(r.push(datagram(small, 4)), HandoffRing::Push::ok);
  EXPECT_EQ(r.push(datagram(small, 5)), HandoffRing::Push::ok);
  EXPECT_EQ(r.push(datagram(small, 6)), HandoffRing::Push::full);
  auto rest = drain_all(r);
  ASSERT_EQ(rest.size(), 4u);
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i].path.remote.port(), i + 2);
}

// One producer thread and one consumer thread: everything pushed arrives
// once, in order, intact (run under TSan or ASan to check the ordering).
TEST(HandoffRing, TwoThreadsLoseNothingAndKeepOrder) {
  HandoffRing r(64);
  constexpr uint32_t N = 200000;
  std::thread producer([&] {
    std::vector<uint8_t> buf(64);
    for (uint32_t i = 0; i < N;) {
      std::memcpy(buf.data(), &i, sizeof(i));
      buf.back() = static_cast<uint8_t>(i * 7);
      auto dg = datagram(buf, static_cast<uint16_t>(i));
      if (r.push(dg) == HandoffRing::Push::ok) {
        ++i;
      } else {
        std::this_thread::yield();
      }
    }
  });
  uint32_t expect = 0;
  bool intact = true;
  while (expect < N) {
    r.drain([&](const RxDatagram &dg) {
      uint32_t v;
      std::memcpy(&v, dg.data, sizeof(v));
      if (v != expect || dg.len != 64 || dg.data[63] != static_cast<uint8_t>(v * 7) ||
          dg.path.remote.port() != static_cast<uint16_t>(v)) {
        intact = false;
      }
      ++expect;
    });
  }
  producer.join();
  EXPECT_TRUE(intact);
  EXPECT_EQ(expect, N);
  EXPECT_TRUE(r.empty());
}

// Binary upgrade: rings in a memfd carry datagrams from one
// process to another (here a forked child), in order, with the ring's
// flow control working across the two.
TEST(HandoffRegion, CarriesDatagramsBetweenProcesses) {
  HandoffRegion region(3, 64);
  ASSERT_EQ(region.count(), 3u);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The producer: its own view of the same memory, through the fd.
    HandoffRegion view(region.fd(), 3, 64);
    for (uint32_t i = 0; i < 10000; ++i) {
      std::vector<uint8_t> bytes(100 + i % 900, static_cast<uint8_t>(i));
      std::memcpy(bytes.data(), &i, sizeof(i));
      auto dg = datagram(bytes, static_cast<uint16_t>(1000 + i % 50000));
      while (view.ring(2).push(dg) == HandoffRing::Push::full) {
      }
    }
    _exit(0);
  }
  uint32_t next = 0;
  bool ok = true;
  while (next < 10000 && ok) {
    region.ring(2).drain([&](const RxDatagram &dg) {
      uint32_t i;
      std::memcpy(&i, dg.data, sizeof(i));
      ok = ok && i == next && dg.len == 100 + i % 900 && dg.data[dg.len - 1] == (i & 0xff) &&
           dg.path.remote.port() == 1000 + i % 50000 && dg.link == 7;
      ++next;
    });
  }
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(ok) << "at datagram " << next;
  EXPECT_EQ(next, 10000u);
  EXPECT_TRUE(region.ring(0).empty());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // A memfd of another shape is refused.
  EXPECT_THROW(HandoffRegion(region.fd(), 4, 64), std::runtime_error);
}

// Regression: the consumer trusted the producer's tail. A producer in
// another process that wrote one past what the ring holds (a bug, another
// layout) made drain() read the same slots round and round, as many times
// as the tail said: the worker hung.
TEST(HandoffRing, ATailPastTheCapacityIsSkippedNotReadRoundAndRound) {
  std::vector<std::byte> buf(HandoffRing::region_bytes(8) + 64);
  void *p = buf.data();
  size_t space = buf.size();
  void *region = std::align(64, HandoffRing::region_bytes(8), p, space);
  ASSERT_NE(region, nullptr);
  HandoffRing consumer(region, 8, true);
  HandoffRing producer(region, 8, false);
  std::vector<uint8_t> bytes(100, 1);
  ASSERT_EQ(producer.push(datagram(bytes, 1000)), HandoffRing::Push::ok);
  // The tail is the region's first word: what a broken producer wrote.
  static_cast<std::atomic<uint64_t> *>(region)->store(1000);
  size_t calls = 0;
  EXPECT_EQ(consumer.drain([&](const RxDatagram &) { ++calls; }), 0u);
  EXPECT_EQ(calls, 0u);
  EXPECT_TRUE(consumer.empty());
  // The ring works again from there.
  ASSERT_EQ(producer.push(datagram(bytes, 1001)), HandoffRing::Push::ok);
  auto got = drain_all(consumer);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].path.remote.port(), 1001);
}
