// udpecho: the client of xdpqd --echo. Keeps a window of datagrams in flight
// on each of several connected UDP sockets and counts round trips, so the
// report can show the bare packet path each dataplane offers (no QUIC).
//   udpecho [-c SOCKETS] [-w WINDOW] [-s SIZE] [-D SECONDS] [--warm-up-time S] HOST PORT
// Prints one JSON object: round trips per second, bytes, loss, latency.

#include "dataplane/event_loop.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using xdpq::dataplane::monotonic_ns;

int main(int argc, char **argv) {
  int clients = 4, window = 32;
  size_t size = 64;
  double duration = 3, warmup = 0.5;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string("0"); };
    if (a == "-c") clients = std::stoi(val());
    else if (a == "-w") window = std::stoi(val());
    else if (a == "-s") size = std::stoul(val());
    else if (a == "-D") duration = std::stod(val());
    else if (a == "--warm-up-time") warmup = std::stod(val());
    else pos.push_back(a);
  }
  if (pos.size() != 2 || size < 16 || size > 1400 || clients < 1 || window < 1) {
    std::fprintf(stderr, "usage: udpecho [-c N] [-w N] [-s 16..1400] [-D S] HOST PORT\n");
    return 2;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  if (getaddrinfo(pos[0].c_str(), pos[1].c_str(), &hints, &res) != 0) {
    std::fprintf(stderr, "udpecho: bad address\n");
    return 2;
  }
  std::vector<int> fds;
  for (int i = 0; i < clients; ++i) {
    int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0) return 2;
    fds.push_back(fd);
  }
  freeaddrinfo(res);
  // Each datagram carries its send time; a reply is a round trip.
  std::vector<uint8_t> buf(size, 0x5a);
  std::vector<int> inflight(fds.size(), 0);
  std::vector<uint32_t> rtt_us;
  uint64_t start = monotonic_ns();
  uint64_t measure_from = start + static_cast<uint64_t>(warmup * 1e9);
  uint64_t end = measure_from + static_cast<uint64_t>(duration * 1e9);
  uint64_t sent = 0, received = 0, last_progress = start;
  auto send_one = [&](size_t i) {
    uint64_t t = monotonic_ns();
    std::memcpy(buf.data(), &t, sizeof(t));
    if (send(fds[i], buf.data(), buf.size(), 0) == static_cast<ssize_t>(buf.size())) {
      ++inflight[i];
      if (t >= measure_from) ++sent;
    }
  };
  for (size_t i = 0; i < fds.size(); ++i) {
    for (int k = 0; k < window; ++k) send_one(i);
  }
  std::vector<pollfd> pfd(fds.size());
  for (size_t i = 0; i < fds.size(); ++i) pfd[i] = {fds[i], POLLIN, 0};
  uint8_t rbuf[2048];
  for (;;) {
    uint64_t now = monotonic_ns();
    if (now >= end) break;
    poll(pfd.data(), pfd.size(), 50);
    now = monotonic_ns();
    for (size_t i = 0; i < fds.size(); ++i) {
      for (;;) {
        ssize_t n = recv(fds[i], rbuf, sizeof(rbuf), 0);
        if (n <= 0) break;
        uint64_t t0;
        std::memcpy(&t0, rbuf, sizeof(t0));
        // Per datagram: replies to what this loop itself just sent arrive
        // within the same wakeup, after a once-per-wakeup timestamp.
        now = monotonic_ns();
        --inflight[i];
        last_progress = now;
        if (t0 >= measure_from && now < end) {
          ++received;
          rtt_us.push_back(static_cast<uint32_t>((now - t0) / 1000));
        }
        send_one(i);
      }
      // Lost datagrams would shrink the window for good: refill after a stall.
      if (now - last_progress > 200'000'000ull) {
        while (inflight[i] < window) send_one(i);
        inflight[i] = 0;
      }
    }
    if (now - last_progress > 200'000'000ull) last_progress = now;
  }
  std::sort(rtt_us.begin(), rtt_us.end());
  auto pct = [&](double p) -> double {
    if (rtt_us.empty()) return 0;
    size_t i = static_cast<size_t>(p / 100.0 * (rtt_us.size() - 1));
    return rtt_us[i];
  };
  std::printf("{\"round_trips_per_s\":%.1f,\"bytes_per_s\":%.1f,\"sent\":%" PRIu64
              ",\"received\":%" PRIu64 ",\"p50_us\":%.0f,\"p99_us\":%.0f,\"size\":%zu,"
              "\"clients\":%d,\"window\":%d}\n",
              received / duration, received * size / duration, sent, received, pct(50), pct(99),
              size, clients, window);
  return received > 0 ? 0 : 1;
}
