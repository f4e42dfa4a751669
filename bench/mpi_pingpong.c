/*
 * MPI ping-pong between ranks 0 and 1, in the manner of the OSU and Intel MPI
 * PingPong benchmarks: for each message size, rank 0 sends and rank 1 sends
 * back, `iters` times after a warm-up; one-way latency is half the round
 * trip, bandwidth is size / one-way latency.
 *
 * usage: mpi_pingpong [max_bytes [scale]]
 * Each size runs `scale` times its default iterations, fewer if that would
 * take more than TIME_BUDGET seconds on this path.
 * prints: "bytes latency_us bandwidth_MBps" per size, from rank 0.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Most seconds one message size may take (after calibration). */
#define TIME_BUDGET 1.0

static void pingpong(int rank, char *buf, long size, int n) {
    for (int i = 0; i < n; i++) {
        if (rank == 0) {
            MPI_Send(buf, (int)size, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)size, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(buf, (int)size, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, (int)size, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
        }
    }
}

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
        /* Calibrate: a slow path gets fewer iterations, so a size never
           takes much more than TIME_BUDGET seconds. */
        MPI_Barrier(MPI_COMM_WORLD);
        double c0 = MPI_Wtime();
        pingpong(rank, buf, size, 3);
        double per = (MPI_Wtime() - c0) / 3;
        int fit = per > 0 ? (int)(TIME_BUDGET / per) : iters;
        if (fit < iters) iters = fit < 5 ? 5 : fit;
        if (warm > iters / 10 + 1) warm = iters / 10 + 1;
        MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
        MPI_Bcast(&warm, 1, MPI_INT, 0, MPI_COMM_WORLD);
        pingpong(rank, buf, size, warm);
        double t0 = MPI_Wtime();
        pingpong(rank, buf, size, iters);
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
