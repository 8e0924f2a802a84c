/* The MPI library's own collectives timed from C: the floor under every Python figure
 * (hpccoll/bench/floor.py builds this with the MPI's compiler wrapper and runs it).
 *
 *     mpiexec -n N floor LEVEL ITERS WARMUP COLL:COUNT:DTYPE:OP:ROOT ...
 *
 * LEVEL: MPI's thread level, single or multiple.  mpi4py asks for multiple (hpccoll needs
 * it), and some MPIs take a lock in every call then (the MPICH wheel: about 3 us for an
 * 8 B allreduce at 2 ranks, against 1 us after MPI_Init), so the floor is timed both ways.
 *
 * Timed as hpccoll/timing.py times Python calls, so that the columns compare: every call
 * starts after a barrier, its time is the slowest rank's, the median of ITERS is printed
 * (rank 0: "COLL COUNT DTYPE OP ROOT MEDIAN_US").  The input changes before every call
 * (data-varying: nothing may be cached between iterations).  COUNT is the public
 * contract's n: the elements of allreduce, reduce and broadcast, one rank's block of
 * allgather, reduce_scatter, alltoall, gather and scatter.
 *
 * Written in C because it is the C call that is timed: no twin of anything in Python. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static MPI_Datatype dtype_of(const char *name, size_t *size) {
    static const struct { const char *name; MPI_Datatype type; size_t size; } table[] = {
        {"int8", MPI_INT8_T, 1}, {"uint8", MPI_UINT8_T, 1}, {"int32", MPI_INT32_T, 4},
        {"int64", MPI_INT64_T, 8}, {"float32", MPI_FLOAT, 4}, {"float64", MPI_DOUBLE, 8}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(name, table[i].name)) { *size = table[i].size; return table[i].type; }
    return MPI_DATATYPE_NULL;
}

static MPI_Op op_of(const char *name) {
    if (!strcmp(name, "sum")) return MPI_SUM;
    if (!strcmp(name, "prod")) return MPI_PROD;
    if (!strcmp(name, "min")) return MPI_MIN;
    if (!strcmp(name, "max")) return MPI_MAX;
    return MPI_OP_NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int one(MPI_Comm comm, const char *coll, char *send, char *recv, int n,
               MPI_Datatype t, MPI_Op op, int root) {
    if (!strcmp(coll, "allreduce")) return MPI_Allreduce(send, recv, n, t, op, comm);
    if (!strcmp(coll, "reduce")) return MPI_Reduce(send, recv, n, t, op, root, comm);
    if (!strcmp(coll, "broadcast")) return MPI_Bcast(send, n, t, root, comm);
    if (!strcmp(coll, "allgather")) return MPI_Allgather(send, n, t, recv, n, t, comm);
    if (!strcmp(coll, "reduce_scatter"))
        return MPI_Reduce_scatter_block(send, recv, n, t, op, comm);
    if (!strcmp(coll, "alltoall")) return MPI_Alltoall(send, n, t, recv, n, t, comm);
    if (!strcmp(coll, "gather")) return MPI_Gather(send, n, t, recv, n, t, root, comm);
    if (!strcmp(coll, "scatter")) return MPI_Scatter(send, n, t, recv, n, t, root, comm);
    if (!strcmp(coll, "barrier")) return MPI_Barrier(comm);
    return MPI_ERR_OTHER;
}

/* ones of the dtype: buffers of real values, every page touched before timing (calloc's
 * zero pages are shared until written) */
static void fill_ones(char *buf, size_t n, const char *dtype) {
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(dtype, "float32")) ((float *)buf)[i] = 1.0f;
        else if (!strcmp(dtype, "float64")) ((double *)buf)[i] = 1.0;
        else if (!strcmp(dtype, "int32")) ((int *)buf)[i] = 1;
        else if (!strcmp(dtype, "int64")) ((long long *)buf)[i] = 1;
        else buf[i] = 1;
    }
}

int main(int argc, char **argv) {
    int provided, multiple = argc > 1 && !strcmp(argv[1], "multiple");
    MPI_Init_thread(&argc, &argv, multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE,
                    &provided);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 4) {
        if (!rank)
            fprintf(stderr, "usage: floor single|multiple ITERS WARMUP COLL:COUNT:DTYPE:OP:ROOT ...\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int iters = atoi(argv[2]), warmup = atoi(argv[3]);
    double *local = malloc(sizeof(double) * iters), *worst = malloc(sizeof(double) * iters);
    for (int a = 4; a < argc; a++) {
        char coll[32], dname[16], oname[16];
        long count;
        int root;
        if (sscanf(argv[a], "%31[a-z_]:%ld:%15[a-z0-9]:%15[a-z]:%d", coll, &count, dname,
                   oname, &root) != 5) {
            if (!rank) fprintf(stderr, "floor: cannot read %s\n", argv[a]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        size_t isz;
        MPI_Datatype t = dtype_of(dname, &isz);
        MPI_Op op = op_of(oname);
        if (t == MPI_DATATYPE_NULL || op == MPI_OP_NULL || count < 0 || count > (1L << 30)) {
            if (!rank) fprintf(stderr, "floor: unsupported %s\n", argv[a]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        /* room for size blocks on both sides covers every collective */
        size_t n = (size_t)(count ? count : 1) * (size_t)size, bytes = n * isz;
        size_t padded = (bytes + 63) / 64 * 64;
        char *send = aligned_alloc(64, padded), *recv = aligned_alloc(64, padded);
        fill_ones(send, n, dname);
        fill_ones(recv, n, dname);
        for (int it = 0; it < warmup + iters; it++) {
            send[0] = (char)(it + rank);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (one(MPI_COMM_WORLD, coll, send, recv, (int)count, t, op, root) != MPI_SUCCESS)
                MPI_Abort(MPI_COMM_WORLD, 3);
            double dt = MPI_Wtime() - t0;
            if (it >= warmup) local[it - warmup] = dt;
        }
        MPI_Reduce(local, worst, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (!rank) {
            qsort(worst, iters, sizeof(double), cmp);
            double med = iters % 2 ? worst[iters / 2]
                                   : 0.5 * (worst[iters / 2 - 1] + worst[iters / 2]);
            printf("%s %ld %s %s %d %.4f\n", coll, count, dname, oname, root, med * 1e6);
            fflush(stdout);
        }
        free(send);
        free(recv);
    }
    free(local);
    free(worst);
    MPI_Finalize();
    return 0;
}
