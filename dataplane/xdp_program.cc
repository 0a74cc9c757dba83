#include "dataplane/xdp_program.h"

#include "bpf/xdpq_shared.h"
#include "base/log.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/ethtool.h>
#include <linux/if_link.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstring>

extern "C" const unsigned char xdpq_bpf_object_start[];
extern "C" const unsigned char xdpq_bpf_object_end[];

namespace xdpq::dataplane {

static_assert(sizeof(xdpq_v4_key) == 8, "xdpq_v4_key layout");
static_assert(sizeof(xdpq_v6_key) == 20, "xdpq_v6_key layout");

const char *const XDP_COUNTER_NAMES[] = {
    "xdp_redirected",       "xdp_pass_not_ip",         "xdp_pass_not_udp",
    "xdp_pass_not_served",  "xdp_pass_truncated",      "xdp_pass_no_socket",
    "xdp_drop_short_payload", "xdp_drop_small_initial", "xdp_drop_reflection",
    "xdp_drop_fragment",    "xdp_drop_bad_ip_len",     "xdp_drop_bad_udp_len",
    "xdp_pass_not_local",   "xdp_drop_local_source",   "xdp_drop_ext_header",
};
static_assert(sizeof(XDP_COUNTER_NAMES) / sizeof(XDP_COUNTER_NAMES[0]) == XDPQ_CNT__MAX,
              "a counter name per enum xdpq_counter");

size_t xdp_counter_count() { return XDPQ_CNT__MAX; }

namespace {

std::string errstr(int err) { return std::strerror(err < 0 ? -err : err); }

int libbpf_log(enum libbpf_print_level level, const char *fmt, va_list ap) {
  if (level == LIBBPF_DEBUG && !log::enabled(log::Level::debug)) return 0;
  char buf[1024];
  vsnprintf(buf, sizeof(buf), fmt, ap);
  size_t len = strlen(buf);
  if (len > 0 && buf[len - 1] == '\n') buf[len - 1] = '\0';
  if (level == LIBBPF_WARN) {
    LOG_WARN("libbpf: %s", buf);
  } else {
    LOG_DEBUG("libbpf: %s", buf);
  }
  return 0;
}

std::string prog_name(uint32_t id) {
  int fd = bpf_prog_get_fd_by_id(id);
  if (fd < 0) return "?";
  bpf_prog_info info{};
  uint32_t len = sizeof(info);
  std::string name = "?";
  if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0) name = info.name;
  close(fd);
  return name;
}

} // namespace

XdpAttachment query_xdp(int ifindex) {
  XdpAttachment a;
  bpf_xdp_query_opts opts{};
  opts.sz = sizeof(opts);
  if (bpf_xdp_query(ifindex, 0, &opts) != 0) return a;
  switch (opts.attach_mode) {
  case XDP_ATTACHED_DRV: a.prog_id = opts.drv_prog_id; a.mode = "native"; break;
  case XDP_ATTACHED_SKB: a.prog_id = opts.skb_prog_id; a.mode = "generic"; break;
  case XDP_ATTACHED_HW: a.prog_id = opts.hw_prog_id; a.mode = "offload"; break;
  case XDP_ATTACHED_MULTI: a.prog_id = opts.drv_prog_id ? opts.drv_prog_id : opts.skb_prog_id;
    a.mode = "multi"; break;
  default: return a;
  }
  if (a.prog_id) a.prog_name = prog_name(a.prog_id);
  return a;
}

XdpProgram::XdpProgram() {
  libbpf_set_print(libbpf_log);
  size_t size = static_cast<size_t>(xdpq_bpf_object_end - xdpq_bpf_object_start);
  LIBBPF_OPTS(bpf_object_open_opts, opts, .object_name = "xdpq");
  obj_ = bpf_object__open_mem(xdpq_bpf_object_start, size, &opts);
  if (!obj_) throw XdpError("XDP program: cannot open embedded object: " + errstr(errno));
  int err = bpf_object__load(obj_);
  if (err) {
    bpf_object__close(obj_);
    obj_ = nullptr;
    throw XdpError("XDP program: load failed (need root or CAP_BPF+CAP_PERFMON+CAP_NET_ADMIN): " +
                   errstr(err));
  }
  auto *prog = bpf_object__find_program_by_name(obj_, "xdpq_steer");
  prog_fd_ = prog ? bpf_program__fd(prog) : -1;
  if (prog_fd_ < 0) throw XdpError("XDP program: xdpq_steer missing from the object");
}

