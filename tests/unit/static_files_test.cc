#include "http/router.h"
#include "http/static_files.h"
#include "base/clock.h"

#include "body_text.h"

#include <gtest/gtest.h>

#include <cstring>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

using namespace xdpq::http;
using xdpq::testing::BODY_ABORTED;
using xdpq::testing::body_of;
namespace fs = std::filesystem;

namespace {

const std::string *header(const Response &r, const std::string &name) {
  for (const auto &h : r.headers) {
    if (h.name == name) return &h.value;
  }
  return nullptr;
}

// Descriptors of this process open on target.
size_t open_fds(const std::string &target) {
  size_t open = 0;
  for (const auto &fd : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto link = fs::read_symlink(fd.path(), ec);
    open += !ec && link.string().starts_with(target);
  }
  return open;
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
  // root/big.bin: 600 KiB, over the cache's whole-file limit (read on
  // demand), a pattern that shows where each byte came from.
  std::string write_big() {
    std::string big(600 * 1024, '\0');
    for (size_t i = 0; i < big.size(); ++i)
      big[i] = static_cast<char>('a' + i % 23);
    write(base_ / "root" / "big.bin", big);
    return big;
  }
  Response get(const std::string &path, std::vector<Header> headers = {}) {
    Request r;
    r.method = "GET";
    r.path = path;
    r.headers = std::move(headers);
    Response resp;
    handler_->handle(r, resp);
    return resp;
  }
  void with_limits(const FileCacheLimits &l) {
    handler_ = std::make_unique<StaticFiles>((base_ / "root").string(), l);
  }
  const FileCacheStats &cache_stats() { return handler_->cache().stats(); }
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
  auto moved = get("/sub"); // the index's relative links need the slash
  EXPECT_EQ(moved.status, 301);
  ASSERT_NE(header(moved, "location"), nullptr);
  EXPECT_EQ(*header(moved, "location"), "/sub/");
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

// Regression: only the first field line of a condition was read, where
// several lines of a list field are one list (RFC 9110 5.3): a resumed
// download whose If-Match came in two lines got 412. A field that is no
// list (Range, If-Range) sent twice cannot be understood: the range is
// ignored, not the first one served.
TEST_F(StaticFilesTest, ConditionsSpreadOverSeveralLinesAreOneList) {
  const std::string etag = *header(get("/a.txt"), "etag");
  EXPECT_EQ(get("/a.txt", {{"if-match", "\"other\""}, {"if-match", etag}}).status, 200);
  EXPECT_EQ(get("/a.txt", {{"if-match", "\"other\""}, {"if-match", "\"else\""}}).status, 412);
  EXPECT_EQ(get("/a.txt", {{"if-none-match", "\"other\""}, {"if-none-match", etag}}).status,
            304);
  EXPECT_EQ(get("/a.txt", {{"range", "bytes=2-4"}, {"range", "bytes=5-6"}}).status, 200);
  EXPECT_EQ(
      get("/a.txt", {{"range", "bytes=2-4"}, {"if-range", etag}, {"if-range", etag}}).status, 200);
  EXPECT_EQ(get("/a.txt", {{"range", "bytes=2-4"}, {"if-range", etag}}).status, 206);
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

// Regression (RFC 9110 14.1): the range unit is case-insensitive, and a
// position too large for 64 bits is still a position: a last one past
// the end is clamped (206), a first one past it is unsatisfiable (416).
// These were ignored (200, the whole file).
TEST_F(StaticFilesTest, RangeUnitCaseAndHugePositions) {
  EXPECT_EQ(body_of(get("/a.txt", {{"range", "Bytes=2-4"}})), "234");
  auto clamped = get("/a.txt", {{"range", "bytes=8-99999999999999999999999"}});
  EXPECT_EQ(clamped.status, 206);
  EXPECT_EQ(body_of(clamped), "89");
  EXPECT_EQ(get("/a.txt", {{"range", "bytes=99999999999999999999999-"}}).status, 416);
  auto suffix = get("/a.txt", {{"range", "bytes=-99999999999999999999999"}});
  EXPECT_EQ(suffix.status, 206);
  EXPECT_EQ(body_of(suffix), "0123456789");
  EXPECT_EQ(get("/a.txt", {{"range", "bytes=2-+4"}}).status, 200); // not a number: ignored
}

// RFC 9110 13.1.1: If-Match was not evaluated, so a client resuming a
// download with the ETag it began with got another version's bytes.
TEST_F(StaticFilesTest, IfMatchIsEvaluatedStrongly) {
  FileCacheLimits l;
  l.revalidate_ns = 0; // a change is seen at once
  with_limits(l);
  const std::string etag = *header(get("/a.txt"), "etag");
  auto part = get("/a.txt", {{"range", "bytes=2-4"}, {"if-match", "\"x\", " + etag}});
  EXPECT_EQ(part.status, 206);
  EXPECT_EQ(get("/a.txt", {{"if-match", "*"}}).status, 200);
  EXPECT_EQ(get("/a.txt", {{"if-match", "W/" + etag}}).status, 412); // never a strong match
  write(base_ / "root" / "a.txt", "a new version, longer");
  auto changed = get("/a.txt", {{"range", "bytes=2-4"}, {"if-match", etag}});
  EXPECT_EQ(changed.status, 412);
  EXPECT_EQ(header(changed, "content-range"), nullptr);
}

// RFC 9110 14.2: Range is for GET; a HEAD with one got a 206 (or a 416)
// describing a part.
TEST_F(StaticFilesTest, HeadIgnoresRange) {
  Request r;
  r.method = "HEAD";
  r.path = "/a.txt";
  r.headers = {{"range", "bytes=2-4"}};
  Response resp;
  handler_->handle(r, resp);
  EXPECT_EQ(resp.status, 200);
  EXPECT_EQ(resp.content_length, 10u);
  EXPECT_EQ(header(resp, "content-range"), nullptr);
}

// A file named as a directory ("/a.txt/") was served: two URLs for one
// file, where the file system (ENOTDIR) and other servers say no.
TEST_F(StaticFilesTest, AFileNamedAsADirectoryIsNotFound) {
  EXPECT_EQ(get("/a.txt/").status, 404);
  EXPECT_EQ(get("/a.txt/.").status, 404);
  EXPECT_EQ(get("/a.txt//").status, 404);
  // The same slash or dot written as an escape.
  EXPECT_EQ(get("/a.txt%2F").status, 404);
  EXPECT_EQ(get("/a.txt%2f").status, 404);
  EXPECT_EQ(get("/a.txt/%2e").status, 404);
  EXPECT_EQ(get("/a.txt%2F%2E").status, 404);
  EXPECT_EQ(get("/a.txt").status, 200);
  EXPECT_EQ(get("/a%2Etxt").status, 200);
  // The embedded page (no document root) likewise.
  handler_ = std::make_unique<StaticFiles>("");
  EXPECT_EQ(get("/index.html").status, 200);
  EXPECT_EQ(get("/index.html/").status, 404);
  EXPECT_EQ(get("/index.html%2F").status, 404);
  EXPECT_EQ(get("/").status, 200);
  with_limits({});
  EXPECT_EQ(body_of(get("/sub/")), "sub index");
  EXPECT_EQ(body_of(get("/")), "<h1>home</h1>");
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

// --- the open-file cache and hostile static files -------

TEST_F(StaticFilesTest, CacheHitsNeedNoFileSystem) {
  FileCacheLimits l;
  l.revalidate_ns = 3600'000'000'000ull; // an hour: nothing is rechecked here
  with_limits(l);
  EXPECT_EQ(body_of(get("/a.txt")), "0123456789");
  EXPECT_EQ(body_of(get("/a.txt")), "0123456789");
  EXPECT_EQ(cache_stats().misses, 1u);
  EXPECT_EQ(cache_stats().hits, 1u);
  // Within the interval a change on disk is not looked at (the documented
  // cost of serving without a system call)...
  write(base_ / "root" / "a.txt", "changed!");
  EXPECT_EQ(body_of(get("/a.txt")), "0123456789");
  EXPECT_EQ(cache_stats().revalidations, 0u);
}

// Regression: an entry marked stale (a read came up short: an I/O error,
// or a truncation undone) that its revalidation found unchanged stayed
// stale, so every later request opened and checked the file again.
TEST_F(StaticFilesTest, AStaleEntryFoundUnchangedIsFreshAgain) {
  FileCacheLimits l;
  l.revalidate_ns = 3600'000'000'000ull;
  with_limits(l);
  std::shared_ptr<const FileEntry> e;
  ASSERT_EQ(handler_->cache().lookup("a.txt", xdpq::monotonic_ns(), e), FileCache::Status::ok);
  e->stale = true;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(body_of(get("/a.txt")), "0123456789");
  EXPECT_EQ(cache_stats().revalidations, 1u);
  EXPECT_EQ(cache_stats().changed, 0u);
}

TEST_F(StaticFilesTest, CacheRevalidatesChangesAndDeletions) {
  FileCacheLimits l;
  l.revalidate_ns = 0; // check every time
  with_limits(l);
  auto first = get("/a.txt");
  std::string etag = *header(first, "etag");
  write(base_ / "root" / "a.txt", "new content");
  auto r = get("/a.txt");
  EXPECT_EQ(body_of(r), "new content");
  EXPECT_NE(*header(r, "etag"), etag);
  EXPECT_EQ(cache_stats().changed, 1u);
  // The response taken before the change still reads the old bytes.
  EXPECT_EQ(body_of(first), "0123456789");
  fs::remove(base_ / "root" / "a.txt");
  EXPECT_EQ(get("/a.txt").status, 404);
  EXPECT_EQ(cache_stats().entries, 0u); // the deleted file left the cache
}

// Regression: a file rewritten in place with its size and mtime kept
// (cp -p, rsync --inplace -t) kept its cached bytes and its strong ETag.
TEST_F(StaticFilesTest, ARewriteThatKeepsSizeAndMtimeIsSeen) {
  FileCacheLimits l;
  l.revalidate_ns = 0;
  with_limits(l);
  auto first = get("/a.txt");
  const std::string etag = *header(first, "etag");
  const auto mtime = fs::last_write_time(base_ / "root" / "a.txt");
  {
    std::fstream f(base_ / "root" / "a.txt", std::ios::in | std::ios::out | std::ios::binary);
    f << "ABCDEFGHIJ"; // same size, in place
  }
  fs::last_write_time(base_ / "root" / "a.txt", mtime);
  auto r = get("/a.txt");
  EXPECT_EQ(body_of(r), "ABCDEFGHIJ");
  EXPECT_NE(*header(r, "etag"), etag);
}

// Regression: a small file's entry kept its descriptor after its bytes were
// in memory, so a file deleted from the docroot kept its disk space for as
// long as the entry stayed cached.
TEST_F(StaticFilesTest, ASmallCachedFileHoldsNoDescriptor) {
  EXPECT_EQ(body_of(get("/a.txt")), "0123456789");
  EXPECT_EQ(open_fds((base_ / "root" / "a.txt").string()), 0u);
  EXPECT_EQ(body_of(get("/a.txt")), "0123456789"); // served from memory
}

// Regression: a large file's entry kept its descriptor, and with it the
// disk space of a file deleted from the docroot, for as long as nobody
// asked for its path again.
TEST_F(StaticFilesTest, TheSweepLetsGoOfDeletedFiles) {
  FileCacheLimits l;
  l.max_file_in_memory = 4; // read on demand: the entry keeps its descriptor
  l.revalidate_ns = 1'000'000'000; // the sweep's interval too
  with_limits(l);
  write(base_ / "root" / "gone.txt", "deleted later");
  auto held = get("/gone.txt"); // a response still reading the file
  EXPECT_EQ(get("/a.txt").status, 200);
  const std::string gone = (base_ / "root" / "gone.txt").string();
  fs::remove(base_ / "root" / "gone.txt");
  const uint64_t t0 = 10'000'000'000ull;
  sweep_file_caches(t0);
  EXPECT_EQ(cache_stats().swept, 1u);
  EXPECT_EQ(cache_stats().entries, 1u); // a.txt, still on disk, stays
  // The response that had it reads on; its descriptor closes with it.
  EXPECT_EQ(body_of(held), "deleted later");
  held = Response{};
  EXPECT_EQ(open_fds(gone), 0u);
  // Within the interval nothing is looked at again.
  fs::remove(base_ / "root" / "a.txt");
  sweep_file_caches(t0 + 500'000'000ull);
  EXPECT_EQ(cache_stats().entries, 1u);
  sweep_file_caches(t0 + 1'000'000'000ull);
  EXPECT_EQ(cache_stats().entries, 0u);
  EXPECT_EQ(cache_stats().swept, 2u);
}

// Regression: each sweep checked the same SWEEP_CHECKS least recently used
// descriptors again, so a deleted file further up the list was never seen.
TEST_F(StaticFilesTest, TheSweepGoesOnWhereItStopped) {
  FileCacheLimits l;
  l.max_file_in_memory = 4;
  l.revalidate_ns = 1'000'000'000;
  with_limits(l);
  const size_t n = FileCache::SWEEP_CHECKS + 44;
  for (size_t i = 0; i < n; ++i) {
    write(base_ / "root" / ("f" + std::to_string(i)), "large enough");
    ASSERT_EQ(get("/f" + std::to_string(i)).status, 200);
  }
  // The most recently used: the last one a sweep from the tail reaches.
  fs::remove(base_ / "root" / ("f" + std::to_string(n - 1)));
  const uint64_t t0 = 10'000'000'000ull;
  sweep_file_caches(t0);
  EXPECT_EQ(cache_stats().swept, 0u); // SWEEP_CHECKS descriptors looked at
  sweep_file_caches(t0 + 1'000'000'000ull);
  EXPECT_EQ(cache_stats().swept, 1u);
  EXPECT_EQ(cache_stats().entries, n - 1);
  EXPECT_EQ(open_fds((base_ / "root" / ("f" + std::to_string(n - 1))).string()), 0u);
}

// Regression: a directory's index.html was opened beneath the directory,
// so one linking elsewhere in the docroot gave 403 for /dir/ while
// /dir/index.html served the same file.
TEST_F(StaticFilesTest, AnIndexLinkedWithinTheRootIsServed) {
  fs::create_directories(base_ / "root" / "shared");
  fs::create_directories(base_ / "root" / "linked");
  write(base_ / "root" / "shared" / "index.html", "shared index");
  fs::create_symlink("../shared/index.html", base_ / "root" / "linked" / "index.html");
  EXPECT_EQ(body_of(get("/linked/index.html")), "shared index");
  auto r = get("/linked/");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(body_of(r), "shared index");
  // One linking out of the root is still refused, by either path.
  fs::create_directories(base_ / "root" / "out");
  fs::create_symlink(base_ / "secret.txt", base_ / "root" / "out" / "index.html");
  EXPECT_EQ(get("/out/").status, 403);
  EXPECT_EQ(get("/out/index.html").status, 403);
  EXPECT_EQ(body_of(get("/")), "<h1>home</h1>");
  EXPECT_EQ(body_of(get("/sub/")), "sub index");
}

TEST_F(StaticFilesTest, SymlinkSwappedInIsRefusedOnRevalidation) {
  FileCacheLimits l;
  l.revalidate_ns = 0;
  with_limits(l);
  EXPECT_EQ(get("/a.txt").status, 200);
  fs::remove(base_ / "root" / "a.txt");
  fs::create_symlink(base_ / "secret.txt", base_ / "root" / "a.txt");
  auto r = get("/a.txt");
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(body_of(r).find("SECRET"), std::string::npos);
}

TEST_F(StaticFilesTest, LargeFilesAreReadOnDemandAndSurviveTruncation) {
  const std::string big = write_big();
  with_limits({});
  EXPECT_EQ(body_of(get("/big.bin")), big);
  auto r = get("/big.bin", {{"range", "bytes=300000-300009"}});
  EXPECT_EQ(body_of(r), big.substr(300000, 10));
  // Truncated while a response is in flight: no SIGBUS (nothing is
  // mapped), the response ends as aborted and the next one is fresh.
  auto inflight = get("/big.bin");
  auto c = inflight.body->chunk(0);
  ASSERT_FALSE(c.empty());
  ASSERT_EQ(truncate((base_ / "root" / "big.bin").c_str(), 1000), 0);
  std::string rest = body_of(inflight);
  EXPECT_NE(rest.find(BODY_ABORTED), std::string::npos);
  EXPECT_LT(rest.size(), big.size());
}

// Regression: a read for a short range (or a file's short tail) took a
// whole 64 KiB block, while HTTP/3's read-ahead limits count the bytes
// handed out: 100 one-byte ranges held 6.4 MiB that those limits saw as
// 100 bytes.
TEST_F(StaticFilesTest, AShortReadHoldsAboutWhatItReads) {
  const std::string big = write_big();
  with_limits({});
  const uint64_t before = file_read_bytes_held();
  std::vector<Response> held;
  for (int i = 0; i < 100; ++i) {
    held.push_back(get("/big.bin", {{"range", "bytes=1000-1000"}}));
    auto c = held.back().body->chunk(0);
    ASSERT_EQ(std::string(c.begin(), c.end()), big.substr(1000, 1));
  }
  EXPECT_LE(file_read_bytes_held() - before, 100u * 64);
  // A tail of 10,000 bytes: about that much.
  auto tail = get("/big.bin", {{"range", "bytes=-10000"}});
  const uint64_t with_ranges = file_read_bytes_held();
  ASSERT_EQ(tail.body->chunk(0).size(), 10000u);
  EXPECT_LE(file_read_bytes_held() - with_ranges, 12u * 1024);
  EXPECT_EQ(body_of(tail), big.substr(big.size() - 10000));
  held.clear();
  tail = {};
  EXPECT_EQ(file_read_bytes_held(), before);
}

// Regression: a large file written in place with its mtime put back
// (cp -p, rsync -t --inplace; a reproducible build's fixed timestamps)
// while a response read it went out whole: the old bytes, then the new.
// A file that got or lost a name meanwhile (a hard-link snapshot of the
// docroot; another file renamed over it, an atomic replace) is still sent
// whole, its old version.
TEST_F(StaticFilesTest, ALargeFileWrittenInPlaceWithItsMtimeKeptAbortsItsResponses) {
  const std::string big = write_big();
  FileCacheLimits l;
  l.revalidate_ns = 0; // each get() looks again
  with_limits(l);
  const fs::path path = base_ / "root" / "big.bin";
  // Timestamps move in ticks of up to 4 ms on kernels without fine-grained
  // ones: a change must come in a later tick than the open to be seen.
  auto next_tick = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  auto linked = get("/big.bin");
  ASSERT_FALSE(linked.body->chunk(0).empty());
  next_tick();
  fs::create_hard_link(path, base_ / "snapshot.bin");
  EXPECT_EQ(body_of(linked), big);
  auto replaced = get("/big.bin");
  ASSERT_FALSE(replaced.body->chunk(0).empty());
  next_tick();
  write(base_ / "root" / "big.tmp", std::string(big.size(), 'R'));
  fs::rename(base_ / "root" / "big.tmp", path);
  EXPECT_EQ(body_of(replaced), big);
  // A new response's file, written in place with its mtime put back.
  auto inflight = get("/big.bin");
  ASSERT_FALSE(inflight.body->chunk(0).empty());
  next_tick();
  const auto mtime = fs::last_write_time(path);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(300000);
    f << "NEW VERSION";
  }
  fs::last_write_time(path, mtime);
  std::string rest = body_of(inflight);
  EXPECT_NE(rest.find(BODY_ABORTED), std::string::npos);
  EXPECT_LT(rest.size(), big.size());
}

// Regression: a large file written in place (same size, same inode:
// cp over it, rsync --inplace, dd conv=notrunc) while a response read it
// sent the new version's bytes under the old ETag and length, spliced
// onto the old ones; with If-Range, a resumed download did the same.
TEST_F(StaticFilesTest, ALargeFileWrittenInPlaceAbortsItsResponses) {
  const std::string big = write_big();
  FileCacheLimits l;
  l.revalidate_ns = 3600'000'000'000ull; // the cache does not look again
  with_limits(l);
  const std::string etag = *header(get("/big.bin"), "etag");
  auto inflight = get("/big.bin");
  ASSERT_FALSE(inflight.body->chunk(0).empty());
  const fs::path path = base_ / "root" / "big.bin";
  const auto mtime = fs::last_write_time(path);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(300000);
    f << "NEW VERSION";
  }
  // A later mtime whatever the file system's timestamp granularity.
  fs::last_write_time(path, mtime + std::chrono::seconds(1));
  // Ended as aborted, not whole (the check comes at the latest with the
  // body's last read).
  std::string rest = body_of(inflight);
  EXPECT_NE(rest.find(BODY_ABORTED), std::string::npos);
  EXPECT_LT(rest.size(), big.size());
  // The entry was found changed: a resume with the old ETag gets the whole
  // new version, not a part of it.
  auto resumed = get("/big.bin", {{"range", "bytes=299990-300020"}, {"if-range", etag}});
  EXPECT_EQ(resumed.status, 200);
  EXPECT_NE(*header(resumed, "etag"), etag);
}

// Regression: the descriptors of large files were bounded only by the
// cache's entries; an entry evicted while responses still read it kept its
// descriptor, uncounted. A client that stalled responses for files cycled
// through the cache could make a worker hold one per response, until
// accept(), upstream connects and every other open failed with EMFILE.
// They are now held to twice the cache's entries and some more
// (extra_descriptors): past that a large file not cached gets 503.
TEST_F(StaticFilesTest, DescriptorsHeldByResponsesAreBounded) {
  FileCacheLimits l;
  l.max_entries = 4;
  l.max_file_in_memory = 4; // every file here is read on demand
  l.extra_descriptors = 64;
  with_limits(l);
  fs::create_directories(base_ / "root" / "many");
  for (int i = 0; i < 100; ++i) write(base_ / "root" / "many" / std::to_string(i), "0123456789");
  std::vector<Response> stalled;
  size_t refused = 0;
  const uint64_t counted = file_descriptors_refused(); // this thread's, so far
  for (int i = 0; i < 100; ++i) {
    stalled.push_back(get("/many/" + std::to_string(i)));
    refused += stalled.back().status == 503;
  }
  const std::string dir = (base_ / "root" / "many").string();
  EXPECT_LE(open_fds(dir), 2u * 4 + 64);
  EXPECT_GT(refused, 0u);
  EXPECT_EQ(file_descriptors_refused() - counted, refused); // the worker's counter
  stalled.clear();
  EXPECT_LE(open_fds(dir), 4u); // the cached ones
  EXPECT_EQ(body_of(get("/many/99")), "0123456789");
}

TEST_F(StaticFilesTest, CacheIsBoundedByEntriesAndBytes) {
  for (int i = 0; i < 10; ++i)
    write(base_ / "root" / ("f" + std::to_string(i)), "0123456789");
  FileCacheLimits l;
  l.max_entries = 4;
  l.max_bytes = 25; // two 10-byte files
  with_limits(l);
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 10; ++i)
      EXPECT_EQ(get("/f" + std::to_string(i)).status, 200);
  }
  EXPECT_LE(cache_stats().entries, 2u);
  EXPECT_LE(cache_stats().bytes, 25u);
  EXPECT_GE(cache_stats().evictions, 18u);
  // Files over max_file_in_memory are cached as descriptors, not bytes.
  FileCacheLimits m;
  m.max_file_in_memory = 4;
  with_limits(m);
  EXPECT_EQ(body_of(get("/f1")), "0123456789");
  EXPECT_EQ(cache_stats().bytes, 0u);
}

// Regression: responses still sending small files that had left the cache
// each kept their own copy, counted nowhere: a client stalling responses
// for files cycled through the cache (or any file, with no cache) made the
// worker hold as many copies as it had responses.
TEST_F(StaticFilesTest, EvictedContentsStillBeingSentAreBounded) {
  const std::string text(1000, 'x');
  for (int i = 0; i < 20; ++i) write(base_ / "root" / ("g" + std::to_string(i)), text);
  for (size_t entries : {size_t{2}, size_t{0}}) {
    FileCacheLimits l;
    l.max_entries = entries;
    l.max_bytes = 3000;
    with_limits(l);
    std::vector<Response> stalled;
    for (int i = 0; i < 20; ++i) stalled.push_back(get("/g" + std::to_string(i)));
    EXPECT_LE(handler_->cache().bytes_held(), 2 * l.max_bytes) << entries;
    for (auto &r : stalled) EXPECT_EQ(body_of(r), text); // past the bound: read from the file
    stalled.clear();
    EXPECT_EQ(handler_->cache().bytes_held(), cache_stats().bytes) << entries;
  }
  // The pressure gone, a file cached by its descriptor meanwhile is in
  // memory again at its next check.
  FileCacheLimits l;
  l.max_entries = 4;
  l.max_bytes = 3000;
  l.revalidate_ns = 0;
  with_limits(l);
  std::vector<Response> stalled;
  // g0..g5 in memory (g0..g2 evicted but held), g6 past the bound: by its
  // descriptor, next to g3..g5.
  for (int i = 0; i < 7; ++i) stalled.push_back(get("/g" + std::to_string(i)));
  EXPECT_EQ(cache_stats().bytes, 3000u);
  stalled.clear();
  const auto evicted = cache_stats().evictions;
  EXPECT_EQ(body_of(get("/g6")), text);
  EXPECT_EQ(cache_stats().evictions, evicted + 1); // room made for g6's bytes
  EXPECT_EQ(cache_stats().bytes, 3000u);
  EXPECT_EQ(cache_stats().changed, 0u);
}

// Regression: a FIFO in the docroot blocked a worker in open();
// dotfiles (.git/, .env) were served.
// Regression: a FIFO or device was opened before its type was known (a
// device's driver ran: opening /dev/watchdog arms it); a FIFO's writer
// waiting for a reader was let through.
TEST_F(StaticFilesTest, FifosAndDevicesAreRefusedWithoutBlocking) {
  const std::string pipe = (base_ / "root" / "pipe").string();
  ASSERT_EQ(mkfifo(pipe.c_str(), 0644), 0);
  std::atomic<bool> let_through{false};
  std::thread writer([&] {
    const int fd = ::open(pipe.c_str(), O_WRONLY | O_CLOEXEC); // waits for a reader
    let_through = true;
    if (fd >= 0) ::close(fd);
  });
  // Time for the writer to be waiting in open() (a reader that came and
  // went before would not let it through).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(get("/pipe").status, 403); // returns at once: never opened
  EXPECT_EQ(get("/pipe").status, 403);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(let_through) << "the FIFO was opened";
  const int reader = ::open(pipe.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC); // lets it go
  writer.join();
  if (reader >= 0) ::close(reader);
}

// Bytes this process read (read, pread and the like), from /proc/self/io.
static uint64_t bytes_read() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t v = 0;
  while (io >> key >> v) {
    if (key == "rchar:") return v;
  }
  return 0;
}

// Regression: each revalidation of a small cached file read all of it
// again, however unchanged.
TEST_F(StaticFilesTest, ARevalidationOfAnUnchangedFileReadsNothing) {
  write(base_ / "root" / "mid.bin", std::string(60000, 'm'));
  FileCacheLimits l;
  l.revalidate_ns = 0; // every lookup checks
  with_limits(l);
  EXPECT_EQ(body_of(get("/mid.bin")).size(), 60000u);
  const uint64_t before = bytes_read();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(get("/mid.bin").status, 200);
  EXPECT_LT(bytes_read() - before, 60000u);
  EXPECT_GE(cache_stats().revalidations, 10u);
  EXPECT_EQ(cache_stats().changed, 0u);
}

TEST_F(StaticFilesTest, DotfilesAreHiddenUnlessAllowed) {
  fs::create_directories(base_ / "root" / ".git");
  fs::create_directories(base_ / "root" / ".well-known" / "acme-challenge");
  write(base_ / "root" / ".env", "DB_PASSWORD=hunter2");
  write(base_ / "root" / ".git" / "config", "[core]");
  write(base_ / "root" / ".well-known" / "acme-challenge" / "tok", "proof");
  for (const char *p : {"/.env", "/.git/config", "/.git/", "/%2eenv", "/sub/.hidden"}) {
    auto r = get(p);
    EXPECT_EQ(r.status, 404) << p;
    EXPECT_EQ(body_of(r).find("hunter2"), std::string::npos) << p;
  }
  EXPECT_EQ(body_of(get("/.well-known/acme-challenge/tok")), "proof");
  FileCacheLimits l;
  l.allow_dotfiles = true;
  with_limits(l);
  EXPECT_EQ(body_of(get("/.env")), "DB_PASSWORD=hunter2");
}

// Regression: a directory named without its slash was served its index
// at that path, so the index's relative links pointed one level up.
TEST_F(StaticFilesTest, ADirectoryWithoutItsSlashIsRedirectedToIt) {
  fs::create_directories(base_ / "root" / "two words");
  write(base_ / "root" / "two words" / "index.html", "spaced");
  auto location = [&](const std::string &path) {
    auto r = get(path);
    EXPECT_EQ(r.status, 301) << path;
    const std::string *l = header(r, "location");
    return l ? *l : std::string("(none)");
  };
  EXPECT_EQ(location("/sub?page=2"), "/sub/?page=2");
  EXPECT_EQ(location("/two%20words"), "/two%20words/");
  // Built from the normalized path: never a redirect to another host.
  EXPECT_EQ(location("//sub"), "/sub/");
  EXPECT_EQ(location("/./sub"), "/sub/");
  EXPECT_EQ(location("/."), "/"); // the root itself
  EXPECT_EQ(body_of(get("/sub/")), "sub index");
  EXPECT_EQ(body_of(get("/two%20words/")), "spaced");
  EXPECT_EQ(body_of(get("/sub/index.html")), "sub index");
}

// Regression: a Unix socket in the document root gave 503 (opening it
// fails with ENXIO before the type check), which asks clients to retry.
TEST_F(StaticFilesTest, ASocketFileIsRefused) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string path = (base_ / "root" / "app.sock").string();
  ASSERT_LT(path.size(), sizeof(a.sun_path));
  std::memcpy(a.sun_path, path.c_str(), path.size());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
  EXPECT_EQ(get("/app.sock").status, 403);
  close(fd);
}

