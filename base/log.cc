#include "base/log.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <new>

namespace xdpq::log {

namespace {
std::atomic<int> g_level{static_cast<int>(Level::info)};
// systemd's <N> prefixes: err=3, warning=4, info=6, debug=7.
constexpr const char *PREFIX[] = {"<3>error", "<4>warn", "<6>info", "<7>debug"};
// The longest line written (journald's default LineMax is 48 KiB); a
// longer message is cut there.
constexpr size_t MAX_LINE = 48 * 1024;
} // namespace

void set_level(Level l) { g_level.store(static_cast<int>(l), std::memory_order_relaxed); }
Level level() { return static_cast<Level>(g_level.load(std::memory_order_relaxed)); }

std::optional<Level> parse_level(std::string_view t) {
  if (t == "error") return Level::error;
  if (t == "warn" || t == "warning") return Level::warn;
  if (t == "info") return Level::info;
  if (t == "debug") return Level::debug;
  return std::nullopt;
}

void write(Level l, const char *fmt, ...) {
  char buf[4096];
  int off;
  const char *prefix = PREFIX[static_cast<int>(l)];
  static const bool journal = getenv("JOURNAL_STREAM") != nullptr;
  if (!journal) prefix += 3; // plain "error"/"info" on a terminal
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  if (journal) {
    off = snprintf(buf, sizeof(buf), "%s: ", prefix);
  } else {
    off = snprintf(buf, sizeof(buf), "%02d:%02d:%02d.%03ld xdpqd %s: ", tm.tm_hour, tm.tm_min,
                   tm.tm_sec, ts.tv_nsec / 1000000, prefix);
  }
  va_list ap, again;
  va_start(ap, fmt);
  va_copy(again, ap);
  const size_t room = sizeof(buf) - static_cast<size_t>(off) - 1; // and the newline
  int n = vsnprintf(buf + off, room, fmt, ap);
  va_end(ap);
  char *line = buf;
  std::unique_ptr<char[]> big;
  size_t text = n < 0 ? 0 : static_cast<size_t>(n);
  if (text >= room) {
    // A long line (the exit statistics grow with every upstream and ring
    // counter): formatted again on the heap, whole up to MAX_LINE, so that
    // it stays one parseable line rather than a cut one.
    text = std::min(text, MAX_LINE);
    big.reset(new (std::nothrow) char[static_cast<size_t>(off) + text + 2]);
    if (big) {
      std::memcpy(big.get(), buf, static_cast<size_t>(off));
      vsnprintf(big.get() + off, text + 1, fmt, again);
      line = big.get();
    } else {
      text = room - 1;
    }
  }
  va_end(again);
  size_t len = static_cast<size_t>(off) + text;
  line[len++] = '\n';
  // One write(2) per line keeps lines from different threads whole.
  [[maybe_unused]] auto r = ::write(STDERR_FILENO, line, len);
}

} // namespace xdpq::log

namespace xdpq {

void log_guarded_exception(const char *what) noexcept {
  // At most a line a second: a memory shortage would otherwise flood the log.
  static std::atomic<int64_t> last{0};
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t now = ts.tv_sec;
  int64_t prev = last.load(std::memory_order_relaxed);
  if (now != prev && last.compare_exchange_strong(prev, now)) {
    LOG_ERROR("exception stopped at a C library boundary: %s (the connection or stream fails)",
              what);
  }
}

} // namespace xdpq
