/* The one header the XDP program and the C++ control code share: map keys
 * and values, counter ids and limits. C++ includes it and static_asserts the
 * sizes (dataplane/xdp_program.cc); nothing here is copied by hand.
 */
#ifndef XDPQ_SHARED_H
#define XDPQ_SHARED_H

#ifdef __BPF__
#include <linux/types.h>
#else
#include <linux/types.h>
#endif

#define XDPQ_MAX_QUEUES 256   /* XSKMAP entries: one per NIC queue */
#define XDPQ_MAX_SERVED 64    /* served (address, port) pairs per family */
#define XDPQ_MAX_LOCAL 4096   /* the host's own addresses per family */

/* The smallest UDP payload that can be a QUIC packet for us: a stateless
 * reset is at least 21 bytes (RFC 9000 10.3), every other packet is larger. */
#define XDPQ_MIN_QUIC_PAYLOAD 21
/* Initial packets ride in datagrams of at least 1200 bytes (RFC 9000 14.1). */
#define XDPQ_MIN_INITIAL_PAYLOAD 1200

/* Source ports no QUIC client sends from: privileged ports, and services
 * that answer small queries with big replies (reflection and amplification
 * sources). Dropped by the XDP program and by the socket dataplane alike. */
static inline __attribute__((always_inline)) int xdpq_reflection_port(__u16 sport) {
  if (sport < 1024)
    return 1;
  switch (sport) {
  case 1900:  /* SSDP */
  case 3283:  /* Apple Remote Desktop */
  case 3702:  /* WS-Discovery */
  case 5353:  /* mDNS */
  case 5683:  /* CoAP */
  case 10001: /* Ubiquiti discovery */
  case 11211: /* memcached */
  case 17185: /* VxWorks debug */
    return 1;
  }
  return 0;
}

/* A served IPv4 address and UDP port, both in network byte order. An
 * address of 0 serves the port on every local address. */
struct xdpq_v4_key {
	__u32 addr;
	__u16 port;
	__u16 pad;
};

/* A served IPv6 address (all zero: every address) and port (network order). */
struct xdpq_v6_key {
	__u8 addr[16];
	__u16 port;
	__u16 pad;
};

/* Per-CPU counters, indexed by enum xdpq_counter. */
enum xdpq_counter {
	XDPQ_CNT_REDIRECTED = 0,     /* handed to the queue's AF_XDP socket */
	XDPQ_CNT_PASS_NOT_IP,        /* ARP, LLDP, ...: to the kernel */
	XDPQ_CNT_PASS_NOT_UDP,       /* TCP, ICMP, ...: to the kernel */
	XDPQ_CNT_PASS_NOT_SERVED,    /* UDP to another address or port */
	XDPQ_CNT_PASS_TRUNCATED,     /* headers cut short before the port: not ours to judge */
	XDPQ_CNT_PASS_NO_SOCKET,     /* served, but no AF_XDP socket on this queue */
	XDPQ_CNT_DROP_SHORT_PAYLOAD, /* UDP payload shorter than any QUIC packet */
	XDPQ_CNT_DROP_SMALL_INITIAL, /* QUIC v1 Initial in a datagram under 1200 bytes */
	XDPQ_CNT_DROP_REFLECTION,    /* source port below 1024 or a known amplifier */
	XDPQ_CNT_DROP_FRAGMENT,      /* IP fragment aimed at a served port */
	XDPQ_CNT_DROP_BAD_IP_LEN,    /* IP header or total length inconsistent */
	XDPQ_CNT_DROP_BAD_UDP_LEN,   /* UDP length inconsistent with IP */
	XDPQ_CNT_PASS_NOT_LOCAL,     /* a port served on every address, to an address the
	                              * host does not have: the kernel's (it forwards or drops) */
	XDPQ_CNT_DROP_LOCAL_SOURCE,  /* a source address that is the host's own: forged (the
	                              * kernel drops such a martian too) */
	XDPQ_CNT_DROP_EXT_HEADER,    /* IPv6 UDP to a served port behind extension headers
	                              * (hop-by-hop, routing, destination options), or, to this
	                              * host, a chain whose end cannot be seen (too long, or cut
	                              * short in a first fragment): passed on, it could reach
	                              * the server past these checks */
	XDPQ_CNT__MAX
};

#endif
