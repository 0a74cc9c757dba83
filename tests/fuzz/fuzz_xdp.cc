// The XDP program in the kernel (BPF_PROG_TEST_RUN) on fuzzed frames: the
// verifier proves memory safety, this checks the verdicts stay in the set
// the program may return. Needs root (loading BPF).

#include "dataplane/xdp_program.h"

#include <linux/bpf.h>

#include <memory>
#include <vector>

using namespace xdpq::dataplane;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static std::unique_ptr<XdpProgram> prog = [] {
    auto p = std::make_unique<XdpProgram>();
    p->add_served(*parse_address("10.0.0.1:4433"));
    p->add_served(*parse_address("[::]:443"));
    return p;
  }();
  if (size < 14 || size > 4000)
    return 0;
  std::vector<uint8_t> frame(data, data + size);
  int verdict;
  try {
    verdict = prog->test_run(frame, 0);
  } catch (const XdpError &) {
    return 0; // the kernel refused the run itself (not the program's doing)
  }
  if (verdict != XDP_PASS && verdict != XDP_DROP && verdict != XDP_REDIRECT)
    __builtin_trap();
  return 0;
}
