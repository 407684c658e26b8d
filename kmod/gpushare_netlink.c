// SPDX-License-Identifier: GPL-2.0
/*
 * gpushare netlink: commands from user space, one status reply each, and
 * owner-back notices to the registered receiver. The protocol is described
 * in include/gpushare_kmod.h.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/netlink.h>
#include <linux/capability.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/ktime.h>
#include <net/netlink.h>
#include <net/sock.h>

#include "gpushare_internal.h"

static struct sock *gpushare_nl_sock;
static u32 gpushare_receiver;
static atomic64_t gpushare_notice_seq = ATOMIC64_INIT(0);
static atomic64_t gpushare_notices_sent = ATOMIC64_INIT(0);
static atomic64_t gpushare_notices_dropped = ATOMIC64_INIT(0);

/* One piece of a message payload after the header. */
struct gpushare_part {
	const void *data;
	size_t len;
};

static struct sk_buff *gpushare_nl_build(int type, u32 nlseq,
					 const struct gpushare_kmod_hdr *hdr,
					 const struct gpushare_part *parts,
					 int nparts, gfp_t gfp)
{
	size_t len = sizeof(*hdr);
	struct nlmsghdr *nlh;
	struct sk_buff *skb;
	char *p;
	int i;

	for (i = 0; i < nparts; i++)
		len += parts[i].len;
	skb = nlmsg_new(len, gfp);
	if (!skb)
		return NULL;
	nlh = nlmsg_put(skb, 0, nlseq, type, len, 0);
	if (!nlh) {
		kfree_skb(skb);
		return NULL;
	}
	p = nlmsg_data(nlh);
	memcpy(p, hdr, sizeof(*hdr));
	p += sizeof(*hdr);
	for (i = 0; i < nparts; i++) {
		memcpy(p, parts[i].data, parts[i].len);
		p += parts[i].len;
	}
	return skb;
}

static void gpushare_nl_reply(u32 portid, u32 nlseq,
			      const struct gpushare_kmod_hdr *req, int status,
			      u32 count, const struct gpushare_part *parts,
			      int nparts)
{
	struct gpushare_kmod_hdr hdr = {
		.version = GPUSHARE_KMOD_VERSION, .cmd = req->cmd,
		.seq = req->seq, .status = status, .count = count,
	};
	struct sk_buff *skb;

	skb = gpushare_nl_build(GPUSHARE_KMOD_MSG_REPLY, nlseq, &hdr, parts,
				nparts, GFP_KERNEL);
	if (skb)
		netlink_unicast(gpushare_nl_sock, skb, portid, MSG_DONTWAIT);
}

void gpushare_notify(const struct gpushare_kmod_notice *notice)
{
	u32 portid = READ_ONCE(gpushare_receiver);
	struct gpushare_part part = { notice, sizeof(*notice) };
	struct gpushare_kmod_hdr hdr = {
		.version = GPUSHARE_KMOD_VERSION,
		.cmd = GPUSHARE_KMOD_CMD_NOTICE, .count = 1,
		.seq = (u32)atomic64_inc_return(&gpushare_notice_seq),
	};
	struct sk_buff *skb;

	if (!portid)
		goto err_drop;
	skb = gpushare_nl_build(GPUSHARE_KMOD_MSG_NOTICE, hdr.seq, &hdr, &part,
				1, GFP_KERNEL);
	if (!skb)
		goto err_drop;
	if (netlink_unicast(gpushare_nl_sock, skb, portid, MSG_DONTWAIT) < 0)
		goto err_drop;
	atomic64_inc(&gpushare_notices_sent);
	return;

err_drop:
	atomic64_inc(&gpushare_notices_dropped);
}

/* ---- commands ------------------------------------------------------------ */

static int gpushare_ids_check(const u64 *ids, u32 n)
{
	u32 i;

	for (i = 0; i < n; i++)
		if (!ids[i] || ids[i] > U32_MAX)
			return -EINVAL;
	return 0;
}

static int gpushare_targets_check(const struct gpushare_kmod_target *t, u32 n)
{
	u32 i;

	for (i = 0; i < n; i++)
		if (!t[i].pidns || t[i].pidns > U32_MAX || !t[i].pid || t[i].pad)
			return -EINVAL;
	return 0;
}

