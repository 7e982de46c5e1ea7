/* braid C API: a stable C ABI over braid::Runtime.
 *
 * Plain C99; usable from C, C++, and any language with a C FFI. Every function is
 * thread-safe unless its docstring says otherwise.
 *
 * ABI rules (frozen):
 *   - Enumerator values never change; new ones are only appended.
 *   - Functions are never removed or changed; new behaviour arrives as new functions or as
 *     new fields at the END of an options struct.
 *   - Options structs start with `size_t struct_size`, which the caller sets to the
 *     sizeof() it was compiled against (the *_OPTS_INIT macros and *_opts_init() functions
 *     do this). The library reads only the fields that lie entirely inside struct_size and
 *     uses the defaults for the rest, so a program built against an older header keeps
 *     working. A struct_size larger than the library knows is accepted when the unknown tail
 *     is all zero bytes (the defaults), and rejected with BRAID_INVALID_ARGUMENT otherwise
 *     (the rule Linux's openat2/clone3 use), so a new option is never silently ignored;
 *     hence every field added later must have all-zero bytes as its default. A struct_size
 *     below sizeof(size_t) or above 4096 (an uninitialised struct) is INVALID_ARGUMENT.
 *
 * Errors: every function returning `int` returns a braid_error code (BRAID_OK = 0 on
 * success). On failure, braid_last_error() returns a message for the calling thread naming
 * the tensor, the ranks involved and what to do.
 *
 * Typical use:
 *
 *   if (braid_init() != BRAID_OK) { fprintf(stderr, "%s\n", braid_last_error()); ... }
 *   braid_allreduce_opts o = BRAID_ALLREDUCE_OPTS_INIT;
 *   o.op = BRAID_SUM;
 *   int64_t shape[1] = {n};
 *   braid_allreduce("grad.0", in, out, shape, 1, BRAID_FLOAT32, &o);
 *   braid_finalize();
 */
#ifndef BRAID_C_API_H_
#define BRAID_C_API_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define BRAID_C_EXPORT __attribute__((visibility("default")))
#else
#define BRAID_C_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------ */
/* Errors                                                                               */
/* ------------------------------------------------------------------------------------ */

/* Error codes. The values are the canonical Abseil / gRPC status codes. Codes outside
 * this list are reported as BRAID_UNKNOWN, with the original code's name at the start of
 * the message. */
typedef enum braid_error {
  BRAID_OK = 0,
  BRAID_CANCELLED = 1,            /* braid was shut down (braid_finalize, job ended) */
  BRAID_UNKNOWN = 2,              /* anything not listed here */
  BRAID_INVALID_ARGUMENT = 3,     /* bad input, or a mismatch across ranks */
  BRAID_DEADLINE_EXCEEDED = 4,    /* a wait's timeout passed, or a collective stalled */
  BRAID_ALREADY_EXISTS = 6,       /* a collective with this name is in flight on this rank;
                                     a process set with these ranks exists */
  BRAID_FAILED_PRECONDITION = 9,  /* not initialized, or already shut down; a device this
                                     library cannot use (see device_type) */
  BRAID_INTERNAL = 13,            /* a bug in braid or its transports */
  BRAID_UNAVAILABLE = 14          /* a peer rank or the coordinator was lost */
} braid_error;

/* The message of the last call that failed on the calling thread ("" if none has).
 * Never NULL. The pointer stays valid until the next failing call on this thread; a
 * successful call does not clear it. */
BRAID_C_EXPORT const char* braid_last_error(void);

/* The enumerator's name without the prefix ("OK", "INVALID_ARGUMENT", ...), or "UNKNOWN"
 * for a value that is not a braid_error. Never NULL; a static string. */
BRAID_C_EXPORT const char* braid_error_name(int code);

/* ------------------------------------------------------------------------------------ */
/* Element types and reduction operators (values shared with the C++ core and the wire) */
/* ------------------------------------------------------------------------------------ */

