#include "http/handlers.h"
#include "http/router.h"

#include "body_text.h"

#include <gtest/gtest.h>

using namespace xdpq::http;
using xdpq::testing::body_of;

namespace {
Request req(std::string method, std::string path, std::string body = {}) {
  Request r;
  r.method = std::move(method);
  r.path = std::move(path);
  r.body = std::move(body);
  return r;
}
} // namespace

TEST(Router, BuiltinRoutes) {
  auto router = make_default_router(RouterConfig{});
  Response resp;
  router->route(req("GET", "/healthz"), resp);
  EXPECT_EQ(resp.status, 200);
  EXPECT_EQ(body_of(resp), "ok\n");

  router->route(req("GET", "/bytes/30"), resp);
  EXPECT_EQ(resp.status, 200);
  EXPECT_EQ(body_of(resp), "abcdefghijklmnopqrstuvwxyzabcd");
  EXPECT_EQ(resp.content_length, 30u);

  router->route(req("GET", "/bytes/0"), resp);
  EXPECT_EQ(resp.status, 200);
  EXPECT_EQ(resp.content_length, 0u);

  router->route(req("POST", "/echo", "hello"), resp);
  EXPECT_EQ(resp.status, 200);
  EXPECT_EQ(body_of(resp), "hello");

  router->route(req("GET", "/echo"), resp);
  EXPECT_EQ(resp.status, 405);

  router->route(req("GET", "/"), resp);
  EXPECT_EQ(resp.status, 200);
  EXPECT_NE(body_of(resp).find("xdpq"), std::string::npos);

  router->route(req("GET", "/nope"), resp);
  EXPECT_EQ(resp.status, 404);
}

TEST(Router, BytesLimitsAndMalformed) {
  auto router = make_default_router(RouterConfig{"", 1000, {}});
  Response resp;
  router->route(req("GET", "/bytes/1001"), resp);
  EXPECT_EQ(resp.status, 413);
  router->route(req("GET", "/bytes/12x"), resp);
  EXPECT_EQ(resp.status, 400);
  router->route(req("GET", "/bytes/"), resp);
  EXPECT_EQ(resp.status, 400);
  router->route(req("GET", "/bytes/-1"), resp);
  EXPECT_EQ(resp.status, 400);
  router->route(req("GET", "/bytes/5?x=1"), resp);
  EXPECT_EQ(resp.status, 200);
  EXPECT_EQ(body_of(resp), "abcde");
}

TEST(Router, HeadKeepsLengthDropsBody) {
  auto router = make_default_router(RouterConfig{});
  Response resp;
  router->route(req("HEAD", "/bytes/100"), resp);
  EXPECT_EQ(resp.status, 200);
  EXPECT_EQ(resp.content_length, 100u);
  EXPECT_EQ(resp.body, nullptr);
}

TEST(PatternBody, ChunksAtAnyOffsetAreConsistent) {
  PatternBody b(200000);
  std::string all;
  for (uint64_t off = 0; off < b.size();) {
    auto c = b.chunk(off);
    ASSERT_GT(c.size(), 0u);
    all.append(reinterpret_cast<const char *>(c.data()), c.size());
    off += c.size();
  }
  ASSERT_EQ(all.size(), 200000u);
  for (size_t i = 0; i < all.size(); i += 997) {
    ASSERT_EQ(all[i], static_cast<char>('a' + i % 26)) << i;
  }
  auto mid = b.chunk(12345);
  EXPECT_EQ(mid[0], 'a' + 12345 % 26);
}

TEST(Router, AuthorityThatIsNotAHostGets400) {
  auto router = make_default_router(RouterConfig{});
  Response resp;
  for (const char *bad : {"u@a", "a/b", "a b", "[::1", "a:8x"}) {
    Request r = req("GET", "/healthz");
    r.authority = bad;
    router->route(r, resp);
    EXPECT_EQ(resp.status, 400) << bad;
  }
  for (const char *good : {"", "a", "a:443", "[::1]:443", "xn--d1a.example"}) {
    Request r = req("GET", "/healthz");
    r.authority = good;
    router->route(r, resp);
    EXPECT_EQ(resp.status, 200) << good;
  }
  // Regression (review): HTTP/2 takes a Host field for a missing
  // :authority, and it was not checked: "u@a" was served.
  for (const char *bad : {"u@a", "a/b"}) {
    Request r = req("GET", "/healthz");
    r.headers.add("host", bad);
    router->route(r, resp);
    EXPECT_EQ(resp.status, 400) << bad;
  }
  Request r = req("GET", "/healthz");
  r.headers.add("host", "a:443");
  router->route(r, resp);
  EXPECT_EQ(resp.status, 200);
}

// Production: no /echo or /bytes/N (a file of that name is served instead);
// /healthz stays.
TEST(Router, WithoutTestRoutes) {
  RouterConfig cfg;
  cfg.test_routes = false;
  auto router = make_default_router(cfg);
  Response resp;
  router->route(req("GET", "/healthz"), resp);
  EXPECT_EQ(resp.status, 200);
  router->route(req("GET", "/bytes/30"), resp);
  EXPECT_EQ(resp.status, 404);
  router->route(req("POST", "/echo", "hello"), resp);
  EXPECT_EQ(resp.status, 405); // the static files take no POST
}