/* ADD, DETECT: every target on its own; the reply lists each status. */
static void gpushare_cmd_targets(u32 portid, u32 nlseq,
				 const struct gpushare_kmod_hdr *req,
				 const struct gpushare_kmod_target *t)
{
	bool detect = req->cmd == GPUSHARE_KMOD_CMD_DETECT;
	struct gpushare_part part;
	int ret = 0;
	s32 *status;
	u32 i;

	status = kvcalloc(req->count ?: 1, sizeof(*status), GFP_KERNEL);
	if (!status) {
		gpushare_nl_reply(portid, nlseq, req, -ENOMEM, 0, NULL, 0);
		return;
	}
	for (i = 0; i < req->count; i++) {
		status[i] = gpushare_map_add(&t[i], detect);
		if (status[i] < 0 && !ret)
			ret = status[i];
	}
	part.data = status;
	part.len = req->count * sizeof(*status);
	gpushare_nl_reply(portid, nlseq, req, ret, req->count, &part, 1);
	kvfree(status);
}

static int gpushare_cmd_ids(u16 cmd, const u64 *ids, u32 n)
{
	int ret = 0, r;
	u32 i;

	for (i = 0; i < n; i++) {
		switch (cmd) {
		case GPUSHARE_KMOD_CMD_DELETE:
			r = gpushare_map_delete(ids[i]);
			break;
		case GPUSHARE_KMOD_CMD_UNDETECT:
			r = gpushare_map_undetect(ids[i]);
			break;
		default:
			r = gpushare_map_release(ids[i]);
			break;
		}
		if (r < 0)
			return r;
		ret += r;
	}
	return ret;
}

/* STATS, and HOLD (which moves deadlines first): head and records. */
static void gpushare_cmd_stats(u32 portid, u32 nlseq,
			       const struct gpushare_kmod_hdr *req,
			       const u64 *ids)
{
	struct gpushare_kmod_stats_head head = {};
	struct gpushare_part parts[2] = { { &head, sizeof(head) } };
	struct gpushare_kmod_stats *recs;
	int n, status = 0;
	u32 i;

	recs = kvcalloc(GPUSHARE_KMOD_MAX_IDS, sizeof(*recs), GFP_KERNEL);
	if (!recs) {
		gpushare_nl_reply(portid, nlseq, req, -ENOMEM, 0, NULL, 0);
		return;
	}
	if (req->cmd == GPUSHARE_KMOD_CMD_HOLD)
		for (i = 0; i < req->count; i++)
			status += gpushare_map_hold(ids[i]);
	head = (struct gpushare_kmod_stats_head) {
		.now_ns = ktime_get_ns(),
		.notices_sent = atomic64_read(&gpushare_notices_sent),
		.notices_dropped = atomic64_read(&gpushare_notices_dropped),
		.entries = gpushare_map_count(),
		.max_entries = gpushare_max_entries,
		.receiver_portid = READ_ONCE(gpushare_receiver),
		.timeout_ms = READ_ONCE(gpushare_timeout_ms),
		.max_hold_ms = READ_ONCE(gpushare_max_hold_ms),
	};
	n = gpushare_map_stats(ids, req->count, recs, GPUSHARE_KMOD_MAX_IDS);
	parts[1].data = recs;
	parts[1].len = n * sizeof(*recs);
	gpushare_nl_reply(portid, nlseq, req, status, n, parts, 2);
	kvfree(recs);
}

static void gpushare_cmd_config(u32 portid, u32 nlseq,
				const struct gpushare_kmod_hdr *req,
				const void *items)
{
	struct gpushare_kmod_config cfg;
	struct gpushare_part part = { &cfg, sizeof(cfg) };
	int ret = 0;

	if (req->count) {
		memcpy(&cfg, items, sizeof(cfg));
		ret = gpushare_config_set(&cfg);
	}
	gpushare_config_get(&cfg);
	gpushare_nl_reply(portid, nlseq, req, ret, 1, &part, 1);
}

/* The sender becomes the receiver; the reply, then the notices again. */
static void gpushare_cmd_register(u32 portid, u32 nlseq,
				  const struct gpushare_kmod_hdr *req)
{
	int resent;

	WRITE_ONCE(gpushare_receiver, portid);
	gpushare_nl_reply(portid, nlseq, req, 0, 0, NULL, 0);
	resent = gpushare_map_resend();
	pr_info("notice receiver is port %u (%d notices sent again)\n", portid,
		resent);
}