typedef enum braid_dtype {
  BRAID_FLOAT32 = 0,
  BRAID_FLOAT64 = 1,
  BRAID_FLOAT16 = 2,   /* IEEE 754 binary16, passed as uint16_t bit patterns */
  BRAID_BFLOAT16 = 3,  /* the upper 16 bits of a float32, passed as uint16_t */
  BRAID_INT32 = 4,
  BRAID_INT64 = 5,
  BRAID_UINT8 = 6
} braid_dtype;

typedef enum braid_reduce_op {
  BRAID_SUM = 0,
  BRAID_AVERAGE = 1, /* sum / the number of ranks taking part (the world's, or the process
                        set's); floating-point dtypes only */
  BRAID_MIN = 2,
  BRAID_MAX = 3,
  BRAID_PRODUCT = 4
} braid_reduce_op;

/* Where a collective's buffers are (the options' device_type). */
typedef enum braid_device_type {
  BRAID_DEVICE_CPU = 0,  /* host memory */
  BRAID_DEVICE_CUDA = 1  /* an NVIDIA GPU's memory; device_id picks the GPU */
} braid_device_type;

/* Size of one element of `dtype` in bytes; 0 if `dtype` is not a braid_dtype. */
BRAID_C_EXPORT size_t braid_dtype_size(int dtype);

/* ------------------------------------------------------------------------------------ */
/* Lifecycle and topology                                                               */
/* ------------------------------------------------------------------------------------ */

/* Joins the job, configured from the environment (BRAID_COORDINATOR, BRAID_RANK,
 * BRAID_SIZE, torchrun / Slurm / Open MPI variables, BRAID_TIMEOUT_S, ...; docs/configuration.md
 * lists them).
 * Blocks until every rank has joined (at most about max(BRAID_TIMEOUT_S, 60 s)).
 * With no launcher variables at all, starts a world of size 1 with a private coordinator.
 * Returns BRAID_OK if already initialized.
 * Errors: INVALID_ARGUMENT (a malformed variable, named in the message),
 * DEADLINE_EXCEEDED / UNAVAILABLE (coordinator or peers unreachable). */
BRAID_C_EXPORT int braid_init(void);

/* Leaves the job: every pending collective completes with BRAID_CANCELLED. Returns within
 * about 2 s even when peers are gone. BRAID_OK if not initialized. braid_init() may be
 * called again afterwards to join a new job. Call it before the process exits. */
BRAID_C_EXPORT int braid_finalize(void);

/* 1 between a successful braid_init() and braid_finalize(), else 0. */
BRAID_C_EXPORT int braid_is_initialized(void);

/* This process's rank in [0, size), the world size, the rank among processes on this
 * host, and the number of processes on this host, written to *out.
 * Errors: FAILED_PRECONDITION (not initialized), INVALID_ARGUMENT (out is NULL). */
BRAID_C_EXPORT int braid_rank(int* out);
BRAID_C_EXPORT int braid_size(int* out);
BRAID_C_EXPORT int braid_local_rank(int* out);
BRAID_C_EXPORT int braid_local_size(int* out);

/* Starts recording this rank's timeline (a Chrome-trace JSON file; docs/configuration.md: BRAID_TIMELINE) while
 * the job runs, as Horovod's start_timeline: rank 0 writes `path`, rank r writes
 * `path`.rank<r>, rotated beyond BRAID_TIMELINE_MAX_BYTES. A timeline already recording
 * (BRAID_TIMELINE or an earlier call) is closed first, as valid JSON.
 * Errors: INVALID_ARGUMENT (path NULL, empty or not writable), FAILED_PRECONDITION (not
 * initialized). */
BRAID_C_EXPORT int braid_start_timeline(const char* path);
/* Stops recording and closes the file (valid JSON). BRAID_OK when none is recording.
 * Errors: FAILED_PRECONDITION (not initialized). */
BRAID_C_EXPORT int braid_stop_timeline(void);

/* ------------------------------------------------------------------------------------ */
/* Options                                                                              */
/* ------------------------------------------------------------------------------------ */

/* A NULL options pointer means "all defaults". */

