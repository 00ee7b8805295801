/* The C example of docs/c_api.md: one forward pass of a CPU twin through the C API, from plain C.
 * Built as C99 and run by ctest (capi.c_example), so the header stays C and the example keeps
 * working. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "flash_ladder.h"

int main(void) {
  /* B=1, H=2 query heads sharing Hkv=1 key/value head, Nq=5, Nk=7, d=16, causal, scale 1/sqrt(d) */
  fl_shape s = {.batch = 1, .heads = 2, .kv_heads = 1, .seq_q = 5, .seq_k = 7, .head_dim = 16,
                .causal = 1, .scale = 0.0};
  float *q = malloc(sizeof(float) * 2 * 5 * 16), *o = malloc(sizeof(float) * 2 * 5 * 16);
  float *k = malloc(sizeof(float) * 7 * 16), *v = malloc(sizeof(float) * 7 * 16), lse[2 * 5];
  if (!q || !o || !k || !v) return 1;
  for (int i = 0; i < 2 * 5 * 16; ++i) q[i] = sinf((float)i);
  for (int i = 0; i < 7 * 16; ++i) {
    k[i] = cosf((float)i);
    v[i] = sinf(3.0f * (float)i);
  }

  fl_io io;
  fl_status st = fl_forward_host("02_online_softmax", &s, FL_FP32, q, k, v, o, lse, NULL, 0, &io);
  if (st != FL_OK) {
    fprintf(stderr, "%s: %s\n", fl_status_name(st), fl_last_error());
    return 1;
  }
  printf("lse[0] = %f, %llu bytes read (model: %.0f)\n", lse[0],
         (unsigned long long)io.read_bytes, io.modelled_read_bytes);
  free(q), free(k), free(v), free(o);
  return 0;
}