/* Expected payload size after the header, or -EINVAL. */
static long gpushare_items_len(const struct gpushare_kmod_hdr *hdr)
{
	switch (hdr->cmd) {
	case GPUSHARE_KMOD_CMD_REGISTER:
		return hdr->count ? -EINVAL : 0;
	case GPUSHARE_KMOD_CMD_CONFIG:
		if (hdr->count > 1)
			return -EINVAL;
		return hdr->count * sizeof(struct gpushare_kmod_config);
	case GPUSHARE_KMOD_CMD_ADD:
	case GPUSHARE_KMOD_CMD_DETECT:
		return hdr->count * sizeof(struct gpushare_kmod_target);
	default:
		return hdr->count * sizeof(u64);
	}
}

static int gpushare_cmd_check(struct sk_buff *skb, const struct nlmsghdr *nlh,
			      const struct gpushare_kmod_hdr *hdr)
{
	size_t plen = nlmsg_len(nlh);
	long want;

	if (nlh->nlmsg_type != GPUSHARE_KMOD_MSG_CMD || plen < sizeof(*hdr))
		return -EINVAL;
	if (!netlink_capable(skb, CAP_NET_ADMIN))
		return -EPERM;
	if (hdr->version != GPUSHARE_KMOD_VERSION)
		return -EPROTO;
	if (hdr->cmd < GPUSHARE_KMOD_CMD_REGISTER ||
	    hdr->cmd > GPUSHARE_KMOD_CMD_HOLD ||
	    hdr->cmd == GPUSHARE_KMOD_CMD_NOTICE)
		return -EOPNOTSUPP;
	if (hdr->count > GPUSHARE_KMOD_MAX_IDS)
		return -EINVAL;
	want = gpushare_items_len(hdr);
	if (want < 0 || plen != sizeof(*hdr) + want)
		return -EINVAL;
	return 0;
}

static void gpushare_nl_command(struct sk_buff *skb, struct nlmsghdr *nlh)
{
	u32 portid = NETLINK_CB(skb).portid;
	struct gpushare_kmod_hdr hdr = {};
	const void *items = (const char *)nlmsg_data(nlh) + sizeof(hdr);
	int ret;

	if (nlmsg_len(nlh) >= (int)sizeof(hdr))
		memcpy(&hdr, nlmsg_data(nlh), sizeof(hdr));
	ret = gpushare_cmd_check(skb, nlh, &hdr);
	if (ret)
		goto reply;
	switch (hdr.cmd) {
	case GPUSHARE_KMOD_CMD_REGISTER:
		return gpushare_cmd_register(portid, nlh->nlmsg_seq, &hdr);
	case GPUSHARE_KMOD_CMD_STATS:
	case GPUSHARE_KMOD_CMD_HOLD:
		ret = gpushare_ids_check(items, hdr.count);
		if (ret)
			break;
		return gpushare_cmd_stats(portid, nlh->nlmsg_seq, &hdr, items);
	case GPUSHARE_KMOD_CMD_CONFIG:
		return gpushare_cmd_config(portid, nlh->nlmsg_seq, &hdr, items);
	case GPUSHARE_KMOD_CMD_ADD:
	case GPUSHARE_KMOD_CMD_DETECT:
		ret = gpushare_targets_check(items, hdr.count);
		if (ret)
			break;
		return gpushare_cmd_targets(portid, nlh->nlmsg_seq, &hdr, items);
	default:
		ret = gpushare_ids_check(items, hdr.count);
		if (!ret)
			ret = gpushare_cmd_ids(hdr.cmd, items, hdr.count);
		break;
	}
reply:
	gpushare_nl_reply(portid, nlh->nlmsg_seq, &hdr, ret, 0, NULL, 0);
}

static void gpushare_nl_input(struct sk_buff *skb)
{
	struct nlmsghdr *nlh = nlmsg_hdr(skb);
	struct gpushare_kmod_hdr none = {};
	int rem = skb->len;

	if (!nlmsg_ok(nlh, rem)) {
		gpushare_nl_reply(NETLINK_CB(skb).portid, 0, &none, -EINVAL, 0,
				  NULL, 0);
		return;
	}
	for (; nlmsg_ok(nlh, rem); nlh = nlmsg_next(nlh, &rem))
		gpushare_nl_command(skb, nlh);
}

int gpushare_netlink_init(int unit)
{
	struct netlink_kernel_cfg cfg = { .input = gpushare_nl_input };

	gpushare_receiver = 0;
	gpushare_nl_sock = netlink_kernel_create(&init_net, unit, &cfg);
	if (!gpushare_nl_sock) {
		pr_err("netlink protocol %d is taken or unavailable\n", unit);
		return -EBUSY;
	}
	return 0;
}

void gpushare_netlink_exit(void)
{
	netlink_kernel_release(gpushare_nl_sock);
	gpushare_nl_sock = NULL;
}