typedef struct braid_allreduce_opts {
  size_t struct_size;       /* sizeof(braid_allreduce_opts) as compiled by the caller */
  braid_reduce_op op;       /* default BRAID_AVERAGE (as in Horovod); integer dtypes need
                               another op */
  const char* compression;  /* NULL or "" = BRAID_COMPRESSION (default "none"), which applies
                               to floating-point sum/average all-reduces only; else a spec:
                               "none", "fp16", "bf16", "fp4", "int4", "powersgd",
                               "scalecomp", "topk", "randomk", with options such as
                               "fp4:chunk=128,ef=1", "powersgd:rank=2" or
                               "scalecomp:ratio=100" (docs/compression.md); or a plan, a
                               JSON object of name patterns to specs matched against the
                               tensor's name, such as {"*.bias": "none", "*": "fp4"}
                               (docs/compression.md, compression per layer). Unknown method
                               or option, or a method on an integer tensor / other op:
                               BRAID_INVALID_ARGUMENT. Copied at enqueue time. */
  int32_t process_set_id;   /* the process set that runs it: 0 = the whole world (default),
                               else an id from braid_add_process_set (see "Process sets") */
  /* Where the buffers are (fields added after the first release of this header, so a caller
     built against it passes a smaller struct_size and gets host memory; all zero by default:
     host memory). A device other than the CPU must be one this libbraid_c can use, else
     BRAID_FAILED_PRECONDITION naming why (not built with CUDA; CUDA not yet verified on a
     GPU; no GPU data plane yet: docs/gpu.md); an unknown device_type or a negative id (or a
     CPU id other than 0) is BRAID_INVALID_ARGUMENT. Every rank uses the same device type for
     a tensor (else BRAID_INVALID_ARGUMENT on every rank); the id is this rank's own (rank r
     on GPU r is usual). */
  void* stream;            /* the caller's stream on the device (a cudaStream_t); braid's work
                              waits for what was queued on it before the call. NULL: the
                              device's default stream */
  int32_t device_type;     /* a braid_device_type; default BRAID_DEVICE_CPU */
  int32_t device_id;       /* which device of the type (0 for the CPU) */
} braid_allreduce_opts;

#define BRAID_ALLREDUCE_OPTS_INIT \
  { sizeof(braid_allreduce_opts), BRAID_AVERAGE, NULL, 0, NULL, BRAID_DEVICE_CPU, 0 }

typedef struct braid_broadcast_opts {
  size_t struct_size;      /* sizeof(braid_broadcast_opts) as compiled by the caller */
  int32_t root_rank;       /* the rank whose buffer is sent, a rank of the job (in the
                              process set); default 0 */
  int32_t process_set_id;  /* 0 = the whole world (default), else an id from
                              braid_add_process_set (see "Process sets") */
  void* stream;            /* where the buffers are: as in braid_allreduce_opts */
  int32_t device_type;
  int32_t device_id;
} braid_broadcast_opts;

#define BRAID_BROADCAST_OPTS_INIT \
  { sizeof(braid_broadcast_opts), 0, 0, NULL, BRAID_DEVICE_CPU, 0 }

typedef struct braid_allgather_opts {
  size_t struct_size;      /* sizeof(braid_allgather_opts) as compiled by the caller */
  int32_t process_set_id;  /* 0 = the whole world (default), else an id from
                              braid_add_process_set (see "Process sets") */
  void* stream;            /* where the buffers are: as in braid_allreduce_opts */
  int32_t device_type;
  int32_t device_id;
} braid_allgather_opts;

#define BRAID_ALLGATHER_OPTS_INIT \
  { sizeof(braid_allgather_opts), 0, NULL, BRAID_DEVICE_CPU, 0 }

/* Fill *opts with the defaults (same as the *_OPTS_INIT macros). NULL is ignored. */
BRAID_C_EXPORT void braid_allreduce_opts_init(braid_allreduce_opts* opts);
BRAID_C_EXPORT void braid_broadcast_opts_init(braid_broadcast_opts* opts);
BRAID_C_EXPORT void braid_allgather_opts_init(braid_allgather_opts* opts);