XdpProgram::~XdpProgram() {
  detach();
  if (obj_) bpf_object__close(obj_);
}

uint32_t XdpProgram::prog_id() const {
  bpf_prog_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(prog_fd_, &info, &len) != 0) return 0;
  return info.id;
}

void XdpProgram::attach(const std::string &ifname, XdpMode mode, bool replace) {
  ifindex_ = static_cast<int>(if_nametoindex(ifname.c_str()));
  if (ifindex_ == 0) throw XdpError("interface " + ifname + ": " + errstr(errno));
  auto existing = query_xdp(ifindex_);
  if (existing.prog_id != 0) {
    if (!replace) {
      throw XdpError("interface " + ifname + " already has XDP program '" + existing.prog_name +
                     "' (id " + std::to_string(existing.prog_id) + ", " + existing.mode +
                     " mode); xdpq will not detach a program it did not attach. Remove it "
                     "(ip link set dev " + ifname + " xdp off) or pass --xdp-replace");
    }
    const uint32_t flags = existing.mode == "generic"   ? XDP_FLAGS_SKB_MODE
                           : existing.mode == "offload" ? XDP_FLAGS_HW_MODE
                                                        : XDP_FLAGS_DRV_MODE;
    // Held, so that it can be put back if ours cannot take its place, or
    // the start fails later: an interface left with no program at all would
    // break whatever the replaced one did. Taking it needs CAP_SYS_ADMIN
    // (root has it; the packaged unit does not give it).
    previous_fd_ = bpf_prog_get_fd_by_id(existing.prog_id);
    previous_flags_ = flags;
    if (previous_fd_ < 0) {
      LOG_WARN("XDP program '%s' (id %u) on %s is replaced for good: it cannot be put back if "
               "this start fails (%s; that takes CAP_SYS_ADMIN)",
               existing.prog_name.c_str(), existing.prog_id, ifname.c_str(),
               errstr(-errno).c_str());
    }
    int err = bpf_xdp_detach(ifindex_, flags, nullptr);
    if (err) {
      drop_previous();
      throw XdpError("interface " + ifname + ": cannot replace XDP program '" +
                     existing.prog_name + "': " + errstr(err) +
                     " (a program attached through a bpf_link can only be removed by its owner)");
    }
    LOG_WARN("replaced XDP program '%s' (id %u) on %s as asked", existing.prog_name.c_str(),
             existing.prog_id, ifname.c_str());
  }
  try {
    attach_ours(ifname, mode);
  } catch (const XdpError &e) {
    if (previous_fd_ < 0) throw;
    const bool back = put_back_previous();
    throw XdpError(std::string(e.what()) + (back ? "; the replaced program is attached again"
                                                 : "; the replaced program could not be put "
                                                   "back either"));
  }
  // The replaced program is dropped once the start has succeeded
  // (keep_replacement()); until then, detach() puts it back.
}

void XdpProgram::keep_replacement() { drop_previous(); }

bool XdpProgram::put_back_previous() {
  const int err = bpf_xdp_attach(ifindex_, previous_fd_, previous_flags_, nullptr);
  if (err) {
    LOG_ERROR("the replaced XDP program could not be put back: %s", errstr(err).c_str());
  } else {
    LOG_INFO("the replaced XDP program is attached again");
  }
  drop_previous();
  return err == 0;
}

void XdpProgram::drop_previous() {
  if (previous_fd_ >= 0) ::close(previous_fd_);
  previous_fd_ = -1;
}

