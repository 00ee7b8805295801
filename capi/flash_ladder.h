/* Flash Ladder's C ABI: every rung of the ladder, callable from C, Python (ctypes), or anything
 * else that can call a C function. One header, one shared library (libflash_ladder.so).
 *
 * Why C and not C++: a C function with plain-old-data arguments has one calling convention on a
 * platform, so ctypes, Julia, Rust or a PyTorch extension can call it without knowing our C++
 * compiler, our standard library or our exceptions. Nothing C++ crosses this boundary: every
 * failure becomes an fl_status plus a message in fl_last_error().
 *
 * Tensors are dense and contiguous, row-major, in these layouts (the rung contract, problem.hpp):
 *   q    [B, H,   Nq, d]     query heads
 *   k, v [B, Hkv, Nk, d]     key/value heads; query head h reads kv head h / (H / Hkv)
 *   o    [B, H,   Nq, d]     output, same dtype as q
 *   lse  [B, H,   Nq]        always fp32: log Σ_j exp(S_ij), natural log; −inf for a row that sees
 *                            no key (its o row is 0, never NaN)
 * Element type of q, k, v, o (and dout, dq, dk, dv) is the call's fl_dtype.
 *
 * Causal masking is bottom-right aligned: query i sees key j when j <= i + (Nk − Nq).
 *
 * Two ways to run a rung:
 *   fl_forward       its CUDA kernel, on DEVICE pointers, launched on the stream you give;
 *   fl_forward_host  its CPU twin, on HOST pointers (no GPU needed; slow, for study and tests).
 *
 * Thread safety: every function may be called from any thread. fl_last_error() is per thread.
 */
#ifndef FLASH_LADDER_H
#define FLASH_LADDER_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
/* CMake defines flash_ladder_EXPORTS while it builds the library itself. */
#ifdef flash_ladder_EXPORTS
#define FL_API __declspec(dllexport)
#else
#define FL_API __declspec(dllimport)
#endif
#else
#define FL_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct or a signature below changes, so a binding written against an older
 * header (compare_torch.py mirrors fl_shape and fl_decode_shape in ctypes) can refuse to run
 * instead of misreading. */
