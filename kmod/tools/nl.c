// SPDX-License-Identifier: GPL-2.0
/* gpushare-kmodctl: netlink client side of include/gpushare_kmod.h. */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <linux/netlink.h>

#include "kmodctl.h"

static uint32_t nl_next_seq = 1;

int nl_open(int unit)
{
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, unit);

	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -errno;
	}
	return fd;
}

int nl_send_raw(int fd, const void *buf, size_t len)
{
	struct sockaddr_nl to = { .nl_family = AF_NETLINK };

	if (sendto(fd, buf, len, 0, (struct sockaddr *)&to, sizeof(to)) < 0)
		return -errno;
	return 0;
}

int nl_send(int fd, uint16_t type, uint32_t seq, const void *payload,
	    size_t len)
{
	static unsigned char buf[KMODCTL_BUF + 64];
	struct nlmsghdr *nlh = (struct nlmsghdr *)buf;

	if (len > KMODCTL_BUF)
		return -EMSGSIZE;
	memset(nlh, 0, sizeof(*nlh));
	nlh->nlmsg_len = NLMSG_LENGTH(len);
	nlh->nlmsg_type = type;
	nlh->nlmsg_flags = NLM_F_REQUEST;
	nlh->nlmsg_seq = seq;
	memcpy(NLMSG_DATA(nlh), payload, len);
	return nl_send_raw(fd, buf, nlh->nlmsg_len);
}

int nl_pending(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) > 0;
}

int nl_recv(int fd, struct kmodctl_reply *r, int timeout_ms)
{
	static unsigned char buf[KMODCTL_BUF + 256];
	struct pollfd p = { .fd = fd, .events = POLLIN };
	struct nlmsghdr *nlh = (struct nlmsghdr *)buf;
	ssize_t n;
	size_t plen;

	n = poll(&p, 1, timeout_ms);
	if (n <= 0)
		return n < 0 ? -errno : 0;
	n = recv(fd, buf, sizeof(buf), 0);
	if (n < 0)
		return -errno;
	if ((size_t)n < NLMSG_HDRLEN + sizeof(r->hdr) || nlh->nlmsg_len > n)
		return -EBADMSG;
	plen = nlh->nlmsg_len - NLMSG_HDRLEN;
	r->nl_type = nlh->nlmsg_type;
	r->nl_seq = nlh->nlmsg_seq;
	memcpy(&r->hdr, NLMSG_DATA(nlh), sizeof(r->hdr));
	r->items_len = plen - sizeof(r->hdr);
	if (r->items_len > sizeof(r->items))
		return -EBADMSG;
	memcpy(r->items, (char *)NLMSG_DATA(nlh) + sizeof(r->hdr), r->items_len);
	return 1;
}

int nl_cmd_payload(int fd, uint16_t cmd, uint32_t count, const void *items,
		   size_t len, struct kmodctl_reply *r)
{
	static unsigned char msg[KMODCTL_BUF];
	struct gpushare_kmod_hdr hdr = {
		.version = GPUSHARE_KMOD_VERSION, .cmd = cmd,
		.seq = nl_next_seq++, .count = count,
	};
	int ret;

	if (len + sizeof(hdr) > sizeof(msg))
		return -EMSGSIZE;
	memcpy(msg, &hdr, sizeof(hdr));
	memcpy(msg + sizeof(hdr), items, len);
	ret = nl_send(fd, GPUSHARE_KMOD_MSG_CMD, hdr.seq, msg, sizeof(hdr) + len);
	if (ret)
		return ret;
	ret = nl_recv(fd, r, 5000);
	if (ret <= 0)
		return ret ? ret : -ETIME;
	if (r->nl_type != GPUSHARE_KMOD_MSG_REPLY || r->hdr.seq != hdr.seq)
		return -EBADMSG;
	return r->hdr.status;
}

int nl_cmd(int fd, uint16_t cmd, const uint64_t *ids, uint32_t n,
	   struct kmodctl_reply *r)
{
	return nl_cmd_payload(fd, cmd, n, ids, n * sizeof(*ids), r);
}

/* ADD or DETECT of one namespace with a process in it; the reply's status. */
int nl_target(int fd, uint16_t cmd, uint64_t pidns, pid_t pid,
	      struct kmodctl_reply *r)
{
	struct gpushare_kmod_target t = { .pidns = pidns, .pid = (uint32_t)pid };

	return nl_cmd_payload(fd, cmd, 1, &t, sizeof(t), r);
}

/* Stats of one namespace; 1 when found, 0 when absent, -errno. */
int nl_stats_one(int fd, uint64_t pidns, struct gpushare_kmod_stats *out,
		 struct gpushare_kmod_stats_head *head)
{
	static struct kmodctl_reply r;
	int ret = nl_cmd(fd, GPUSHARE_KMOD_CMD_STATS, &pidns, 1, &r);

	if (ret < 0)
		return ret;
	if (head)
		memcpy(head, r.items, sizeof(*head));
	if (r.hdr.count < 1)
		return 0;
	memcpy(out, r.items + sizeof(*head), sizeof(*out));
	return 1;
}
