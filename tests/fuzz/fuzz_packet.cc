// The AF_XDP path's frame parser, and the header builder round trip on
// whatever it accepts.

#include "dataplane/packet.h"

#include <cstring>
#include <vector>

using namespace xdpq::dataplane;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ParsedFrame pf;
  if (parse_frame(data, size, pf) != ParseStatus::ok)
    return 0;
  if (pf.payload_offset + pf.payload_len > size)
    __builtin_trap();
  // Build headers for a reply of the same payload and parse it back.
  std::vector<uint8_t> buf(TX_HEADROOM + pf.payload_len);
  std::memcpy(buf.data() + TX_HEADROOM, data + pf.payload_offset, pf.payload_len);
  Path back{pf.path.local, pf.path.remote};
  size_t h = build_headers(buf.data() + TX_HEADROOM, pf.payload_len, back, pf.ecn, pf.dst_mac,
                           pf.src_mac, pf.vlan_tci);
  ParsedFrame again;
  auto st = parse_frame(buf.data() + TX_HEADROOM - h, h + pf.payload_len, again);
  // (A destination the parser accepts may not be a valid source, e.g.
  // loopback: then the reply is refused by name, which is fine.)
  if (st == ParseStatus::bad_address)
    return 0;
  if (st != ParseStatus::ok || again.payload_len != pf.payload_len ||
      !(again.path.local == pf.path.remote) || !(again.path.remote == pf.path.local)) {
    __builtin_trap();
  }
  return 0;
}
