/* mpi-allreduce-bench: MPI_Allreduce (float32 sum) timed like braid-bench (nccl-tests method),
 * so tools/bench/compare.py can put Open MPI next to braid.
 *
 *   mpirun -np 2 --mca pml ob1 --mca btl self,vader mpi-allreduce-bench \
 *       -b 4 -e 64M -f 4 -n 20 -w 5 -c 1 --json out.json
 *
 * Buffers are allocated and touched once for the largest size. For each size (a 4-byte
 * latency row is always included): `warmup` untimed calls, MPI_Barrier, `iters` timed calls;
 * a rank's time is its mean per call (its median too), the reported time the max over ranks.
 * Out of place and in place (MPI_IN_PLACE). With -c 1 the inputs hold small integers, so the
 * sum is exact, and one more call is checked element by element.
 * algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests).
 */
#include <errno.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  uint64_t min_bytes, max_bytes, factor;
  int iters, warmup, check;
  const char* json_path;
} Options;

typedef struct {
  uint64_t bytes;
  size_t count;
  int inplace;
  double time_us, time_us_median, time_us_max, algbw_gbps, busbw_gbps;
  long long wrong; /* -1: not checked */
} Row;

static int ParseSize(const char* text, uint64_t* out) {
  char* end = NULL;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || end == text) return -1;
  uint64_t mult = 1;
  switch (*end) {
    case 'k':
    case 'K':
      mult = 1ull << 10;
      ++end;
      break;
    case 'm':
    case 'M':
      mult = 1ull << 20;
      ++end;
      break;
    case 'g':
    case 'G':
      mult = 1ull << 30;
      ++end;
      break;
    default: break;
  }
  if (*end == 'i' || *end == 'I') ++end;
  if (*end == 'b' || *end == 'B') ++end;
  if (*end != '\0') return -1;
  *out = (uint64_t)v * mult;
  return 0;
}

static void Usage(const char* argv0) {
  fprintf(stderr,
          "usage: %s [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1] "
          "[--json PATH]\n  sizes in bytes with K/M/G suffixes (powers of 1024); a 4-byte row is "
          "always included\n",
          argv0);
}

static int ParseArgs(int argc, char** argv, Options* o) {
  o->min_bytes = 4;
  o->max_bytes = 64ull << 20;
  o->factor = 4;
  o->iters = 20;
  o->warmup = 5;
  o->check = 1;
  o->json_path = NULL;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return 1;
    if (v == NULL) return -1;
    ++i;
    if (strcmp(a, "-b") == 0) {
      if (ParseSize(v, &o->min_bytes)) return -1;
    } else if (strcmp(a, "-e") == 0) {
      if (ParseSize(v, &o->max_bytes)) return -1;
    } else if (strcmp(a, "-f") == 0) {
      if (ParseSize(v, &o->factor)) return -1;
    } else if (strcmp(a, "-n") == 0) {
      o->iters = atoi(v);
    } else if (strcmp(a, "-w") == 0) {
      o->warmup = atoi(v);
    } else if (strcmp(a, "-c") == 0) {
      o->check = atoi(v);
    } else if (strcmp(a, "--json") == 0) {
      o->json_path = v;
    } else {
      return -1;
    }
  }
  if (o->min_bytes == 0 || o->max_bytes < o->min_bytes || o->iters < 1 || o->warmup < 0) return -1;
  if (o->min_bytes < o->max_bytes && o->factor < 2) return -1;
  return 0;
}

