#include "dataplane/address.h"
#include "dataplane/cpu.h"

#include <gtest/gtest.h>

using namespace xdpq::dataplane;

TEST(Address, ParsesIpv4AndIpv6) {
  auto a = parse_address("127.0.0.1:4433");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->family(), AF_INET);
  EXPECT_EQ(a->port(), 4433);
  EXPECT_EQ(a->to_string(), "127.0.0.1:4433");
  auto b = parse_address("[::1]:443");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->family(), AF_INET6);
  EXPECT_EQ(b->to_string(), "[::1]:443");
  EXPECT_FALSE(*a == *b);
  EXPECT_TRUE(*a == *parse_address("127.0.0.1:4433"));
}

TEST(Address, RejectsMalformedWithReason) {
  std::string why;
  EXPECT_FALSE(parse_address("127.0.0.1", &why));
  EXPECT_NE(why.find("ADDR:PORT"), std::string::npos);
  EXPECT_FALSE(parse_address("::1:443", &why));
  EXPECT_NE(why.find("brackets"), std::string::npos);
  EXPECT_FALSE(parse_address("1.2.3.4:99999", &why));
  EXPECT_FALSE(parse_address("localhost:443", &why));
  EXPECT_FALSE(parse_address("[::1:443", &why));
}

TEST(CpuList, ParsesRangesAndRejectsJunk) {
  auto v = parse_cpu_list("0-2,5");
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, (std::vector<int>{0, 1, 2, 5}));
  std::string why;
  EXPECT_FALSE(parse_cpu_list("3-1", &why));
  EXPECT_FALSE(parse_cpu_list("a", &why));
  EXPECT_FALSE(parse_cpu_list("", &why));
}
