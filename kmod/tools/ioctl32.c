// SPDX-License-Identifier: GPL-2.0
/* 32-bit, no C library: open /dev/null, one ioctl of type 0x46, exit with errno. */
static long sys3(long nr, long a, long b, long c)
{
	long ret;

	__asm__ volatile ("int $0x80" : "=a"(ret) : "a"(nr), "b"(a), "c"(b), "d"(c) : "memory");
	return ret;
}

void _start(void)
{
	long fd = sys3(5 /* open */, (long)"/dev/null", 0, 0);
	long ret = sys3(54 /* ioctl */, fd, 0x4601 /* _IO(0x46, 1) */, 0);

	sys3(1 /* exit */, ret < 0 ? -ret : 0, 0, 0);
	for (;;)
		;
}