/* ------------------------------------------------------------------------------------ */
/* Collectives                                                                          */
/* ------------------------------------------------------------------------------------ */
/*
 * Common rules:
 *   - Buffers are host memory (unless the options' device_type says otherwise), contiguous,
 *     row-major. `shape` has `ndim` entries (element
 *     counts, each >= 0); ndim = 0 is a scalar (shape may then be NULL). The shape array is
 *     copied at the call; data buffers are not.
 *   - Every rank must make the same collective with the same name, dtype and (except for
 *     all-gather's first dimension) shape; a mismatch fails the collective on every rank
 *     with BRAID_INVALID_ARGUMENT naming the ranks. Ranks may issue collectives in any
 *     order; braid agrees on one. "Every rank" is every rank of the options' process set
 *     (the whole world by default; see "Process sets").
 *   - `name` identifies the collective across ranks and must be unique among this rank's
 *     in-flight collectives of its process set (BRAID_ALREADY_EXISTS otherwise); it may be
 *     reused once the previous one completed, and by other process sets at any time. It is
 *     copied at the call.
 *   - Blocking calls accept name = NULL and then generate "<collective>.noname.<n>" from a
 *     counter of this process per collective and process set (a set's counters restart at
 *     0 when braid_add_process_set adds it). Such names agree across ranks only when every
 *     rank makes the same unnamed calls in the same order (from one thread); name your
 *     collectives when that does not hold. Async calls require a name.
 *   - Errors returned by the call itself (no collective started): FAILED_PRECONDITION (not
 *     initialized), INVALID_ARGUMENT (checked locally: NULL pointer, bad dtype / op / shape,
 *     bad options; a process_set_id that names no process set, or one this rank is not in:
 *     the message names the set), ALREADY_EXISTS. Errors agreed across ranks (mismatches,
 *     lost peers = UNAVAILABLE, no progress for BRAID_TIMEOUT_S = DEADLINE_EXCEEDED,
 *     braid_finalize = CANCELLED) are returned by the blocking call or by braid_wait().
 *   - A blocking call waits until the collective completes; it is bounded by the job's own
 *     failure detection (BRAID_TIMEOUT_S, BRAID_HEARTBEAT_TIMEOUT_S), not by a deadline of
 *     its own. Use the async form with braid_wait() for a caller-chosen timeout.
 *   - For async calls the input and output buffers must stay valid, and the input
 *     unmodified, until the collective completes (even when its handle was freed early).
 */

/* Opaque handle of one asynchronous collective. */
typedef struct braid_handle braid_handle;

/* All-reduce: out = op over all ranks of `input`. `input` and `output` hold
 * product(shape) elements of `dtype`; output may equal input (in place).
 * opts: NULL = op AVERAGE, default compression, world. */
BRAID_C_EXPORT int braid_allreduce(const char* name, const void* input, void* output,
                                   const int64_t* shape, int ndim, braid_dtype dtype,
                                   const braid_allreduce_opts* opts);
BRAID_C_EXPORT int braid_allreduce_async(const char* name, const void* input, void* output,
                                         const int64_t* shape, int ndim, braid_dtype dtype,
                                         const braid_allreduce_opts* opts,
                                         braid_handle** handle);

/* Broadcast, in place: `buffer` (product(shape) elements of `dtype`) on every rank
 * receives the root rank's buffer. opts: NULL = root rank 0, world. */
BRAID_C_EXPORT int braid_broadcast(const char* name, void* buffer, const int64_t* shape,
                                   int ndim, braid_dtype dtype,
                                   const braid_broadcast_opts* opts);
BRAID_C_EXPORT int braid_broadcast_async(const char* name, void* buffer,
                                         const int64_t* shape, int ndim, braid_dtype dtype,
                                         const braid_broadcast_opts* opts,
                                         braid_handle** handle);

