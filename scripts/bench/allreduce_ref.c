/* The independent MPI reference of `ringrec bench allreduce`: in-place MPI_Allreduce as an
 * MPI user writes it, sharing no code with ringrec, timed by the same rules:
 *   sizes min..max bytes, times factor; per size: iterations = clamp(iters, 8 MiB / size
 *   (at most 1000), 2 GiB / size (at least 3)); untimed warm-up; a barrier; the mean time
 *   of the timed iterations; the slowest rank's mean (MPI_MAX); then a fresh allreduce of the
 *   input pattern checked element by element against the exact sum (#wrong over all ranks).
 * Input: rank r's element i is ((7i + 3r) mod 8) - 3, small integers, so every summation
 * order is exact. Prints one JSON object per size (the fields of ringrec's rows), e.g.
 *   mpicc -O2 -o allreduce_ref scripts/bench/allreduce_ref.c
 *   mpirun -np 2 ./allreduce_ref -b 8 -e 256M -d float > ref.jsonl
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t parse_size(const char *s) {
    char *end = NULL;
    size_t v = strtoull(s, &end, 10);
    switch (*end) {
    case 'k': case 'K': v <<= 10; break;
    case 'm': case 'M': v <<= 20; break;
    case 'g': case 'G': v <<= 30; break;
    default: break;
    }
    return v;
}

static double pattern(size_t i, int rank) { return (double)((i * 7 + (size_t)rank * 3) % 8) - 3.0; }

static size_t iterations(size_t iters, size_t size) {
    if (size == 0) size = 1;
    size_t small = (8ull << 20) / size;
    if (small > 1000) small = 1000;
    size_t large = (2ull << 30) / size;
    if (large < 3) large = 3;
    size_t n = iters > small ? iters : small;
    if (n > large) n = large;
    return n ? n : 1;
}

int main(int argc, char **argv) {
    size_t min_bytes = 8, max_bytes = 256u << 20, factor = 2, iters = 20, warmup = 3;
    const char *dtype = "float";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-b")) min_bytes = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-e")) max_bytes = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-f")) factor = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-n")) iters = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-w")) warmup = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-d")) dtype = argv[i + 1];
        else { fprintf(stderr, "usage: %s [-b min] [-e max] [-f factor] [-n iters] [-w warmup] [-d float|double]\n", argv[0]); return 2; }
    }
    int is_double = !strcmp(dtype, "double");
    if (!is_double && strcmp(dtype, "float")) { fprintf(stderr, "-d float or double\n"); return 2; }
    MPI_Datatype type = is_double ? MPI_DOUBLE : MPI_FLOAT;
    size_t esz = is_double ? 8 : 4;
    if (factor < 2) factor = 2;

    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    for (size_t s = min_bytes < esz ? esz : min_bytes; s <= max_bytes; s *= factor) {
        size_t size = s / esz * esz, count = size / esz;
        void *buf = malloc(size ? size : 1);
        if (!buf) { fprintf(stderr, "out of memory at %zu bytes\n", size); MPI_Abort(MPI_COMM_WORLD, 1); }
        for (size_t i = 0; i < count; i++) {
            if (is_double) ((double *)buf)[i] = pattern(i, rank);
            else ((float *)buf)[i] = (float)pattern(i, rank);
        }
        size_t it = iterations(iters, size);
        for (size_t w = 0; w < (warmup < it ? warmup : it); w++)
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, type, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (size_t k = 0; k < it; k++)
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, type, MPI_SUM, MPI_COMM_WORLD);
        double local = (MPI_Wtime() - t0) / (double)it, slowest = 0;
        MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        /* Validation on fresh input. */
        for (size_t i = 0; i < count; i++) {
            if (is_double) ((double *)buf)[i] = pattern(i, rank);
            else ((float *)buf)[i] = (float)pattern(i, rank);
        }
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, type, MPI_SUM, MPI_COMM_WORLD);
        unsigned long long wrong_here = 0, wrong = 0;
        for (size_t i = 0; i < count; i++) {
            double want = 0;
            for (int r = 0; r < n; r++) want += pattern(i, r);
            double got = is_double ? ((double *)buf)[i] : (double)((float *)buf)[i];
            wrong_here += got != want;
        }
        MPI_Allreduce(&wrong_here, &wrong, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        free(buf);
        if (rank == 0) {
            double algbw = (double)size / slowest / 1e9;
            double busbw = n > 1 ? algbw * 2.0 * (n - 1) / n : 0.0;
            printf("{\"backend\":\"mpi-c\",\"size\":%zu,\"count\":%zu,\"type\":\"%s\",\"redop\":\"sum\","
                   "\"time_us\":%.3f,\"algbw\":%.6f,\"busbw\":%.6f,\"wrong\":%llu}\n",
                   size, count, dtype, slowest * 1e6, algbw, busbw, wrong);
            fflush(stdout);
        }
        if (size == 0) break;
    }
    MPI_Finalize();
    return 0;
}
