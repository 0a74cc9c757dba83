// SPDX-License-Identifier: GPL-2.0
/* xdpq's XDP steering program.
 *
 * UDP to a served (address, port) goes to the AF_XDP socket of the queue it
 * arrived on, falling back to the kernel (XDP_PASS) when that queue has no
 * socket. Packets aimed at a served port that no QUIC server should accept
 * are dropped here and counted per reason. Everything else passes to the
 * kernel untouched. Every header access is bounds-checked first.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "xdpq_shared.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, XDPQ_MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, XDPQ_MAX_SERVED);
	__type(key, struct xdpq_v4_key);
	__type(value, __u8);
} served_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, XDPQ_MAX_SERVED);
	__type(key, struct xdpq_v6_key);
	__type(value, __u8);
} served_v6 SEC(".maps");

/* The host's own addresses, kept by xdpqd from the kernel's address
 * notifications: a port served on every address is served on these only.
 * Traffic to any other address (a router's or a hypervisor's forwarded
 * traffic, a broadcast) stays the kernel's. And a datagram from the wire
 * whose source is one of them is forged. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, XDPQ_MAX_LOCAL);
	__type(key, __u32);
	__type(value, __u8);
} local_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, XDPQ_MAX_LOCAL);
	__type(key, struct in6_addr);
	__type(value, __u8);
} local_v6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XDPQ_CNT__MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

struct vlan_hdr {
	__be16 tci;
	__be16 encapsulated_proto;
};

#define IP_MF 0x2000
#define IP_OFFSET 0x1fff
#define IPPROTO_FRAGMENT_HDR 44
#define IPPROTO_HOPOPTS_HDR 0
#define IPPROTO_ROUTING_HDR 43
#define IPPROTO_DSTOPTS_HDR 60
/* IPv6 extension headers walked to find what they carry. */
#define IPV6_EXT_WALK 8

/* Hop-by-hop, routing and destination options headers begin alike. */
struct ext_hdr {
	__u8 nexthdr;
	__u8 len; /* in 8-octet units, not counting the first 8 */
};

static __always_inline int ipv6_ext(__u8 nexthdr)
{
	return nexthdr == IPPROTO_HOPOPTS_HDR || nexthdr == IPPROTO_ROUTING_HDR ||
	       nexthdr == IPPROTO_DSTOPTS_HDR;
}

struct frag_hdr {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off;
	__be32 identification;
};

static __always_inline int count(__u32 id, int verdict)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &id);

	if (c)
		*c += 1;
	return verdict;
}

/* Whether (daddr, dport) is served: SERVED, NOT_SERVED, or NOT_LOCAL (the
 * port is served on every address, and daddr is not one of the host's). */
#define SERVED 1
#define NOT_SERVED 0
#define NOT_LOCAL (-1)

static __always_inline int served4(__be32 daddr, __be16 dport)
{
	struct xdpq_v4_key k = { .addr = daddr, .port = dport };

	if (bpf_map_lookup_elem(&served_v4, &k))
		return SERVED;
	k.addr = 0;
	if (!bpf_map_lookup_elem(&served_v4, &k))
		return NOT_SERVED;
	return bpf_map_lookup_elem(&local_v4, &daddr) ? SERVED : NOT_LOCAL;
}

static __always_inline int served6(const struct in6_addr *daddr, __be16 dport)
{
	struct xdpq_v6_key k = { .port = dport };
	struct in6_addr a;

	__builtin_memcpy(k.addr, daddr, 16);
	if (bpf_map_lookup_elem(&served_v6, &k))
		return SERVED;
	__builtin_memset(k.addr, 0, 16);
	if (!bpf_map_lookup_elem(&served_v6, &k))
		return NOT_SERVED;
	__builtin_memcpy(&a, daddr, 16); /* map keys must live on the stack */
	return bpf_map_lookup_elem(&local_v6, &a) ? SERVED : NOT_LOCAL;
}

static __always_inline int not_served(int s)
{
	return s == NOT_LOCAL ? count(XDPQ_CNT_PASS_NOT_LOCAL, XDP_PASS)
			      : count(XDPQ_CNT_PASS_NOT_SERVED, XDP_PASS);
}

/* Judges the UDP payload of a datagram to a served port; udp_len is the
 * UDP length field, already checked against the IP length. */
