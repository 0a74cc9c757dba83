#pragma once
// The access log: one line per request, in the "combined" format that log
// tools read, with the request time in seconds added:
//
//   203.0.113.7 - - [27/Nov/2026:10:22:05 +0000] "GET /a.txt HTTP/3" 200 10 "-" "curl/8.14.1" 0.000183
//
// Status 0: the stream or connection ended before a response was sent.
// Bytes: response body bytes handed to the transport. What a client sent
// (target, Referer, User-Agent) is escaped: a quote, a backslash, control
// and non-ASCII bytes become \xHH, so a line is always one line and a field
// never leaves its quotes; each field is cut at MAX_FIELD bytes.
//
// Each worker appends lines to its own buffer and writes it out when it is
// full, on the worker's heartbeat and when the worker ends: no lock and no
// system call per request. The workers write the file themselves, as
// nginx's do: a disk that stalls stalls the writing worker, never the
// others (no lock is held across a write). The file is opened O_APPEND, so
// their writes never interleave inside a line; reopen() (SIGHUP, after
// logrotate moved the file) switches every worker to a new file at the same
// path, and the old one closes when its last write is done.

#include "dataplane/address.h"
#include "http/message.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace xdpq::http {

class AccessLog {
public:
  // Opens (creates, 0640) path for appending. Throws std::runtime_error.
  explicit AccessLog(std::string path);
  ~AccessLog();
  AccessLog(const AccessLog &) = delete;
  AccessLog &operator=(const AccessLog &) = delete;

  // Opens the path again; the old file is closed once nothing writes to it.
  // Throws std::runtime_error, leaving the old file in use.
  void reopen();
  // Appends whole lines (from a worker's buffer). False when some were
  // lost (a full disk, an I/O error).
  bool write(std::string_view lines);
  const std::string &path() const { return path_; }

private:
  struct File {
    explicit File(int f) : fd(f) {}
    ~File();
    int fd;
    // A line was cut short (a full disk) and could not be ended then: the
    // next write ends it first, so two requests never share a line.
    std::atomic<bool> cut{false};
  };
  std::shared_ptr<File> file() const;
  std::string path_;
  mutable std::mutex mu_; // guards file_ itself, never a write
  std::shared_ptr<File> file_;
};

// One worker's lines on their way to the log.
class AccessLogBuffer {
public:
  static constexpr size_t MAX_FIELD = 2048;
  static constexpr size_t FLUSH_AT = 32 * 1024;

  explicit AccessLogBuffer(std::shared_ptr<AccessLog> log) : log_(std::move(log)) {}
  ~AccessLogBuffer() { flush(); }
  AccessLogBuffer(const AccessLogBuffer &) = delete;
  AccessLogBuffer &operator=(const AccessLogBuffer &) = delete;

  // One request. peer may be null (unknown); proto: "HTTP/3", "HTTP/2",
  // "HTTP/1.1".
  void record(const dataplane::Address *peer, const Request &req, std::string_view proto,
              int status, uint64_t bytes, uint64_t duration_ns);
  void flush();
  // Lines not written out yet (tests).
  std::string_view pending() const { return buf_; }
  // This worker's writes that lost lines (counter access_log_lost_writes).
  uint64_t lost_writes() const { return lost_writes_; }

private:
  void append_escaped(std::string_view s);
  std::shared_ptr<AccessLog> log_;
  std::string buf_;
  int64_t stamped_second_ = -1;
  bool failing_ = false; // the last write lost lines (logged once per episode)
  uint64_t lost_writes_ = 0;
  char stamp_[32] = {};
};

} // namespace xdpq::http
