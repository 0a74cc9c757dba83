#pragma once
// Packet capture of what the user-space path receives and sends, as pcap
// (libpcap), filtered by a pcap expression. tcpdump cannot see AF_XDP
// traffic; this is how operators see it. Workers call record() on every
// datagram; it costs one relaxed atomic load while no capture runs.

#include "dataplane/datagram_port.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

struct pcap;
struct pcap_dumper;
struct bpf_program;

namespace xdpq::control {

class Capture {
public:
  Capture();
  ~Capture();
  // Starts writing to file; "" on success, else the reason (bad filter,
  // file not writable, already running). count 0: no limit of packets;
  // the file's size is limited all the same (MAX_BYTES).
  std::string start(const std::string &file, const std::string &filter, uint64_t count);
  // A capture stops by itself once the file holds this much, so that one
  // left running cannot fill the disk the logs share.
  static constexpr uint64_t MAX_BYTES = 1ull << 30;
  // Stops; returns packets written and, if the capture had stopped by
  // itself (a write error, the size limit), why in *ended ("" otherwise).
  uint64_t stop(std::string *ended);
  bool active() const { return active_.load(std::memory_order_relaxed); }
  // A datagram seen by a worker; from = sender, to = receiver.
  void record(const dataplane::Address &from, const dataplane::Address &to,
              std::span<const uint8_t> payload, uint8_t ecn);
  uint64_t written() const { return written_.load(std::memory_order_relaxed); }

private:
  void close_locked();
  std::atomic<bool> active_{false};
  std::atomic<uint64_t> written_{0};
  std::mutex mu_;
  pcap *dead_ = nullptr;
  pcap_dumper *dumper_ = nullptr;
  struct FilterFree {
    void operator()(bpf_program *p) const; // pcap_freecode, then delete
  };
  std::unique_ptr<bpf_program, FilterFree> filter_;
  uint64_t limit_ = 0;
  uint64_t bytes_ = 0;
  std::string file_;
  std::string ended_; // why it stopped by itself
};

// TLS secrets in NSS key log format (for Wireshark), from QUIC's GnuTLS
// sessions and the TCP side's OpenSSL sessions.
// Like a capture, it stops by itself when a write fails (a full disk) or
// the file reaches Capture::MAX_BYTES: a key log left running under a
// flood of handshakes cannot fill the disk the logs share.
class KeyLog {
public:
  std::string start(const std::string &file);
  // Whether it was running; ended: why it had stopped by itself, if it had.
  bool stop(std::string *ended = nullptr);
  bool active() const { return fd_.load(std::memory_order_relaxed) >= 0; }
  void write_line(const std::string &line);
  static KeyLog &instance();

private:
  std::atomic<int> fd_{-1};
  std::mutex mu_;
  uint64_t bytes_ = 0;
  bool started_ = false; // since start(), whether or not it stopped by itself
  std::string file_;
  std::string ended_;
};

} // namespace xdpq::control