static __always_inline int judge_udp(struct xdp_md *ctx, struct udphdr *udp, __u32 udp_len,
				     void *end)
{
	__u32 payload = udp_len - sizeof(*udp);
	__u8 *p = (__u8 *)(udp + 1);

        if (xdpq_reflection_port(bpf_ntohs(udp->source)))
          return count(XDPQ_CNT_DROP_REFLECTION, XDP_DROP);
	if (payload < XDPQ_MIN_QUIC_PAYLOAD)
		return count(XDPQ_CNT_DROP_SHORT_PAYLOAD, XDP_DROP);
	if ((void *)(p + 5) > end)
		return count(XDPQ_CNT_DROP_BAD_UDP_LEN, XDP_DROP);
	/* Long header, QUIC v1, packet type Initial (0b00). */
	if ((p[0] & 0xb0) == 0x80 && p[1] == 0 && p[2] == 0 && p[3] == 0 && p[4] == 1 &&
	    payload < XDPQ_MIN_INITIAL_PAYLOAD)
		return count(XDPQ_CNT_DROP_SMALL_INITIAL, XDP_DROP);
	__u32 queue = ctx->rx_queue_index; /* map keys must live on the stack */

	if (bpf_map_lookup_elem(&xsks, &queue) == NULL)
		return count(XDPQ_CNT_PASS_NO_SOCKET, XDP_PASS);
	count(XDPQ_CNT_REDIRECTED, 0);
	return bpf_redirect_map(&xsks, queue, XDP_PASS);
}

static __always_inline int handle_ipv4(struct xdp_md *ctx, void *l3, void *end)
{
	struct iphdr *ip = l3;
	struct udphdr *udp;
	__u32 ihl, tot_len, udp_len;

	if ((void *)(ip + 1) > end)
		return count(XDPQ_CNT_PASS_TRUNCATED, XDP_PASS);
	if (ip->protocol != IPPROTO_UDP)
		return count(XDPQ_CNT_PASS_NOT_UDP, XDP_PASS);
	ihl = ip->ihl * 4;
	if (ihl < sizeof(*ip))
		return count(XDPQ_CNT_PASS_TRUNCATED, XDP_PASS);
	/* A non-first fragment carries no UDP header: nothing to judge. */
	if (ip->frag_off & bpf_htons(IP_OFFSET))
		return count(XDPQ_CNT_PASS_NOT_SERVED, XDP_PASS);
	udp = l3 + ihl;
	if ((void *)(udp + 1) > end)
		return count(XDPQ_CNT_PASS_TRUNCATED, XDP_PASS);
	int s = served4(ip->daddr, udp->dest);
	if (s != SERVED)
		return not_served(s);
	if (ip->frag_off & bpf_htons(IP_MF))
		return count(XDPQ_CNT_DROP_FRAGMENT, XDP_DROP);
	tot_len = bpf_ntohs(ip->tot_len);
	if (tot_len < ihl + sizeof(*udp) || l3 + tot_len > end)
		return count(XDPQ_CNT_DROP_BAD_IP_LEN, XDP_DROP);
	udp_len = bpf_ntohs(udp->len);
	if (udp_len < sizeof(*udp) || udp_len > tot_len - ihl)
		return count(XDPQ_CNT_DROP_BAD_UDP_LEN, XDP_DROP);
	__u32 saddr = ip->saddr; /* map keys must live on the stack */
	if (bpf_map_lookup_elem(&local_v4, &saddr))
		return count(XDPQ_CNT_DROP_LOCAL_SOURCE, XDP_DROP);
	return judge_udp(ctx, udp, udp_len, end);
}

/* An IPv6 header chain whose end this packet does not show: longer than
 * the walk, or (cut) ending inside the packet's own bytes. The kernel drops
 * a packet cut inside its chain, except a first fragment: it reassembles
 * that whole (it refuses only a first fragment cut before its upper-layer
 * header), so what it carries could be UDP to a served port. Such a packet
 * aimed at this host is dropped (no one sends them: RFC 7872, RFC 8200
 * 4.5); anything else is the kernel's. */
static __always_inline int chain_unseen(struct ipv6hdr *ip6, int cut, int fragment)
{
	struct in6_addr a;

	if (!cut || fragment) {
		__builtin_memcpy(&a, &ip6->daddr, 16); /* map keys must live on the stack */
		if (bpf_map_lookup_elem(&local_v6, &a))
			return count(XDPQ_CNT_DROP_EXT_HEADER, XDP_DROP);
	}
	return cut ? count(XDPQ_CNT_PASS_TRUNCATED, XDP_PASS)
		   : count(XDPQ_CNT_PASS_NOT_UDP, XDP_PASS);
}

