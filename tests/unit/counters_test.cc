#include "control/counters.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

using namespace xdpq;

namespace {

uint64_t value_of(const control::Counters &c, const std::string &name) {
  for (const auto &k : c)
    if (k.name == name) return k.value;
  ADD_FAILURE() << name << " missing";
  return 0;
}

} // namespace

// Regression (review): workers are summed counter by counter in order, and
// the upstream groups stood before the AF_XDP ones. Around a reload that
// changes the routes, a worker with a longer upstream list put its extra
// upstreams' figures in the others' afxdp_* totals, and the names a
// shorter first list lacked were dropped.
TEST(Counters, WorkersWithDifferentUpstreamListsAddUp) {
  std::vector<control::WorkerSnapshot> snaps(2);
  snaps[0].upstreams.resize(1);
  snaps[1].upstreams.resize(2);
  snaps[0].h3.requests = 1;
  snaps[1].h3.requests = 2;
  snaps[0].upstreams[0].requests = 3;
  snaps[1].upstreams[0].requests = 4;
  snaps[1].upstreams[1].requests = 7;
#ifdef XDPQ_HAVE_AFXDP
  snaps[0].afxdp.tx_kicks = 5;
  snaps[1].afxdp.tx_kicks = 5;
#endif
  const auto total = control::sum(snaps);
  EXPECT_EQ(value_of(total, "requests"), 3u);
  EXPECT_EQ(value_of(total, "upstream0_requests"), 7u);
  EXPECT_EQ(value_of(total, "upstream1_requests"), 7u);
#ifdef XDPQ_HAVE_AFXDP
  EXPECT_EQ(value_of(total, "afxdp_tx_kicks"), 10u);
#endif
  std::set<std::string> names;
  for (const auto &k : total) EXPECT_TRUE(names.insert(k.name).second) << k.name;
  EXPECT_EQ(total.size(), control::counters_of(snaps[1]).size());
}