// Regression: RFC 9110 14.1.1 makes a suffix range satisfiable on an empty
// file; it got a 416.
TEST_F(StaticFilesTest, ASuffixRangeOfAnEmptyFileGetsTheWholeFile) {
  write(base_ / "root" / "empty.txt", "");
  auto r = get("/empty.txt", {{"range", "bytes=-5"}});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_length, 0u);
  EXPECT_EQ(get("/empty.txt", {{"range", "bytes=0-"}}).status, 416);
  EXPECT_EQ(get("/empty.txt", {{"range", "bytes=-0"}}).status, 416);
}

// Regression: a cached file due for its check was dropped when reopening
// it failed for want of descriptors, and every request for it got 503
// until descriptors were free again, though its bytes were in memory.
TEST_F(StaticFilesTest, ACachedFileIsServedWhileDescriptorsRunOut) {
  FileCacheLimits l;
  l.revalidate_ns = 0; // check every time
  with_limits(l);
  ASSERT_EQ(body_of(get("/a.txt")), "0123456789");
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> held;
  for (int fd; (fd = dup(0)) >= 0;) held.push_back(fd);
  const int err = errno;
  auto r = get("/a.txt");
  auto missing = get("/sub/"); // not cached: nothing to serve it from
  for (int fd : held) close(fd);
  setrlimit(RLIMIT_NOFILE, &old);
  ASSERT_EQ(err, EMFILE);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(body_of(r), "0123456789");
  EXPECT_EQ(missing.status, 503);
  // Descriptors back: the file is checked again, and a change is seen.
  write(base_ / "root" / "a.txt", "new");
  EXPECT_EQ(body_of(get("/a.txt")), "new");
}

// Where openat2 is refused (a seccomp filter, an old kernel) every static
// request would fail; the handler refuses to start instead, and says why.
TEST(StaticFilesCtor, ARefusedOpenat2IsReportedAtStart) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 0), // seccomp_data.nr
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat2, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof(f) / sizeof(f[0])), f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
      _exit(3);
    }
    try {
      StaticFiles s("/");
    } catch (const std::runtime_error &e) {
      _exit(std::string(e.what()).find("openat2") != std::string::npos ? 0 : 2);
    }
    _exit(1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: no error at start; 3: seccomp unavailable";
}
