/*
 * ompi_hello: the Open MPI singleton of the jobs profile (issue 35): the
 * test bed compiles it against Debian's Open MPI (libopenmpi-dev, unpacked,
 * never installed) into harness.JobsOpenMPIRoot as /usr/local/bin/ompi-hello,
 * and TestJobsOpenMPISingleton runs it as a job's COMMAND without mpirun.
 *
 * It prints one line "rank R of N" and exits 0 when MPI_Init and
 * MPI_Finalize succeed, 1 otherwise (Open MPI aborts by itself on most
 * failures, with its own non-zero status).
 */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
	int size, rank;

	if (MPI_Init(&argc, &argv) != MPI_SUCCESS)
		return 1;
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	printf("rank %d of %d\n", rank, size);
	fflush(stdout);
	return MPI_Finalize() == MPI_SUCCESS ? 0 : 1;
}
