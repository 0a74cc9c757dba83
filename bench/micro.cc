// Micro-benchmarks (Google Benchmark): the per-packet and per-request
// building blocks. They report; they assert nothing.
//   build/release/bench_micro [--benchmark_filter=...]

#include "dataplane/packet.h"
#include "dataplane/timer_wheel.h"
#include "http/message.h"
#include "http/router.h"
#ifdef XDPQ_HAVE_AFXDP
#include "dataplane/xdp_program.h"
#endif

#include <benchmark/benchmark.h>
#include <nghttp3/nghttp3.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

using namespace xdpq;

namespace {

dataplane::Path test_path() {
  dataplane::Path p;
  p.local = *dataplane::parse_address("10.0.0.1:443");
  p.remote = *dataplane::parse_address("10.0.0.2:50000");
  return p;
}

std::vector<uint8_t> sample_frame(size_t payload) {
  std::vector<uint8_t> buf(dataplane::TX_HEADROOM + payload, 0x5a);
  dataplane::Mac a{2, 0, 0, 0, 0, 1}, b{2, 0, 0, 0, 0, 2};
  auto path = test_path();
  std::swap(path.local, path.remote); // as the client sent it
  size_t h = dataplane::build_headers(buf.data() + dataplane::TX_HEADROOM, payload, path, 2, a,
                                      b, 0);
  return std::vector<uint8_t>(buf.begin() + static_cast<long>(dataplane::TX_HEADROOM - h),
                              buf.end());
}

void BM_ParseFrame(benchmark::State &state) {
  auto f = sample_frame(static_cast<size_t>(state.range(0)));
  dataplane::ParsedFrame pf;
  for (auto _ : state) {
    auto st = dataplane::parse_frame(f.data(), f.size(), pf);
    benchmark::DoNotOptimize(st);
    benchmark::DoNotOptimize(pf.payload_len);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ParseFrame)->Arg(60)->Arg(1200)->Arg(1452);

void BM_BuildHeadersWithChecksums(benchmark::State &state) {
  size_t n = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> buf(dataplane::TX_HEADROOM + n, 0x33);
  dataplane::Mac a{2, 0, 0, 0, 0, 1}, b{2, 0, 0, 0, 0, 2};
  auto path = test_path();
  for (auto _ : state) {
    auto h = dataplane::build_headers(buf.data() + dataplane::TX_HEADROOM, n, path, 2, a, b, 0);
    benchmark::DoNotOptimize(h);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n));
}
BENCHMARK(BM_BuildHeadersWithChecksums)->Arg(60)->Arg(1200)->Arg(1452);

void BM_TimerWheelScheduleRun(benchmark::State &state) {
  const size_t n = static_cast<size_t>(state.range(0));
  uint64_t now = 1'000'000'000;
  dataplane::TimerWheel wheel(now);
  std::vector<dataplane::Timer> timers(n);
  for (auto &t : timers) t.set_callback([](dataplane::Timer &) {}, nullptr);
  for (auto _ : state) {
    // Re-arm every timer (as connections do after each write), then advance.
    for (size_t i = 0; i < n; ++i) wheel.schedule(timers[i], now + 1'000'000 + i * 1000);
    now += 500'000;
    wheel.run(now);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
}
BENCHMARK(BM_TimerWheelScheduleRun)->Arg(100)->Arg(10000);

void BM_RouteBytes(benchmark::State &state) {
  auto router = http::make_default_router(http::RouterConfig{});
  http::Request req;
  req.method = "GET";
  req.path = "/bytes/3";
  http::Response resp;
  for (auto _ : state) {
    router->route(req, resp);
    benchmark::DoNotOptimize(resp.status);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RouteBytes);

void BM_QpackEncodeTypicalResponse(benchmark::State &state) {
  nghttp3_qpack_encoder *enc;
  nghttp3_qpack_encoder_new(&enc, 4096, nghttp3_mem_default());
  auto nv = [](const char *n, const char *v) {
    return nghttp3_nv{reinterpret_cast<uint8_t *>(const_cast<char *>(n)),
                      reinterpret_cast<uint8_t *>(const_cast<char *>(v)), strlen(n), strlen(v),
                      NGHTTP3_NV_FLAG_NONE};
  };
  nghttp3_nv nva[] = {nv(":status", "200"), nv("server", "xdpq"), nv("content-length", "16384"),
                      nv("content-type", "application/octet-stream"),
                      nv("etag", "\"1a2b3c-4000-17f3a\""), nv("accept-ranges", "bytes")};
  int64_t stream = 0;
  for (auto _ : state) {
    nghttp3_buf pbuf, rbuf, ebuf;
    nghttp3_buf_init(&pbuf);
    nghttp3_buf_init(&rbuf);
    nghttp3_buf_init(&ebuf);
    nghttp3_qpack_encoder_encode(enc, &pbuf, &rbuf, &ebuf, stream, nva, 6);
    benchmark::DoNotOptimize(rbuf.last);
    nghttp3_buf_free(&pbuf, nghttp3_mem_default());
    nghttp3_buf_free(&rbuf, nghttp3_mem_default());
    nghttp3_buf_free(&ebuf, nghttp3_mem_default());
    stream += 4;
  }
  nghttp3_qpack_encoder_del(enc);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_QpackEncodeTypicalResponse);

#ifdef XDPQ_HAVE_AFXDP
// The XDP program serving 10.0.0.1:443, or nullptr (error set) without root.
std::unique_ptr<dataplane::XdpProgram> load_xdp(benchmark::State &state) {
  if (geteuid() != 0) {
    state.SkipWithError("needs root to load the XDP program");
    return nullptr;
  }
  auto prog = std::make_unique<dataplane::XdpProgram>();
  prog->add_served(*dataplane::parse_address("10.0.0.1:443"));
  return prog;
}

// The XDP program itself, through BPF_PROG_TEST_RUN.
void BM_XdpProgram(benchmark::State &state) {
  auto prog = load_xdp(state);
  if (!prog) return;
  auto f = sample_frame(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    benchmark::DoNotOptimize(prog->test_run(f));
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel("includes the syscall; kernel-side ns/packet is lower");
}
BENCHMARK(BM_XdpProgram)->Arg(60)->Arg(1200);

// Kernel-side cost per packet: the kernel repeats the run and times it.
void BM_XdpProgramKernelNs(benchmark::State &state) {
  auto prog = load_xdp(state);
  if (!prog) return;
  auto f = sample_frame(static_cast<size_t>(state.range(0)));
  uint64_t total = 0, n = 0;
  for (auto _ : state) {
    total += prog->test_run_ns(f, 10000);
    ++n;
  }
  state.counters["kernel_ns_per_packet"] = n ? static_cast<double>(total) / n : 0;
}
BENCHMARK(BM_XdpProgramKernelNs)->Arg(60)->Arg(1200)->Iterations(20);
#endif

} // namespace

BENCHMARK_MAIN();