#define FL_ABI_VERSION 5  /* 2: fl_decode_shape and the decoding entry points (rung 10);
                              3: fl_decode (rung 10's kernels), their list, fl_stream_read;
                              4: fl_ring_shape and the ring's entry points (rung 11);
                              5: fl_ring_rank, kept across calls, with the backward (rung 11) */

/* One attention problem. Sizes are int64_t so Python ints pass unchanged. */
typedef struct fl_shape {
  int64_t batch;     /* B  >= 1 */
  int64_t heads;     /* H  >= 1, query heads, a multiple of kv_heads */
  int64_t kv_heads;  /* Hkv >= 1; Hkv < H is grouped-query attention */
  int64_t seq_q;     /* Nq >= 1, any value, not only multiples of a block size */
  int64_t seq_k;     /* Nk >= 1 */
  int64_t head_dim;  /* d, each rung states the ones it runs */
  int causal;        /* 0 or 1 (any non-zero is 1) */
  double scale;      /* softmax scale; 0 means the default 1/sqrt(d); otherwise finite and > 0 */
} fl_shape;

typedef enum fl_dtype {
  FL_FP32 = 0,  /* float */
  FL_FP16 = 1,  /* IEEE half, 16-bit storage */
  FL_BF16 = 2   /* bfloat16, 16-bit storage */
} fl_dtype;

typedef enum fl_status {
  FL_OK = 0,
  FL_ERR_INVALID = 1,        /* bad shape, null pointer, dtype / head dim / mask the rung does not
                                run, too small a workspace, host pointer given to fl_forward */
  FL_ERR_NOT_FOUND = 2,      /* no rung of that name on that backend in this build */
  FL_ERR_OUT_OF_MEMORY = 3,  /* the problem does not fit in free device or host memory */
  FL_ERR_CUDA = 4,           /* a CUDA call failed, or no usable GPU */
  FL_ERR_INTERNAL = 5        /* anything else: a bug, please report it with fl_last_error() */
} fl_status;

/* Bytes a CPU twin moved between its "device memory" arrays and its on-chip blocks (the IO model),
 * and the closed form the rung's algorithm predicts for the same problem: of the forward pass from
 * fl_forward_host, of the backward pass from fl_backward_host (the rung's modelled backward IO,
 * Rung::modelled_backward_io). Where a rung gives a closed form, the counted bytes equal it; a rung
 * that gives none for its backward leaves the modelled fields NaN. */
typedef struct fl_io {
  uint64_t read_bytes;        /* counted by the twin */
  uint64_t written_bytes;
  double modelled_read_bytes; /* the rung's formula */
  double modelled_written_bytes;
} fl_io;

/* ---- The library --------------------------------------------------------------------------- */

FL_API int fl_abi_version(void);       /* FL_ABI_VERSION of the library actually loaded */
FL_API const char* fl_version(void);   /* "0.1" */
/* One line saying how the library was built: version, CUDA or not, GPU architectures. */
FL_API const char* fl_build_info(void);
/* 1 when this build has GPU rungs and a CUDA device can run them; otherwise 0, and
 * fl_last_error() says why (no CUDA at build time, no device, too old a device). */
FL_API int fl_cuda_available(void);
/* The message of the last call on this thread that failed; "" after a call that succeeded.
 * The pointer stays valid until the next fl_ call on this thread. */
FL_API const char* fl_last_error(void);
FL_API const char* fl_status_name(fl_status s); /* "FL_ERR_INVALID", ... */

/* ---- Listing the rungs ----------------------------------------------------------------------
 * One entry per (rung, backend): "00_naive_eigen" appears twice in a CUDA build, once as "cpu"
 * (its twin) and once as "cuda" (its kernel). Ordered by name, the CPU twin first.
 * Out-of-range i returns NULL. Strings live as long as the library is loaded. */
FL_API int fl_rung_count(void);
FL_API const char* fl_rung_name(int i);     /* "00_naive_eigen", "06_tensor_core_mma/v3_pipeline" */
FL_API const char* fl_rung_backend(int i);  /* "cpu" or "cuda" */
FL_API const char* fl_rung_idea(int i);     /* one line: what the rung teaches */
FL_API int fl_rung_has_backward(int i);     /* 1 if it implements fl_backward */
/* 1 if its fl_backward_ex runs FL_BACKWARD_DETERMINISTIC (a GPU rung whose mode it is; every CPU
 * twin with a backward is deterministic as it is) */
FL_API int fl_rung_has_deterministic_backward(int i);

/* 1 if rung `rung` on `backend` ("cpu" or "cuda") runs this shape and dtype; otherwise 0 and
 * fl_last_error() names what it refused and what it supports. */
FL_API int fl_rung_supports(const char* rung, const char* backend, const fl_shape* shape,
                            fl_dtype dtype);

/* ---- Forward ----------------------------------------------------------------------------------
 * Workspace: extra memory a rung needs where it runs (rung 00 stores S and P there: 2·B·H·Nq·Nk
 * fp32). Ask for the size, allocate it where the rung runs (device memory for "cuda"), pass it in.
 * The library never allocates device memory behind your back, so a caching allocator (PyTorch's)
 * stays in charge of the GPU's memory. */
FL_API fl_status fl_forward_workspace_bytes(const char* rung, const char* backend,
                                            const fl_shape* shape, fl_dtype dtype,
                                            size_t* bytes /* out */);

/* Runs the CUDA kernel of `rung`. q, k, v, o, lse and workspace are DEVICE pointers (or managed /
 * pinned memory the device can read). cuda_stream is a cudaStream_t; NULL is the default stream.
 * Asynchronous like a kernel launch: it returns once the work is queued on the stream. An error
 * inside a kernel surfaces at the next synchronization (cudaStreamSynchronize,
 * torch.cuda.synchronize) or at the next fl_ call that touches the GPU. Every buffer, the
 * workspace too, must stay allocated until the stream has finished the work.
 * Everything is checked before any work: on any status but FL_OK, nothing was launched.
 * workspace may be NULL when the rung needs none; workspace_bytes smaller than needed is refused
 * with a message naming the bytes needed. */
FL_API fl_status fl_forward(const char* rung, const fl_shape* shape, fl_dtype dtype,
                            const void* q, const void* k, const void* v, void* o, float* lse,
                            void* workspace, size_t workspace_bytes, void* cuda_stream);

/* Runs the CPU twin of `rung` on HOST pointers and returns when it is done. workspace may be NULL:
 * then the library allocates the host workspace itself. io, if not NULL, receives the bytes the
 * twin moved and the rung's modelled bytes. */
FL_API fl_status fl_forward_host(const char* rung, const fl_shape* shape, fl_dtype dtype,
                                 const void* q, const void* k, const void* v, void* o, float* lse,
                                 void* workspace, size_t workspace_bytes, fl_io* io);

/* ---- Backward (rungs whose fl_rung_has_backward is 1) -------------------------------------------
 * From q, k, v, o, lse of the forward and dout = ∂loss/∂o, computes dq [B, H, Nq, d] and
 * dk, dv [B, Hkv, Nk, d] (summed over the query heads of each group). Same rules as the forward:
 * device pointers and a stream for fl_backward, host pointers for fl_backward_host. */
FL_API fl_status fl_backward_workspace_bytes(const char* rung, const char* backend,
                                             const fl_shape* shape, fl_dtype dtype,
                                             size_t* bytes /* out */);
FL_API fl_status fl_backward(const char* rung, const fl_shape* shape, fl_dtype dtype,
                             const void* q, const void* k, const void* v, const void* o,
                             const float* lse, const void* dout, void* dq, void* dk, void* dv,
                             void* workspace, size_t workspace_bytes, void* cuda_stream);
/* fl_backward with flags (0 is fl_backward itself):
 *   FL_BACKWARD_DETERMINISTIC  the same dq, dk, dv bits on every run of the same inputs: the
 *                              contributions to each element are added in a fixed order. Only rungs
 *                              whose fl_rung_has_deterministic_backward is 1 run it; others refuse
 *                              with FL_ERR_INVALID (an unknown flag bit too). */
#define FL_BACKWARD_DETERMINISTIC 1u
FL_API fl_status fl_backward_ex(const char* rung, const fl_shape* shape, fl_dtype dtype,
                                const void* q, const void* k, const void* v, const void* o,
                                const float* lse, const void* dout, void* dq, void* dk, void* dv,
                                void* workspace, size_t workspace_bytes, unsigned flags,
                                void* cuda_stream);
/* io, if not NULL, receives the bytes the twin's backward moved and the rung's modelled backward
 * bytes (NaN where the rung has no closed form for its backward). */
FL_API fl_status fl_backward_host(const char* rung, const fl_shape* shape, fl_dtype dtype,
                                  const void* q, const void* k, const void* v, const void* o,
                                  const float* lse, const void* dout, void* dq, void* dk, void* dv,
                                  void* workspace, size_t workspace_bytes, fl_io* io);

/* ---- Decoding (rung 10) --------------------------------------------------------------------------
 * One to sixteen new query rows per sequence against a KV cache, every sequence with its own
 * length (docs/10_decoding.md). Layouts:
 *   q, o        [B, H, Nq, d]          the new rows; o in q's dtype
 *   lse         [B, H, Nq]             fp32; −inf (and an o row of 0) for a row that sees no key
 *   kv_len      [B] int32              keys of each sequence, 0 <= kv_len[b] <= capacity
 *   contiguous cache (page_size = 0):
 *     k, v      [B, Hkv, capacity, d]  sequence b's keys are rows 0 .. kv_len[b] − 1 of its head
 *   paged cache (page_size > 0, a multiple of 16):
 *     k, v      [num_pages, Hkv, page_size, d]   a pool of pages
 *     page_table [B, pages_per_seq] int32        key j of sequence b is row j % page_size of page
 *                                                page_table[b][j / page_size]; capacity must be
 *                                                pages_per_seq * page_size
 * Causal: the new rows are the last Nq of the sequence; row i sees keys j <= i + kv_len[b] − Nq.
 * `splits`: how many pieces each sequence's keys are cut into (1..256), or 0 to let the library
 * choose (fl_decode_choose_splits for the GPU it would run on). With splits > 1 the pieces'
 * outputs need a workspace of fl_decode_workspace_bytes. fl_decode runs a kernel of the rung (one
 * per version, fl_decode_version_name), fl_decode_host the CPU twin. */
typedef struct fl_decode_shape {
  int64_t batch;          /* B sequences >= 1 */
  int64_t heads;          /* H query heads, a multiple of kv_heads */
  int64_t kv_heads;       /* Hkv >= 1 */
  int64_t seq_q;          /* Nq new rows per sequence, 1..16 */
  int64_t head_dim;       /* d */
  int64_t capacity;       /* key slots per (sequence, kv head) */
  int64_t page_size;      /* 0: contiguous cache; else keys per page, a multiple of 16 */
  int64_t num_pages;      /* paged: pages in the pool */
  int64_t pages_per_seq;  /* paged: page-table entries per sequence */
  int causal;             /* 0 or 1 */
  double scale;           /* 0: 1/sqrt(d) */
} fl_decode_shape;

/* The number of pieces splits = 0 picks for a GPU of sm_count SMs and a longest sequence of
 * max_len keys; -1 (and fl_last_error) for a bad shape. */
FL_API int fl_decode_choose_splits(const fl_decode_shape* shape, int64_t max_len, int sm_count);
FL_API fl_status fl_decode_workspace_bytes(const fl_decode_shape* shape, int splits, size_t* bytes /* out */);
/* The CPU twin on HOST pointers. splits = 0 chooses for an H100's 132 SMs. workspace may be NULL:
 * the library then allocates it. io, if not NULL, receives the bytes the twin moved and the closed
 * form's. */
FL_API fl_status fl_decode_host(const fl_decode_shape* shape, fl_dtype dtype, const void* q, const void* k,
                                const void* v, const int32_t* page_table, const int32_t* kv_len, void* o,
                                float* lse, int splits, void* workspace, size_t workspace_bytes, fl_io* io);

/* Rung 10's kernels, one per version: "10_decoding/v1_split_kv", ... in the order the chapter
 * builds them. Out-of-range i returns NULL. The idea is one line. A CPU-only build lists none. */
FL_API int fl_decode_version_count(void);
FL_API const char* fl_decode_version_name(int i);
FL_API const char* fl_decode_version_idea(int i);

/* Runs kernel `version` (a name from fl_decode_version_name) on DEVICE pointers, queued on
 * cuda_stream (NULL: the default stream), asynchronous like fl_forward. kv_len and page_table are
 * device arrays too. splits = 0 chooses for the current CUDA device's SM count with the longest
 * sequence taken as `capacity` (the kernel cannot read kv_len before it runs): the workspace must
 * then be fl_decode_workspace_bytes of fl_decode_choose_splits(shape, capacity, that SM count);
 * simpler to choose the splits yourself and pass them. Refusals are FL_ERR_INVALID (a name not in
 * the list: FL_ERR_NOT_FOUND; no GPU: FL_ERR_CUDA). A version that has no paged path refuses page_size > 0. Lengths
 * and page ids are not checked on the host (they live on the device): a length past the capacity
 * or a page id outside the pool is the caller's bug, as it is in every paged-attention library. */
FL_API fl_status fl_decode(const char* version, const fl_decode_shape* shape, fl_dtype dtype, const void* q,
                           const void* k, const void* v, const int32_t* page_table, const int32_t* kv_len, void* o,
                           float* lse, int splits, void* workspace, size_t workspace_bytes, void* cuda_stream);

/* The ceiling a memory-bound kernel is measured against: reads `bytes` of device memory at `data`
 * (16-byte aligned, bytes a multiple of 16) once, in 16-byte loads spread over the whole GPU, and
 * XORs a checksum of what it read into the bits of sink[0] (a device float) so that no load is
 * optimised away (its value means nothing).
 * Queued on cuda_stream. Time it to get the read bandwidth this GPU reaches today. */
FL_API fl_status fl_stream_read(const void* data, size_t bytes, float* sink, void* cuda_stream);

/* ---- Ring attention (rung 11) --------------------------------------------------------------------
 * One sequence split over P GPUs, one process (or thread) per GPU (docs/11_ring_attention.md): each
 * rank holds N / P rows of Q, K and V; the K/V shards travel around the ring over NCCL while each
 * rank attends to the one it holds, and the partial outputs merge by their log-sum-exps. The
 * sequence is cut into chunks of equal length: P of them (contiguous: rank r holds chunk r) or 2P
 * (zigzag: rank r holds chunks r and 2P − 1 − r, which evens out the causal mask's work).
 * fl_ring_chunks says which a rank holds. A rank's shards keep its chunks in that order:
 *   q, o   [B, H, N / P, d]      k, v   [B, Hkv, N / P, d]      lse   [B, H, N / P] fp32
 * On GPUs: fl_ring_forward (the forward, set up on every call) and fl_ring_open (a rank kept across
 * calls, forward and backward); fl_ring_forward_host is the CPU twin (all P ranks in one process)
 * on the whole problem. Self-attention only: Nq = Nk = N. */
typedef struct fl_ring_shape {
  int64_t batch;     /* B >= 1 */
  int64_t heads;     /* H query heads, a multiple of kv_heads */
  int64_t kv_heads;  /* Hkv >= 1 */
  int64_t seq;       /* N of the WHOLE sequence: a multiple of ranks (contiguous) or 2 * ranks (zigzag) */
  int64_t head_dim;  /* d */
  int causal;        /* 0 or 1 */
  double scale;      /* 0: 1/sqrt(d) */
  int64_t ranks;     /* P >= 1 */
  int zigzag;        /* 0: contiguous chunks, 1: zigzag */
} fl_ring_shape;

/* The chunks rank `rank` holds, in the order of its local rows, into chunks[0..1]; returns how many
 * (1 contiguous, 2 zigzag), or -1 (and fl_last_error) for a bad shape or rank. */
FL_API int fl_ring_chunks(const fl_ring_shape* shape, int64_t rank, int64_t chunks[2]);
/* The CPU twin on HOST pointers of the WHOLE problem (q, o [B, H, N, d], k, v [B, Hkv, N, d],
 * lse [B, H, N]): what the P ranks compute, assembled. fp32, fp16 or bf16; d = 64 or 128. */
FL_API fl_status fl_ring_forward_host(const fl_ring_shape* shape, fl_dtype dtype, const void* q, const void* k,
                                      const void* v, void* o, float* lse);

/* 1 when this build has NCCL (the ring across GPUs); otherwise 0, and fl_last_error() says so. */
FL_API int fl_ring_nccl_available(void);
/* A communicator for a caller without one (under torchrun, pass your process group's ncclComm_t to
 * fl_ring_forward instead). One rank calls fl_ring_unique_id and sends its FL_RING_ID_BYTES bytes to
 * every rank; each rank, with its own GPU current, calls fl_ring_comm_init with them, the ring's size
 * and its rank (it blocks until all ranks have); fl_ring_comm_destroy frees it. Without NCCL in the
 * build: FL_ERR_NOT_FOUND. */
#define FL_RING_ID_BYTES 128
FL_API fl_status fl_ring_unique_id(void* id /* FL_RING_ID_BYTES, out */);
FL_API fl_status fl_ring_comm_init(const void* id, int ranks, int rank, void** comm /* out */);
FL_API fl_status fl_ring_comm_destroy(void* comm);
/* This rank's forward: its shards in DEVICE memory (layouts above), nccl_comm an ncclComm_t of
 * shape->ranks ranks, queued on cuda_stream (NULL: the default stream); returns when the rank's work
 * is done. Every rank calls it with the same shape and dtype (fp16 or bf16; d = 64 or 128): the
 * ranks first agree over the communicator, and a rank given another shape, a bad argument (any but
 * the communicator itself: a NULL one returns at once) or a communicator of another size makes
 * every rank return FL_ERR_INVALID, none hangs; a rank that could not get its memory says so the
 * same way (FL_ERR_INVALID, the message naming it). A CUDA error in the middle of the ring is
 * returned by the rank it happened on (FL_ERR_CUDA) once the ring is done, the others returning
 * FL_OK: a caller that loops over calls should stop every rank when one fails. */
FL_API fl_status fl_ring_forward(const fl_ring_shape* shape, fl_dtype dtype, const void* q, const void* k,
                                 const void* v, void* o, float* lse, void* nccl_comm, void* cuda_stream);

/* One rank of the ring kept from one call to the next (rung 11's newest version, v5_backward): every
 * rank opens it once with the same shape, dtype and a communicator of shape->ranks ranks, each on its
 * own GPU; the ranks check and agree then, as fl_ring_forward does on every call (a rank given
 * another shape, a bad argument or a communicator of another size makes every rank's open return
 * FL_ERR_INVALID, none hangs), and each takes its device memory, which calls after that reuse. Its
 * calls take this rank's shards in DEVICE memory (layouts above) and return when its work is done;
 * every rank makes the same calls in the same order. A rank whose call has a NULL array still
 * passes the shards on, and every rank's call then returns FL_ERR_INVALID. A NULL rank returns at
 * once (the others would wait for it: a caller's bug, like a NULL communicator). Close every rank
 * before its communicator is destroyed. */
typedef struct fl_ring_rank fl_ring_rank;
FL_API fl_status fl_ring_open(const fl_ring_shape* shape, fl_dtype dtype, void* nccl_comm, void* cuda_stream,
                              fl_ring_rank** rank /* out */);
FL_API fl_status fl_ring_rank_forward(fl_ring_rank* rank, const void* q, const void* k, const void* v, void* o,
                                      float* lse);
/* dQ, dK, dV of this rank's rows (dK, dV summed over each group of query heads) from its shards of Q, K,
 * V, the forward's O and lse (as fl_ring_rank_forward returned them) and dO; layouts above, dq like q,
 * dk and dv like k. */
FL_API fl_status fl_ring_rank_backward(fl_ring_rank* rank, const void* q, const void* k, const void* v, const void* o,
                                       const float* lse, const void* dout, void* dq, void* dk, void* dv);
FL_API fl_status fl_ring_close(fl_ring_rank* rank);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FLASH_LADDER_H */
