/*
 * MPI ping-pong between ranks 0 and 1, in the manner of the OSU and Intel MPI
 * PingPong benchmarks: for each message size, rank 0 sends and rank 1 sends
 * back, `iters` times after a warm-up; one-way latency is half the round
 * trip, bandwidth is size / one-way latency.
 *
 * usage: mpi_pingpong [max_bytes [scale]]
 * prints: "bytes latency_us bandwidth_MBps" per size, from rank 0.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int iterations(long size, double scale) {
    long it = (long)((size <= 4096 ? 2000 : (64L << 20) / size) * scale);
    if (it < 10) it = 10;
    if (it > 20000) it = 20000;
    return (int)it;
}

int main(int argc, char **argv) {
    int rank, n;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long max = argc > 1 ? atol(argv[1]) : 4L << 20;
    double scale = argc > 2 ? atof(argv[2]) : 1.0;
    if (n != 2) {
        if (rank == 0) fprintf(stderr, "mpi_pingpong: needs exactly 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char *buf = malloc(max > 0 ? max : 1);
    if (!buf) MPI_Abort(MPI_COMM_WORLD, 3);
    memset(buf, 0xa5, max > 0 ? max : 1);
    for (long size = 0; size <= max; size = size ? size * 4 : 1) {
        int iters = iterations(size, scale), warm = iters / 10 + 1;
        double t0 = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < warm + iters; i++) {
            if (i == warm) t0 = MPI_Wtime();
            if (rank == 0) {
                MPI_Send(buf, (int)size, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
                MPI_Recv(buf, (int)size, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(buf, (int)size, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(buf, (int)size, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
            }
        }
        double lat = (MPI_Wtime() - t0) / iters / 2 * 1e6;
        if (rank == 0) {
            printf("%ld %.3f %.3f\n", size, lat, lat > 0 ? size / lat : 0.0);
            fflush(stdout);
        }
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