void XdpProgram::attach_ours(const std::string &ifname, XdpMode mode) {
  auto try_attach = [&](uint32_t flags) {
    LIBBPF_OPTS(bpf_link_create_opts, lopts, .flags = flags);
    int fd = bpf_link_create(prog_fd_, ifindex_, BPF_XDP, &lopts);
    return fd < 0 ? -errno : fd;
  };
  int fd = -1;
  if (mode == XdpMode::native || mode == XdpMode::automatic) {
    fd = try_attach(XDP_FLAGS_DRV_MODE);
    if (fd >= 0) {
      mode_ = "native";
    } else if (mode == XdpMode::native) {
      throw XdpError("interface " + ifname + ": native XDP attach failed: " + errstr(fd) +
                     " (try --xdp-mode generic)");
    } else {
      fallback_reason_ = "native attach failed: " + errstr(fd);
    }
  }
  if (fd < 0) {
    fd = try_attach(XDP_FLAGS_SKB_MODE);
    if (fd < 0) {
      throw XdpError("interface " + ifname + ": generic XDP attach failed: " + errstr(fd));
    }
    mode_ = "generic";
  }
  link_fd_ = fd;
}

void XdpProgram::adopt_link(int link_fd, const std::string &ifname) {
  detach();
  link_fd_ = link_fd;
  ifindex_ = static_cast<int>(if_nametoindex(ifname.c_str()));
  if (ifindex_ == 0) throw XdpError("interface " + ifname + ": " + errstr(errno));
  bpf_link_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(link_fd_, &info, &len) != 0 || info.type != BPF_LINK_TYPE_XDP) {
    throw XdpError("binary upgrade: the descriptor handed over is not an XDP link");
  }
  if (static_cast<int>(info.xdp.ifindex) != ifindex_) {
    throw XdpError("binary upgrade: the XDP link handed over is not on " + ifname);
  }
  mode_ = query_xdp(ifindex_).mode;
}

void XdpProgram::update_link() {
  if (link_fd_ < 0) throw XdpError("XDP program: no link to update");
  if (bpf_link_update(link_fd_, prog_fd_, nullptr) != 0) {
    throw XdpError("cannot put the XDP program on its link: " + errstr(errno));
  }
}

void XdpProgram::detach() {
  if (link_fd_ >= 0) {
    close(link_fd_); // the link's last reference: the kernel detaches
    link_fd_ = -1;
  }
  // A start that failed after replacing another program: it goes back.
  if (previous_fd_ >= 0) put_back_previous();
}

int XdpProgram::map_fd(const char *name) const {
  int fd = bpf_object__find_map_fd_by_name(obj_, name);
  if (fd < 0) throw XdpError(std::string("XDP program: map ") + name + " missing");
  return fd;
}

void XdpProgram::add_served(const Address &a) {
  uint8_t one = 1;
  int err;
  if (a.family() == AF_INET) {
    xdpq_v4_key k{};
    k.addr = a.u.in.sin_addr.s_addr;
    k.port = a.u.in.sin_port;
    err = bpf_map_update_elem(map_fd("served_v4"), &k, &one, BPF_ANY);
  } else {
    xdpq_v6_key k{};
    std::memcpy(k.addr, &a.u.in6.sin6_addr, 16);
    k.port = a.u.in6.sin6_port;
    err = bpf_map_update_elem(map_fd("served_v6"), &k, &one, BPF_ANY);
  }
  if (err) throw XdpError("XDP program: cannot serve " + a.to_string() + ": " + errstr(err));
}

void XdpProgram::set_local(const Address &a, bool local) {
  uint8_t one = 1;
  const bool v4 = a.family() == AF_INET;
  const void *key = v4 ? static_cast<const void *>(&a.u.in.sin_addr.s_addr)
                       : static_cast<const void *>(&a.u.in6.sin6_addr);
  int m = map_fd(v4 ? "local_v4" : "local_v6");
  int err = local ? bpf_map_update_elem(m, key, &one, BPF_ANY) : bpf_map_delete_elem(m, key);
  if (err && local) {
    // Full (XDPQ_MAX_LOCAL): the address stays the kernel's.
    throw XdpError("XDP program: cannot add local address " + a.to_string() + ": " +
                   errstr(err));
  }
}

