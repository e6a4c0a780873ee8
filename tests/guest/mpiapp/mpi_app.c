/*
 * mpi_app: the MPI program of the MPI-across-VMs scenarios (tests/mpi_test.go)
 * and of the bench's MPI case, compiled by the test with Debian's mpicc.
 *
 *   mpi_app            every rank: allreduce of the ranks, a token passed once
 *                      round the ring, one line "rank=R size=N host=H sum=S
 *                      token=T" (T = the token rank 0 got back: the sum of
 *                      every rank's +1, so N).
 *   mpi_app pingpong   ranks 0 and 1: round-trip latency of 1-byte messages
 *                      and bandwidth of 1 MiB messages, one line "pingpong
 *                      lat_us=… bw_mib_s=…" from rank 0.
 *
 * MPI_APP_EXIT_RANK=R MPI_APP_EXIT_CODE=C in the environment: rank R exits
 * with status C after MPI_Finalize (so srun reports a failed task).
 * MPI_APP_HOLD=1: after its line every rank waits for SIGTERM, then prints
 * "rank=R got SIGTERM" and exits 143 (what scancel's SIGTERM reaching the
 * program looks like).
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int getenv_int(const char *name, int def)
{
	const char *v = getenv(name);
	return v && *v ? atoi(v) : def;
}

static volatile sig_atomic_t got_term;

static void on_term(int sig)
{
	(void)sig;
	got_term = 1;
}

/* hold waits for SIGTERM (MPI_APP_HOLD) and reports it. */
static void hold(int rank)
{
	struct sigaction sa;
	sigset_t block, old;

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_term;
	sigaction(SIGTERM, &sa, NULL);
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigprocmask(SIG_BLOCK, &block, &old);
	printf("rank=%d holding\n", rank);
	fflush(stdout);
	while (!got_term)
		sigsuspend(&old);
	printf("rank=%d got SIGTERM\n", rank);
	fflush(stdout);
	_exit(143);
}

static void pingpong(int rank)
{
	/* Few iterations: inside the emulated test bed a nested round trip takes
	 * tens of milliseconds. */
	enum { LAT_ITERS = 200, BW_ITERS = 20, BIG = 1 << 20 };
	char *buf = calloc(1, BIG);
	double t0, lat, bw;
	int i;

	if (!buf)
		MPI_Abort(MPI_COMM_WORLD, 2);
	MPI_Barrier(MPI_COMM_WORLD);
	t0 = MPI_Wtime();
	for (i = 0; i < LAT_ITERS; i++) {
		if (rank == 0) {
			MPI_Send(buf, 1, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
			MPI_Recv(buf, 1, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else if (rank == 1) {
			MPI_Recv(buf, 1, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			MPI_Send(buf, 1, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
		}
	}
	lat = (MPI_Wtime() - t0) / LAT_ITERS * 1e6;
	MPI_Barrier(MPI_COMM_WORLD);
	t0 = MPI_Wtime();
	for (i = 0; i < BW_ITERS; i++) {
		if (rank == 0) {
			MPI_Send(buf, BIG, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
			MPI_Recv(buf, 1, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else if (rank == 1) {
			MPI_Recv(buf, BIG, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			MPI_Send(buf, 1, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
		}
	}
	bw = (double)BIG * BW_ITERS / (MPI_Wtime() - t0) / (1 << 20);
	if (rank == 0)
		printf("pingpong lat_us=%.1f bw_mib_s=%.1f\n", lat, bw);
	free(buf);
}

int main(int argc, char **argv)
{
	int rank, size, sum = 0, token = 0, exit_code = 0;
	char host[256] = "?";

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	gethostname(host, sizeof host - 1);

	if (argc > 1 && strcmp(argv[1], "pingpong") == 0) {
		if (size >= 2)
			pingpong(rank);
	} else {
		MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
		/* The ring: rank 0 starts the token at 1, each rank adds 1. */
		if (size == 1) {
			token = 1;
		} else if (rank == 0) {
			token = 1;
			MPI_Send(&token, 1, MPI_INT, 1, 7, MPI_COMM_WORLD);
			MPI_Recv(&token, 1, MPI_INT, size - 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else {
			MPI_Recv(&token, 1, MPI_INT, rank - 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			token++;
			MPI_Send(&token, 1, MPI_INT, (rank + 1) % size, 7, MPI_COMM_WORLD);
		}
		printf("rank=%d size=%d host=%s sum=%d token=%d\n", rank, size, host, sum, rank == 0 ? token : 0);
	}
	fflush(stdout);
	if (getenv_int("MPI_APP_HOLD", 0))
		hold(rank);
	if (getenv_int("MPI_APP_EXIT_RANK", -1) == rank)
		exit_code = getenv_int("MPI_APP_EXIT_CODE", 0);
	MPI_Finalize();
	return exit_code;
}