/* All-gather along dim 0: every rank contributes `input` of shape [d_r, rest...] (ndim >= 1;
 * d_r may differ between ranks, `rest` may not) and receives the concatenation in rank
 * order, shape [sum_r d_r, rest...], in `output`, which holds `output_capacity_bytes`
 * bytes. *output_first_dim (if not NULL) receives sum_r d_r when the collective completes.
 *
 * If the result does not fit, the call fails with BRAID_INVALID_ARGUMENT and the message
 * gives the bytes needed; *output_first_dim is still written. To size the output in
 * advance, all-gather the first dimensions first (a [1]-shaped BRAID_INT64 all-gather).
 *
 * Async form: `output` may be NULL (capacity 0); the result is then kept in the handle and
 * read with braid_handle_copy_output(). With a non-NULL output that is too small,
 * braid_wait() returns BRAID_INVALID_ARGUMENT (the result is kept in the handle too).
 * *output_first_dim is written by the braid_wait() that observes completion, so it must
 * stay valid until then. */
BRAID_C_EXPORT int braid_allgather(const char* name, const void* input, const int64_t* shape,
                                   int ndim, braid_dtype dtype, void* output,
                                   size_t output_capacity_bytes, int64_t* output_first_dim,
                                   const braid_allgather_opts* opts);
BRAID_C_EXPORT int braid_allgather_async(const char* name, const void* input,
                                         const int64_t* shape, int ndim, braid_dtype dtype,
                                         void* output, size_t output_capacity_bytes,
                                         int64_t* output_first_dim,
                                         const braid_allgather_opts* opts,
                                         braid_handle** handle);

/* Blocks until every rank of the world reached its barrier. Named "barrier" on every rank,
 * so barriers pair in the order the ranks call them, also after one failed on some ranks:
 * it is how the ranks resynchronize after an error (docs/failures.md: No error shifts a
 * step). */
BRAID_C_EXPORT int braid_barrier(void);

/* ------------------------------------------------------------------------------------ */
/* Process sets                                                                         */
/* ------------------------------------------------------------------------------------ */
/*
 * A process set is a subset of the job's ranks that runs collectives among itself, as
 * Horovod's process sets. Set 0 is the whole world and always exists; other sets are added
 * and removed while the job runs, at most 31 at once besides the world. Passing a set's id
 * as an options struct's process_set_id runs that collective in the set:
 *   - only the set's ranks make it; a rank outside the set, or an id that names no set,
 *     gets BRAID_INVALID_ARGUMENT from the call, naming the set;
 *   - names are per set: two sets may run collectives of the same name at once;
 *   - BRAID_AVERAGE divides by the set's size; a broadcast's root_rank is a rank of the job
 *     that is in the set; an all-gather's blocks come in the order of the set's ranks;
 *   - sets that share no rank never wait on each other.
 * braid_barrier() is always over the whole world. A set's rank of a member is its position
 * among the set's ranks in ascending order (braid_process_set_rank). Sets do not survive
 * braid_finalize(): a new job has only set 0.
 */

/* Adds a process set of the `count` ranks in `ranks` (ranks of the job, in any order,
 * without repeats; the array is copied) and writes its id to *process_set_id once every rank
 * agreed: the lowest id in [1, 31] not in use (ids of removed sets are reused).
 * A collective over the whole world: every rank calls it, the ranks outside the new set
 * too, with the same ranks, in the same order as every other braid_add_process_set and
 * braid_remove_process_set (the k-th change a rank asks for pairs with the others' k-th).
 * Blocks like the blocking collectives.
 * Errors: INVALID_ARGUMENT (checked locally: ranks or process_set_id NULL, count < 1 or
 * more than the world's size, a rank outside [0, size), a repeated rank; agreed across
 * ranks: a rank asked for another change at this point, on every rank, naming the ranks and
 * what each asked for), ALREADY_EXISTS (a set with exactly these ranks exists, the whole
 * world included; the message names its id), FAILED_PRECONDITION (not initialized; or 31
 * sets exist besides the world, on every rank, the message saying so), and the errors of a
 * collective (DEADLINE_EXCEEDED, UNAVAILABLE, CANCELLED).
 * *process_set_id is written on success only. */
