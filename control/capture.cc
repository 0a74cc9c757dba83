#include "control/capture.h"

#include "base/log.h"
#include "base/private_file.h"

#include "dataplane/packet.h"

#include <fcntl.h>
#include <pcap/pcap.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace xdpq::control {

Capture::Capture() = default;

void Capture::FilterFree::operator()(bpf_program *p) const {
  pcap_freecode(p);
  std::default_delete<bpf_program>()(p);
}

Capture::~Capture() {
  std::lock_guard lock(mu_);
  close_locked();
}

std::string Capture::start(const std::string &file, const std::string &filter, uint64_t count) {
  std::lock_guard lock(mu_);
  if (dumper_) return "a capture is already running (" + file_ + "); stop it first";
  dead_ = pcap_open_dead(DLT_EN10MB, 65535);
  if (!dead_) return "pcap_open_dead failed";
  if (!filter.empty()) {
    auto prog = std::make_unique<bpf_program>();
    if (pcap_compile(dead_, prog.get(), filter.c_str(), 1, PCAP_NETMASK_UNKNOWN) != 0) {
      std::string why = std::string("bad filter '") + filter + "': " + pcap_geterr(dead_);
      pcap_close(dead_);
      dead_ = nullptr;
      return why;
    }
    filter_.reset(prog.release()); // compiled: freed with pcap_freecode from now on
  }
  std::string why;
  // libpcap's file header, either byte order, micro- or nanosecond stamps.
  static constexpr std::string_view PCAP[] = {"\xd4\xc3\xb2\xa1", "\xa1\xb2\xc3\xd4",
                                              "\x4d\x3c\xb2\xa1", "\xa1\xb2\x3c\x4d"};
  int fd = open_private_output(file, true, &why, PCAP, "a packet capture");
  FILE *fp = fd >= 0 ? fdopen(fd, "wb") : nullptr;
  if (fd >= 0 && !fp) {
    why = file + ": " + std::strerror(errno);
    close(fd);
  }
  dumper_ = fp ? pcap_dump_fopen(dead_, fp) : nullptr;
  if (!dumper_) {
    if (fp) {
      why = file + ": " + pcap_geterr(dead_);
      fclose(fp);
    }
    close_locked();
    return why;
  }
  file_ = file;
  limit_ = count;
  bytes_ = 0;
  ended_.clear();
  written_.store(0);
  active_.store(true, std::memory_order_release);
  return "";
}

void Capture::close_locked() {
  active_.store(false, std::memory_order_release);
  if (dumper_) {
    pcap_dump_flush(dumper_);
    pcap_dump_close(dumper_);
    dumper_ = nullptr;
  }
  filter_.reset();
  if (dead_) {
    pcap_close(dead_);
    dead_ = nullptr;
  }
}

uint64_t Capture::stop(std::string *ended) {
  std::lock_guard lock(mu_);
  close_locked();
  *ended = std::move(ended_);
  ended_.clear();
  return written_.load();
}

void Capture::record(const dataplane::Address &from, const dataplane::Address &to,
                     std::span<const uint8_t> payload, uint8_t ecn) {
  if (!active()) return;
  // Rebuild Ethernet/IP/UDP around the payload, as it was on the wire.
  thread_local std::vector<uint8_t> frame(dataplane::TX_HEADROOM + 65536);
  size_t n = std::min(payload.size(), frame.size() - dataplane::TX_HEADROOM);
  uint8_t *p = frame.data() + dataplane::TX_HEADROOM;
  std::memcpy(p, payload.data(), n);
  dataplane::Path path{from, to}; // headers are written from local to remote
  static const dataplane::Mac mac_from{0x02, 0x78, 0x64, 0x70, 0x71, 0x01};
  static const dataplane::Mac mac_to{0x02, 0x78, 0x64, 0x70, 0x71, 0x02};
  size_t h = dataplane::build_headers(p, n, path, ecn, mac_from, mac_to, 0);
  pcap_pkthdr hdr{};
  gettimeofday(&hdr.ts, nullptr);
  hdr.caplen = hdr.len = static_cast<bpf_u_int32>(h + n);
  const u_char *bytes = p - h;
  std::lock_guard lock(mu_);
  if (!dumper_) return;
  if (filter_ && pcap_offline_filter(filter_.get(), &hdr, bytes) == 0)
    return;
  pcap_dump(reinterpret_cast<u_char *>(dumper_), &hdr, bytes);
  // A write that failed (a full disk) would cut a record, and every one
  // after it would be unreadable: the capture ends there, and says why.
  if (std::FILE *f = pcap_dump_file(dumper_); std::ferror(f)) {
    ended_ = std::string("writing failed: ") + std::strerror(errno) + "; the last packets "
             "before it may be missing from the file";
    LOG_WARN("capture to %s stopped: %s", file_.c_str(), ended_.c_str());
    close_locked();
    return;
  }
  uint64_t w = written_.fetch_add(1) + 1;
  bytes_ += sizeof(hdr) + hdr.caplen;
  if (bytes_ >= MAX_BYTES) {
    ended_ = "the file reached its limit of " + std::to_string(MAX_BYTES >> 20) + " MiB";
    LOG_WARN("capture to %s stopped: %s", file_.c_str(), ended_.c_str());
  }
  if ((limit_ && w >= limit_) || bytes_ >= MAX_BYTES) close_locked();
}

KeyLog &KeyLog::instance() {
  static KeyLog k;
  return k;
}

std::string KeyLog::start(const std::string &file) {
  std::lock_guard lock(mu_);
  if (fd_.load() >= 0) return "key logging already runs; stop it first";
  std::string why;
  // The NSS key log format's labels. Not its comments: the QUIC secrets
  // file begins with one too.
  static constexpr std::string_view KEY_LOG[] = {"CLIENT_", "SERVER_", "EXPORTER_SECRET",
                                                 "EARLY_EXPORTER_SECRET"};
  int fd = open_private_output(file, false, &why, KEY_LOG, "a TLS key log");
  if (fd < 0)
    return why;
  struct stat st {};
  bytes_ = fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0; // appended to
  if (bytes_ >= Capture::MAX_BYTES) {
    close(fd);
    return file + " already holds " + std::to_string(bytes_ >> 20) + " MiB, the key log's limit " +
           "is " + std::to_string(Capture::MAX_BYTES >> 20) + " MiB";
  }
  started_ = true;
  file_ = file;
  ended_.clear();
  fd_.store(fd);
  return "";
}

bool KeyLog::stop(std::string *ended) {
  std::lock_guard lock(mu_);
  int fd = fd_.exchange(-1);
  if (fd >= 0) close(fd);
  const bool was = started_;
  started_ = false;
  if (ended) *ended = ended_;
  ended_.clear();
  return was;
}

void KeyLog::write_line(const std::string &line) {
  std::lock_guard lock(mu_);
  int fd = fd_.load();
  if (fd < 0) return;
  std::string l = line + "\n";
  const ssize_t r = ::write(fd, l.data(), l.size());
  if (r == static_cast<ssize_t>(l.size())) {
    bytes_ += l.size();
    if (bytes_ < Capture::MAX_BYTES) return;
    ended_ = "the file reached its limit of " + std::to_string(Capture::MAX_BYTES >> 20) + " MiB";
  } else {
    ended_ = std::string("writing failed: ") +
             (r < 0 ? std::strerror(errno) : "short write (the disk is full?)");
  }
  LOG_WARN("key log to %s stopped: %s", file_.c_str(), ended_.c_str());
  fd_.store(-1);
  close(fd);
}

} // namespace xdpq::control
