/* Compiled as strict C99 (-std=c99 -Wpedantic -Werror): the public header must stay plain
 * C99, and its initialiser macros must be valid C. Never run; compiling is the test. */
#include "braid/c_api.h"

int braid_header_c99_check(void);

int braid_header_c99_check(void) {
  braid_allreduce_opts a = BRAID_ALLREDUCE_OPTS_INIT;
  braid_broadcast_opts b = BRAID_BROADCAST_OPTS_INIT;
  braid_allgather_opts g = BRAID_ALLGATHER_OPTS_INIT;
  braid_compression_stat st = BRAID_COMPRESSION_STAT_INIT;
  braid_compression_stats_kind k = BRAID_COMPRESSION_STATS_BY_TENSOR;
  braid_handle* h = NULL;
  braid_dtype d = BRAID_BFLOAT16;
  braid_reduce_op op = BRAID_PRODUCT;
  braid_error e = BRAID_UNAVAILABLE;
  (void)h;
  return (int)a.struct_size + (int)b.struct_size + (int)g.struct_size + (int)d + (int)op +
         (int)e + (int)st.struct_size + (int)k;
}