static __always_inline int handle_ipv6(struct xdp_md *ctx, void *l3, void *end)
{
	struct ipv6hdr *ip6 = l3;
	struct udphdr *udp;
	__u32 payload_len, udp_len;
	int fragment = 0;

	if ((void *)(ip6 + 1) > end)
		return count(XDPQ_CNT_PASS_TRUNCATED, XDP_PASS);
	/* Extension headers: the kernel reads past them, so the UDP they carry
	 * reaches the server's port through the kernel's socket, past every
	 * check here (a source that is the host's own address, which IPv6
	 * input does not refuse as IPv4's does, would have the server answer
	 * its own host). The user-space path does not read them either. */
	__u8 next = ip6->nexthdr;
	void *l4 = ip6 + 1;
	int extended = 0;
#pragma unroll
	for (int i = 0; i < IPV6_EXT_WALK; i++) {
		if (next == IPPROTO_FRAGMENT_HDR) {
			/* Extension headers may follow it too (RFC 8200 4.1). */
			struct frag_hdr *fh = l4;

			if ((void *)(fh + 1) > end)
				return chain_unseen(ip6, 1, fragment);
			/* A non-first fragment carries no UDP header: nothing to judge. */
			if (fh->frag_off & bpf_htons(0xfff8))
				return count(XDPQ_CNT_PASS_NOT_SERVED, XDP_PASS);
			fragment = 1;
			next = fh->nexthdr;
			l4 = fh + 1;
			continue;
		}
		struct ext_hdr *eh = l4;

		if (!ipv6_ext(next))
			break;
		if ((void *)(eh + 1) > end)
			return chain_unseen(ip6, 1, fragment);
		next = eh->nexthdr;
		l4 += ((__u32)eh->len + 1) * 8;
		extended = 1;
	}
	if (ipv6_ext(next) || next == IPPROTO_FRAGMENT_HDR)
		return chain_unseen(ip6, 0, fragment); /* longer than we look */
	if (next != IPPROTO_UDP)
		return count(XDPQ_CNT_PASS_NOT_UDP, XDP_PASS);
	udp = l4;
	if ((void *)(udp + 1) > end)
		return count(XDPQ_CNT_PASS_TRUNCATED, XDP_PASS);
	int s = served6(&ip6->daddr, udp->dest);
	if (s != SERVED)
		return not_served(s);
	if (extended)
		return count(XDPQ_CNT_DROP_EXT_HEADER, XDP_DROP);
	if (fragment)
		return count(XDPQ_CNT_DROP_FRAGMENT, XDP_DROP);
	payload_len = bpf_ntohs(ip6->payload_len);
	if (payload_len < sizeof(*udp) || (void *)(ip6 + 1) + payload_len > end)
		return count(XDPQ_CNT_DROP_BAD_IP_LEN, XDP_DROP);
	udp_len = bpf_ntohs(udp->len);
	if (udp_len < sizeof(*udp) || udp_len > payload_len)
		return count(XDPQ_CNT_DROP_BAD_UDP_LEN, XDP_DROP);
	struct in6_addr saddr;

	__builtin_memcpy(&saddr, &ip6->saddr, 16); /* map keys must live on the stack */
	if (bpf_map_lookup_elem(&local_v6, &saddr))
		return count(XDPQ_CNT_DROP_LOCAL_SOURCE, XDP_DROP);
	return judge_udp(ctx, udp, udp_len, end);
}

SEC("xdp")
int xdpq_steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	void *l3;
	__u16 proto;

	if ((void *)(eth + 1) > end)
		return count(XDPQ_CNT_PASS_TRUNCATED, XDP_PASS);
	proto = eth->h_proto;
	l3 = eth + 1;
	/* One 802.1Q tag. An 802.1ad (S-tag) frame goes to the kernel: the
	 * user-space path would answer it with an 802.1Q tag. */
	if (proto == bpf_htons(ETH_P_8021Q)) {
		struct vlan_hdr *vh = l3;

		if ((void *)(vh + 1) > end)
			return count(XDPQ_CNT_PASS_TRUNCATED, XDP_PASS);
		proto = vh->encapsulated_proto;
		l3 = vh + 1;
	}
	if (proto == bpf_htons(ETH_P_IP))
		return handle_ipv4(ctx, l3, end);
	if (proto == bpf_htons(ETH_P_IPV6))
		return handle_ipv6(ctx, l3, end);
	return count(XDPQ_CNT_PASS_NOT_IP, XDP_PASS);
}