BRAID_C_EXPORT int braid_add_process_set(const int32_t* ranks, int32_t count,
                                         int32_t* process_set_id);

/* Removes process set `process_set_id` once every rank agreed. A collective over the whole
 * world, in the same order as every other change (see braid_add_process_set). The set's
 * collectives still pending fail on its members with BRAID_FAILED_PRECONDITION naming the
 * set; later calls naming the id fail with INVALID_ARGUMENT ("does not exist") until a
 * later braid_add_process_set reuses it.
 * Errors: INVALID_ARGUMENT (id 0, the whole world; an id that names no set: on every rank;
 * a rank asked for another change at this point), FAILED_PRECONDITION (not initialized), and
 * the errors of a collective. */
BRAID_C_EXPORT int braid_remove_process_set(int32_t process_set_id);

/* The number of ranks in process set `process_set_id` (0: the world's size), written to
 * *size. Local: no other rank takes part.
 * Errors: INVALID_ARGUMENT (size NULL; no such set, named in the message),
 * FAILED_PRECONDITION (not initialized). */
BRAID_C_EXPORT int braid_process_set_size(int32_t process_set_id, int32_t* size);

/* This rank's rank in process set `process_set_id` (its position among the set's ranks in
 * ascending order, in [0, set size); set 0: braid_rank), or -1 when this rank is not in
 * the set, written to *rank. Local.
 * Errors: as braid_process_set_size (rank NULL). */
BRAID_C_EXPORT int braid_process_set_rank(int32_t process_set_id, int32_t* rank);

/* The ranks of the job in process set `process_set_id`, ascending: writes the set's size to
 * *count and its ranks to ranks[0 .. *count). Local.
 * Errors: INVALID_ARGUMENT (ranks or count NULL; no such set; capacity below the set's
 * size: the message gives the size, see braid_process_set_size), FAILED_PRECONDITION (not
 * initialized). Nothing is written on error. */
BRAID_C_EXPORT int braid_process_set_ranks(int32_t process_set_id, int32_t* ranks,
                                           int32_t capacity, int32_t* count);

/* ------------------------------------------------------------------------------------ */
/* Handles                                                                              */
/* ------------------------------------------------------------------------------------ */
/* A handle is owned by the caller and used by one thread at a time. */

/* Waits up to `timeout_seconds` (< 0: forever; 0: just check) for the collective and returns
 * its result: BRAID_OK, or its error (see above). Returns BRAID_DEADLINE_EXCEEDED if it is
 * still running when the timeout passes; the handle then stays valid and may be waited on
 * again (braid_poll() tells this case apart from a collective that itself failed with
 * DEADLINE_EXCEEDED). Once completed, every later call returns the same result.
 * Errors: INVALID_ARGUMENT (handle NULL, timeout NaN). */
BRAID_C_EXPORT int braid_wait(braid_handle* handle, double timeout_seconds);

/* Sets *done to 1 if the collective has completed (successfully or not; braid_wait() then
 * returns its result at once), else 0. Never blocks.
 * Errors: INVALID_ARGUMENT (handle or done NULL). */
BRAID_C_EXPORT int braid_poll(braid_handle* handle, int* done);

/* For an all-gather whose result the handle keeps (output NULL or too small): copies the
 * result's bytes to `output` (capacity `output_capacity_bytes`) and writes their count to
 * *needed_bytes (if not NULL). Errors: FAILED_PRECONDITION (not completed yet, failed, or
 * not an all-gather whose result the handle keeps), INVALID_ARGUMENT (handle NULL; output
 * NULL or too small while the result is not empty: *needed_bytes is still written). */
BRAID_C_EXPORT int braid_handle_copy_output(braid_handle* handle, void* output,
                                            size_t output_capacity_bytes,
                                            size_t* needed_bytes);

/* Frees the handle. Allowed while the collective is pending: the runtime keeps its own
 * reference, completes it, and the name becomes free again then. NULL is ignored. */
BRAID_C_EXPORT void braid_handle_free(braid_handle* handle);