static int CompareDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double Median(double* v, int n) {
  qsort(v, (size_t)n, sizeof(double), CompareDouble);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The sum pattern of tools/bench/bench_check.h: small integers, exact in float32. */
static float Pattern(int rank, size_t i) {
  return (float)((int)((i * 7 + (size_t)rank * 13 + 3) % 17) - 8);
}

static void Measure(const Options* o, float* send, float* recv, size_t count, int inplace, int rank,
                    int size, double* iter_us, Row* row) {
  void* sbuf = inplace ? MPI_IN_PLACE : (void*)send;
  if (o->check) {
    for (size_t i = 0; i < count; ++i) (inplace ? recv : send)[i] = Pattern(rank, i);
  }
  for (int i = 0; i < o->warmup; ++i) {
    MPI_Allreduce(sbuf, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  double start = MPI_Wtime(), t = start;
  for (int i = 0; i < o->iters; ++i) {
    MPI_Allreduce(sbuf, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double now = MPI_Wtime();
    iter_us[i] = (now - t) * 1e6;
    t = now;
  }
  /* Median() sorts iter_us, so the slowest iteration is last afterwards. */
  double times[3] = {(t - start) * 1e6 / o->iters, Median(iter_us, o->iters), 0};
  times[2] = iter_us[o->iters - 1];
  double wrong = 0;
  if (o->check) {
    for (size_t i = 0; i < count; ++i) (inplace ? recv : send)[i] = Pattern(rank, i);
    if (!inplace) memset(recv, 0xff, count * sizeof(float));
    MPI_Allreduce(sbuf, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < size; ++r) want += Pattern(r, i);
      if (memcmp(&want, &recv[i], sizeof(float)) != 0) wrong += 1;
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, times, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  row->bytes = (uint64_t)count * sizeof(float);
  row->count = count;
  row->inplace = inplace;
  row->time_us = times[0];
  row->time_us_median = times[1];
  row->time_us_max = times[2];
  row->algbw_gbps = times[0] > 0 ? (double)row->bytes / (times[0] * 1e-6) / 1e9 : 0;
  row->busbw_gbps = size > 1 ? row->algbw_gbps * 2.0 * (size - 1) / size : 0;
  row->wrong = o->check ? (long long)wrong : -1;
}

static void PrintCells(const Row* r) {
  printf("  %10.2f  %7.3f  %7.3f", r->time_us, r->algbw_gbps, r->busbw_gbps);
  if (r->wrong >= 0) {
    printf("  %6lld", r->wrong);
  } else {
    printf("  %6s", "N/A");
  }
}

static const char* EnvOr(const char* name, const char* fallback) {
  const char* v = getenv(name);
  return v ? v : fallback;
}

static int WriteJson(const char* path, const Row* rows, int nrows, int size, const Options* o) {
  FILE* f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "mpi-allreduce-bench: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  for (int i = 0; i < len; ++i) {
    if (version[i] == '\n' || version[i] == '"' || version[i] == '\\') version[i] = ' ';
  }
  while (len > 0 && version[len - 1] == ' ') version[--len] = '\0';
  fprintf(f, "{\n \"impl\": \"openmpi\",\n \"collective\": \"allreduce\",\n \"ranks\": %d,\n",
          size);
  fprintf(f, " \"iters\": %d,\n \"warmup\": %d,\n", o->iters, o->warmup);
  fprintf(f, " \"transports\": \"pml=%s btl=%s\",\n", EnvOr("OMPI_MCA_pml", "(default)"),
          EnvOr("OMPI_MCA_btl", "(default)"));
  fprintf(f, " \"library\": \"%s\",\n \"ok\": true,\n \"rows\": [", version);
  for (int i = 0; i < nrows; ++i) {
    const Row* r = &rows[i];
    fprintf(f,
            "%s\n  {\"impl\": \"openmpi\", \"collective\": \"allreduce\", \"ranks\": %d, "
            "\"bytes\": %llu, \"count\": %zu, \"dtype\": \"float32\", \"op\": \"sum\", "
            "\"inplace\": %s, \"time_us\": %.6g, \"time_us_median\": %.6g, \"time_us_max\": %.6g, "
            "\"algbw_gbps\": %.6g, \"busbw_gbps\": %.6g, \"wrong\": ",
            i ? "," : "", size, (unsigned long long)r->bytes, r->count,
            r->inplace ? "true" : "false", r->time_us, r->time_us_median, r->time_us_max,
            r->algbw_gbps, r->busbw_gbps);
    if (r->wrong >= 0) {
      fprintf(f, "%lld}", r->wrong);
    } else {
      fprintf(f, "null}");
    }
  }
  fprintf(f, "\n ]\n}\n");
  return fclose(f) == 0 ? 0 : -1;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Options o;
  int parsed = ParseArgs(argc, argv, &o);
  if (parsed != 0) {
    if (rank == 0) Usage(argv[0]);
    MPI_Finalize();
    return parsed > 0 ? 0 : 2;
  }

  /* Sizes: a 4-byte latency row, then MIN, MIN*FACTOR, ... <= MAX. */
  uint64_t sizes[128];
  int nsizes = 0;
  if (o.min_bytes > 4) sizes[nsizes++] = 4;
  for (uint64_t s = o.min_bytes; s <= o.max_bytes && nsizes < 127; s *= o.factor) {
    sizes[nsizes++] = s;
    if (o.min_bytes == o.max_bytes || s > o.max_bytes / o.factor) break;
  }
  size_t max_count = (size_t)(sizes[nsizes - 1] / sizeof(float));
  if (max_count == 0) max_count = 1;
  float* send = aligned_alloc(4096, ((max_count * sizeof(float) + 4095) / 4096) * 4096);
  float* recv = aligned_alloc(4096, ((max_count * sizeof(float) + 4095) / 4096) * 4096);
  double* iter_us = malloc(sizeof(double) * (size_t)o.iters);
  Row* rows = calloc((size_t)nsizes * 2, sizeof(Row));
  if (!send || !recv || !iter_us || !rows) {
    fprintf(stderr, "mpi-allreduce-bench: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  memset(send, 0, max_count * sizeof(float));
  memset(recv, 0, max_count * sizeof(float));

  if (rank == 0) {
    printf(
        "# mpi-allreduce-bench: %d ranks, float32 sum, %d iterations after %d warm-up, "
        "check %d\n# pml=%s btl=%s\n#\n",
        size, o.iters, o.warmup, o.check, EnvOr("OMPI_MCA_pml", "(default)"),
        EnvOr("OMPI_MCA_btl", "(default)"));
    printf("# %10s  %11s  %8s  %7s  %38s  %38s\n", "", "", "", "", "out-of-place", "in-place");
    printf("# %10s  %11s  %8s  %7s  %10s  %7s  %7s  %6s  %10s  %7s  %7s  %6s\n", "size", "count",
           "type", "redop", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf("# %10s  %11s  %8s  %7s  %10s  %7s  %7s  %6s  %10s  %7s  %7s  %6s\n", "(B)",
           "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    fflush(stdout);
  }
  int nrows = 0;
  long long total_wrong = 0;
  for (int s = 0; s < nsizes; ++s) {
    size_t count = (size_t)(sizes[s] / sizeof(float));
    if (count == 0) count = 1;
    Measure(&o, send, recv, count, 0, rank, size, iter_us, &rows[nrows]);
    Measure(&o, send, recv, count, 1, rank, size, iter_us, &rows[nrows + 1]);
    if (rank == 0) {
      printf("  %10llu  %11zu  %8s  %7s", (unsigned long long)rows[nrows].bytes, count, "float32",
             "sum");
      PrintCells(&rows[nrows]);
      PrintCells(&rows[nrows + 1]);
      printf("\n");
      fflush(stdout);
    }
    for (int k = 0; k < 2; ++k)
      total_wrong += rows[nrows + k].wrong > 0 ? rows[nrows + k].wrong : 0;
    nrows += 2;
  }
  int rc = total_wrong > 0 ? 1 : 0;
  if (rank == 0) {
    double busbw = 0;
    for (int i = 0; i < nrows; ++i) busbw += rows[i].busbw_gbps;
    if (o.check) printf("# Out of bounds values : %lld %s\n", total_wrong, rc ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %.4f\n#\n", nrows ? busbw / nrows : 0.0);
    fflush(stdout);
    if (o.json_path && WriteJson(o.json_path, rows, nrows, size, &o) != 0) rc = 2;
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  free(send);
  free(recv);
  free(iter_us);
  free(rows);
  MPI_Finalize();
  return rc;
}