void XdpProgram::set_socket(uint32_t queue, int xsk_fd) {
  int m = map_fd("xsks");
  int err = xsk_fd >= 0 ? bpf_map_update_elem(m, &queue, &xsk_fd, BPF_ANY)
                        : bpf_map_delete_elem(m, &queue);
  if (err && xsk_fd >= 0) {
    throw XdpError("XDP program: cannot register AF_XDP socket for queue " +
                   std::to_string(queue) + ": " + errstr(err));
  }
}

std::vector<uint64_t> XdpProgram::counters() const {
  int ncpu = libbpf_num_possible_cpus();
  std::vector<uint64_t> total(XDPQ_CNT__MAX, 0);
  if (ncpu <= 0) return total;
  std::vector<uint64_t> per(static_cast<size_t>(ncpu));
  int m = map_fd("counters");
  for (uint32_t i = 0; i < XDPQ_CNT__MAX; ++i) {
    if (bpf_map_lookup_elem(m, &i, per.data()) != 0) continue;
    for (uint64_t v : per) total[i] += v;
  }
  return total;
}

int XdpProgram::test_run(const std::vector<uint8_t> &frame, uint32_t rx_queue) const {
  std::vector<uint8_t> out(frame.size() + 256);
  xdp_md ctx{};
  ctx.data_end = static_cast<uint32_t>(frame.size());
  ctx.rx_queue_index = rx_queue;
  LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = frame.data(), .data_out = out.data(),
              .data_size_in = static_cast<uint32_t>(frame.size()),
              .data_size_out = static_cast<uint32_t>(out.size()), .ctx_in = &ctx,
              .ctx_size_in = sizeof(ctx), .repeat = 1);
  int err = bpf_prog_test_run_opts(prog_fd_, &opts);
  if (err) throw XdpError("BPF_PROG_TEST_RUN: " + errstr(err));
  return static_cast<int>(opts.retval);
}

} // namespace xdpq::dataplane

namespace xdpq::dataplane {

uint32_t XdpProgram::test_run_ns(const std::vector<uint8_t> &frame, int repeat) const {
  xdp_md ctx{};
  ctx.data_end = static_cast<uint32_t>(frame.size());
  LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = frame.data(),
              .data_size_in = static_cast<uint32_t>(frame.size()), .ctx_in = &ctx,
              .ctx_size_in = sizeof(ctx), .repeat = repeat);
  int err = bpf_prog_test_run_opts(prog_fd_, &opts);
  if (err) throw XdpError("BPF_PROG_TEST_RUN: " + errstr(err));
  return opts.duration;
}

std::string check_interface(const std::string &ifname, const std::vector<int> &queues,
                            bool &queue_at_fault) {
  queue_at_fault = false;
  if (if_nametoindex(ifname.c_str()) == 0) return "interface " + ifname + ": " + errstr(errno);
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  ethtool_channels ch{};
  ch.cmd = ETHTOOL_GCHANNELS;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
  ifr.ifr_data = reinterpret_cast<char *>(&ch);
  const bool known = ioctl(fd, SIOCETHTOOL, &ifr) == 0;
  close(fd);
  const uint32_t rx = ch.rx_count + ch.combined_count;
  if (!known || rx == 0) return {}; // the driver does not say
  for (int q : queues) {
    if (q >= 0 && static_cast<uint32_t>(q) >= rx) {
      queue_at_fault = true;
      return "interface " + ifname + " has " + std::to_string(rx) + " receive queue" +
             (rx == 1 ? "" : "s") + " (0-" + std::to_string(rx - 1) + "): no queue " +
             std::to_string(q);
    }
  }
  return {};
}

} // namespace xdpq::dataplane