/* ------------------------------------------------------------------------------------ */
/* Compression statistics                                                               */
/* ------------------------------------------------------------------------------------ */
/*
 * Byte counters of every all-reduce this rank ran since braid_init(), per compression method
 * or per (tensor, method). Counts are this rank's own (not summed over ranks; `braidctl
 * status` shows the sums), cumulative over steps, in bytes:
 *   uncompressed_bytes         the tensors' bytes in their own dtype, per reduction;
 *   payload_bytes              the compressed representation this rank contributed (what a
 *                              compression ratio divides: uncompressed / payload);
 *   transport_bytes            what this rank actually sent on the data plane for them;
 *   reference_transport_bytes  what a bandwidth-optimal all-reduce of the uncompressed
 *                              tensors sends per rank, 2(n-1)/n * uncompressed_bytes, the
 *                              yardstick transport_bytes compares against.
 * Uncompressed all-reduces count under method "none" with payload = uncompressed; warm-up
 * steps of a method (start_step) count under that method with payload = uncompressed.
 * BY_TENSOR covers the 4096 tensor names reduced most recently (a new name drops the least
 * recently reduced one); BY_METHOD counts every reduction, dropped names' included.
 */

typedef enum braid_compression_stats_kind {
  BRAID_COMPRESSION_STATS_BY_METHOD = 0, /* one entry per method, sorted by method */
  BRAID_COMPRESSION_STATS_BY_TENSOR = 1  /* one per (tensor, method), sorted by name, method */
} braid_compression_stats_kind;

/* One entry of braid_compression_stats(). An output struct: the library writes it. Its
 * struct_size follows the options structs' rule in reverse: the library writes only the
 * fields inside the caller's struct_size and zero-fills any tail it does not know, so
 * callers built against an older or newer header both work. Fields added later go at the
 * end. */
typedef struct braid_compression_stat {
  size_t struct_size;   /* sizeof(braid_compression_stat) as compiled by the caller */
  char method[64];      /* canonical spec ("none", "fp16", "fp4:ef=1"),
                           NUL-terminated; truncated (still terminated) if longer */
  char name[256];       /* BY_TENSOR: the tensor's name, NUL-terminated, truncated if
                           longer; BY_METHOD: "" */
  uint64_t tensors;     /* BY_METHOD: distinct tensor names reduced with it (a name that
                           BY_TENSOR dropped counts again if it returns); BY_TENSOR: 1 */
  uint64_t reductions;  /* all-reduces counted (one per tensor per step) */
  uint64_t uncompressed_bytes;
  uint64_t payload_bytes;
  uint64_t transport_bytes;
  uint64_t reference_transport_bytes;
} braid_compression_stat;

#define BRAID_COMPRESSION_STAT_INIT \
  { sizeof(braid_compression_stat), "", "", 0, 0, 0, 0, 0, 0 }

/* Fills *stat with zeros and sets its struct_size (same as the macro). NULL is ignored. */
BRAID_C_EXPORT void braid_compression_stat_init(braid_compression_stat* stat);

/* A snapshot of this rank's compression counters, `kind` = a braid_compression_stats_kind.
 * Writes the number of entries that exist to *count and the first min(capacity, *count)
 * of them to out[0..]. `out` is an array of braid_compression_stat whose stride is
 * out[0].struct_size (set it, e.g. with BRAID_COMPRESSION_STAT_INIT); the library sets every
 * written entry's struct_size to that value. capacity = 0 (out may then be NULL) just
 * counts. A capacity below *count is not an error: call again with a larger array (more
 * entries may exist by then if collectives ran meanwhile).
 * Errors: FAILED_PRECONDITION (not initialized), INVALID_ARGUMENT (count NULL, out NULL
 * with capacity > 0, unknown kind, out[0].struct_size below sizeof(size_t) or above 4096).
 * Nothing is written on error. */
BRAID_C_EXPORT int braid_compression_stats(int kind, braid_compression_stat* out,
                                           size_t capacity, size_t* count);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BRAID_C_API_H_ */
