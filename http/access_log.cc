#include "http/access_log.h"

#include "base/log.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <stdexcept>

namespace xdpq::http {

namespace {

// A regular file, as --check-config demands: opened without blocking (a
// FIFO without a reader would hold the start, or the control thread on a
// reload, for good) and refused when it is anything else.
int open_log(const std::string &path) {
  int fd = ::open(path.c_str(),
                  O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0640);
  if (fd < 0)
    throw std::runtime_error(path + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error(path + ": not a regular file");
  }
  return fd;
}

} // namespace

AccessLog::AccessLog(std::string path)
    : path_(std::move(path)), file_(std::make_shared<File>(open_log(path_))) {}

AccessLog::~AccessLog() = default;

AccessLog::File::~File() { ::close(fd); }

std::shared_ptr<AccessLog::File> AccessLog::file() const {
  std::lock_guard lock(mu_);
  return file_;
}

void AccessLog::reopen() {
  auto fresh = std::make_shared<File>(open_log(path_));
  std::lock_guard lock(mu_);
  file_.swap(fresh); // the old file closes once no write holds it
}

bool AccessLog::write(std::string_view lines) {
  const auto f = file();
  if (f->cut.exchange(false) && ::write(f->fd, "\n", 1) != 1) {
    f->cut = true; // still no room: these lines are lost too
    return false;
  }
  bool partial = false;
  while (!lines.empty()) {
    ssize_t n = ::write(f->fd, lines.data(), lines.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // A full disk or an I/O error loses these lines, never the worker's
      // time. A line cut short is ended, so the next one starts afresh:
      // now, or (the disk being full) by the next write.
      const int err = errno;
      if (partial && lines.data()[-1] != '\n' && ::write(f->fd, "\n", 1) != 1) f->cut = true;
      errno = err;
      return false;
    }
    lines.remove_prefix(static_cast<size_t>(n));
    partial = true;
  }
  return true;
}

void AccessLogBuffer::append_escaped(std::string_view s) {
  if (s.empty()) {
    buf_ += '-';
    return;
  }
  static constexpr char HEX[] = "0123456789abcdef";
  const size_t n = s.size() < MAX_FIELD ? s.size() : MAX_FIELD;
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
      const char esc[4] = {'\\', 'x', HEX[c >> 4], HEX[c & 15]};
      buf_.append(esc, 4);
    } else {
      buf_ += static_cast<char>(c);
    }
  }
  if (n < s.size())
    buf_ += "...";
}

void AccessLogBuffer::record(const dataplane::Address *peer, const Request &req,
                             std::string_view proto, int status, uint64_t bytes,
                             uint64_t duration_ns) {
  char ip[INET6_ADDRSTRLEN] = "-";
  if (peer && peer->family() == AF_INET) {
    inet_ntop(AF_INET, &peer->u.in.sin_addr, ip, sizeof(ip));
  } else if (peer && peer->family() == AF_INET6) {
    const in6_addr &a = peer->u.in6.sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
      // An IPv4 client of a [::] listener: logged as the IPv4 address it is.
      inet_ntop(AF_INET, &a.s6_addr[12], ip, sizeof(ip));
    } else {
      inet_ntop(AF_INET6, &a, ip, sizeof(ip));
    }
  }
  timespec now{};
  clock_gettime(CLOCK_REALTIME_COARSE, &now);
  if (now.tv_sec != stamped_second_) {
    stamped_second_ = now.tv_sec;
    tm t{};
    gmtime_r(&now.tv_sec, &t);
    strftime(stamp_, sizeof(stamp_), "[%d/%b/%Y:%H:%M:%S +0000]", &t);
  }
  buf_ += ip;
  buf_ += " - - ";
  buf_ += stamp_;
  buf_ += " \"";
  append_escaped(req.method);
  buf_ += ' ';
  append_escaped(req.path);
  buf_ += ' ';
  buf_ += proto;
  buf_ += "\" ";
  char num[24];
  buf_.append(num, static_cast<size_t>(std::to_chars(num, num + sizeof(num), status).ptr - num));
  buf_ += ' ';
  buf_.append(num, static_cast<size_t>(std::to_chars(num, num + sizeof(num), bytes).ptr - num));
  buf_ += " \"";
  const std::string *referer = req.find("referer");
  append_escaped(referer ? std::string_view(*referer) : std::string_view());
  buf_ += "\" \"";
  const std::string *agent = req.find("user-agent");
  append_escaped(agent ? std::string_view(*agent) : std::string_view());
  buf_ += "\" ";
  // Seconds with microseconds, as a fixed-point number.
  const uint64_t us = duration_ns / 1000;
  buf_.append(num,
              static_cast<size_t>(std::to_chars(num, num + sizeof(num), us / 1000000).ptr - num));
  char frac[8];
  std::snprintf(frac, sizeof(frac), ".%06u", static_cast<unsigned>(us % 1000000));
  buf_ += frac;
  buf_ += '\n';
  if (buf_.size() >= FLUSH_AT)
    flush();
}

void AccessLogBuffer::flush() {
  if (buf_.empty()) return;
  const bool ok = log_->write(buf_);
  if (!ok && !failing_) {
    LOG_WARN("access log %s: %s; lines are lost until writing works again",
             log_->path().c_str(), std::strerror(errno));
  } else if (ok && failing_) {
    LOG_INFO("access log %s: writing again", log_->path().c_str());
  }
  failing_ = !ok;
  lost_writes_ += ok ? 0 : 1;
  buf_.clear();
}

} // namespace xdpq::http
