#include "http/router.h"
#include "http/static_files.h"

#include "body_text.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

using namespace xdpq::http;
using xdpq::testing::body_of;
namespace fs = std::filesystem;

namespace {

const std::string *header(const Response &r, const std::string &name) {
  for (const auto &h : r.headers) {
    if (h.name == name) return &h.value;
  }
  return nullptr;
}

class StaticFilesTest : public ::testing::Test {
protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("xdpq-static-" + std::to_string(getpid()));
    fs::create_directories(base_ / "root" / "sub");
    write(base_ / "root" / "index.html", "<h1>home</h1>");
    write(base_ / "root" / "a.txt", "0123456789");
    write(base_ / "root" / "sub" / "index.html", "sub index");
    write(base_ / "secret.txt", "TOP SECRET");
    fs::create_symlink(base_ / "secret.txt", base_ / "root" / "link-out");
    handler_ = std::make_unique<StaticFiles>((base_ / "root").string());
  }
  void TearDown() override { fs::remove_all(base_); }
  static void write(const fs::path &p, const std::string &s) { std::ofstream(p) << s; }
  Response get(const std::string &path, std::vector<Header> headers = {}) {
    Request r;
    r.method = "GET";
    r.path = path;
    r.headers = std::move(headers);
    Response resp;
    handler_->handle(r, resp);
    return resp;
  }
  fs::path base_;
  std::unique_ptr<StaticFiles> handler_;
};

} // namespace

TEST_F(StaticFilesTest, ServesFilesWithTypeLengthEtag) {
  auto r = get("/a.txt");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(body_of(r), "0123456789");
  EXPECT_EQ(r.content_length, 10u);
  ASSERT_NE(header(r, "content-type"), nullptr);
  EXPECT_EQ(*header(r, "content-type"), "text/plain; charset=utf-8");
  ASSERT_NE(header(r, "etag"), nullptr);
  EXPECT_EQ(body_of(get("/")), "<h1>home</h1>");
  EXPECT_EQ(body_of(get("/sub/")), "sub index");
  EXPECT_EQ(body_of(get("/sub")), "sub index");
  EXPECT_EQ(body_of(get("/%61.txt")), "0123456789");
  EXPECT_EQ(get("/missing").status, 404);
}

TEST_F(StaticFilesTest, IfNoneMatchGives304) {
  auto r = get("/a.txt");
  std::string etag = *header(r, "etag");
  auto r2 = get("/a.txt", {{"if-none-match", "\"other\", " + etag}});
  EXPECT_EQ(r2.status, 304);
  EXPECT_EQ(r2.body, nullptr);
  EXPECT_EQ(get("/a.txt", {{"if-none-match", "\"other\""}}).status, 200);
}

TEST_F(StaticFilesTest, SingleRange) {
  auto r = get("/a.txt", {{"range", "bytes=2-4"}});
  EXPECT_EQ(r.status, 206);
  EXPECT_EQ(body_of(r), "234");
  EXPECT_EQ(*header(r, "content-range"), "bytes 2-4/10");
  EXPECT_EQ(body_of(get("/a.txt", {{"range", "bytes=-3"}})), "789");
  EXPECT_EQ(body_of(get("/a.txt", {{"range", "bytes=7-"}})), "789");
  EXPECT_EQ(body_of(get("/a.txt", {{"range", "bytes=8-100"}})), "89");
  auto bad = get("/a.txt", {{"range", "bytes=10-"}});
  EXPECT_EQ(bad.status, 416);
  EXPECT_EQ(*header(bad, "content-range"), "bytes */10");
  // Several ranges, or other units: ignored, whole file.
  EXPECT_EQ(get("/a.txt", {{"range", "bytes=0-1,4-5"}}).status, 200);
  EXPECT_EQ(get("/a.txt", {{"range", "items=0-1"}}).status, 200);
}

TEST_F(StaticFilesTest, TraversalAttemptsAreRejected) {
  for (const char *p : {"/../secret.txt", "/sub/../../secret.txt", "/%2e%2e/secret.txt",
                        "/%2E%2E%2Fsecret.txt", "/..%2fsecret.txt", "/a.txt%00.html",
                        "/sub/..\\..\\secret.txt", "/%zz"}) {
    auto r = get(p);
    EXPECT_TRUE(r.status == 400 || r.status == 403 || r.status == 404) << p << " " << r.status;
    EXPECT_EQ(body_of(r).find("SECRET"), std::string::npos) << p;
  }
  // A symlink that leaves the root is refused too.
  auto r = get("/link-out");
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(body_of(r).find("SECRET"), std::string::npos);
}

TEST(NormalizePath, Segments) {
  std::string out;
  EXPECT_TRUE(normalize_path("/a/./b//c?x=1", out));
  EXPECT_EQ(out, "a/b/c");
  EXPECT_TRUE(normalize_path("/", out));
  EXPECT_EQ(out, "");
  EXPECT_FALSE(normalize_path("a/b", out));
  EXPECT_FALSE(normalize_path("/a/../b", out));
  EXPECT_FALSE(normalize_path("/a%2", out));
}

TEST(StaticFilesCtor, MissingRootThrows) {
  EXPECT_THROW(StaticFiles("/nonexistent/xdpq-root"), std::runtime_error);
}
