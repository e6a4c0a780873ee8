/*
 * pingpong: a wake-up ping-pong between two processes on two CPUs, the
 * guest side of the bench's pingpong case (tests/bench/pingpong.go,
 * issue 27).
 *
 * The parent runs on CPU 0, its child on CPU 1 (sched_setaffinity; the
 * guest must have both online). One byte goes parent -> child through one
 * pipe and back through another: a round trip is two wake-ups of a process
 * blocked in read(2), each on the other CPU, so each one is an idle vCPU
 * woken by an IPI. That is the path --cpu-mode changes: in shared mode the
 * idle vCPU has exited to the host on HLT and the host must schedule it
 * again; in dedicated mode it halts in the guest and only the interrupt is
 * delivered.
 *
 * Usage: pingpong [ROUNDS [WARMUP]] (defaults 2000 and 200). Each measured
 * round trip is timed with CLOCK_MONOTONIC in the parent; the output is one
 * line:
 *
 *   pingpong rounds=N median_ns=... p10_ns=... p90_ns=... mean_ns=... min_ns=... max_ns=...
 *
 * Any failure prints "pingpong: ..." on stderr and exits 1. Built static
 * (gcc -static) so it runs on a busybox rootfs without a libc.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
	fprintf(stderr, "pingpong: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void pin(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) != 0) {
		fprintf(stderr, "pingpong: pinning to CPU %d: %s (the guest needs 2 online CPUs)\n", cpu, strerror(errno));
		exit(1);
	}
}

static void xread(int fd, char *c)
{
	for (;;) {
		ssize_t n = read(fd, c, 1);
		if (n == 1)
			return;
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0) {
			fprintf(stderr, "pingpong: unexpected end of pipe\n");
			exit(1);
		}
		die("read");
	}
}

static void xwrite(int fd, char c)
{
	for (;;) {
		ssize_t n = write(fd, &c, 1);
		if (n == 1)
			return;
		if (n < 0 && errno == EINTR)
			continue;
		die("write");
	}
}

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

static long arg(const char *s, const char *name)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (*s == '\0' || *end != '\0' || v < 1 || v > 10000000) {
		fprintf(stderr, "pingpong: %s %s: want a number from 1 to 10000000\n", name, s);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	long rounds = 2000, warmup = 200;
	if (argc > 1)
		rounds = arg(argv[1], "ROUNDS");
	if (argc > 2)
		warmup = arg(argv[2], "WARMUP");
	if (argc > 3) {
		fprintf(stderr, "usage: pingpong [ROUNDS [WARMUP]]\n");
		return 2;
	}
	int ping[2], pong[2];
	if (pipe(ping) != 0 || pipe(pong) != 0)
		die("pipe");
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		pin(1);
		close(ping[1]);
		close(pong[0]);
		char c;
		for (;;) {
			ssize_t n = read(ping[0], &c, 1);
			if (n == 0)
				_exit(0); /* the parent is done */
			if (n < 0) {
				if (errno == EINTR)
					continue;
				die("child read");
			}
			xwrite(pong[1], c);
		}
	}
	pin(0);
	close(ping[0]);
	close(pong[1]);
	int64_t *rt = calloc((size_t)rounds, sizeof *rt);
	if (rt == NULL)
		die("calloc");
	char c = 'x';
	for (long i = 0; i < warmup + rounds; i++) {
		int64_t t0 = now_ns();
		xwrite(ping[1], c);
		xread(pong[0], &c);
		if (i >= warmup)
			rt[i - warmup] = now_ns() - t0;
	}
	close(ping[1]);
	int status;
	if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "pingpong: the child failed\n");
		return 1;
	}
	double sum = 0;
	for (long i = 0; i < rounds; i++)
		sum += (double)rt[i];
	qsort(rt, (size_t)rounds, sizeof *rt, cmp);
	int64_t median = rounds % 2 ? rt[rounds / 2] : (rt[rounds / 2 - 1] + rt[rounds / 2]) / 2;
	printf("pingpong rounds=%ld median_ns=%lld p10_ns=%lld p90_ns=%lld mean_ns=%.0f min_ns=%lld max_ns=%lld\n",
	       rounds, (long long)median, (long long)rt[rounds / 10], (long long)rt[rounds * 9 / 10],
	       sum / (double)rounds, (long long)rt[0], (long long)rt[rounds - 1]);
	return 0;
}
