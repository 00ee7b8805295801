// Rung 10: decoding. One to sixteen new query rows per sequence against a long KV cache: the
// shape of attention in a serving system, where rungs 05–09's kernels leave most SMs idle (one
// Q block per (sequence, head)) and read each K/V row once per query head. This rung:
//   - packs the query rows of a GQA group (G = H / Hkv heads × Nq rows) into one tile, so each K/V
//     row is read once per KV head;
//   - splits each sequence's keys into `splits` contiguous pieces, each worked on by its own
//     thread block, and merges the pieces' outputs by their log-sum-exps (rung 02's merge, now
//     across blocks): Flash-Decoding;
//   - reads K and V either from a contiguous cache or through a page table (a paged KV cache, as
//     vLLM and FlashInfer keep one), with a length per sequence.
//
// The CPU twin (`twin_decode`), the layouts, the split rule and the IO model live here and in
// decoding.cpp; the GPU kernels, one version a file (v1_split_kv.cu, v2_paged.cu), share
// decode.cuh and register themselves in `kernels()`. Its problem is not an AttentionShape (every
// sequence has its own length), so this rung registers no `Rung`: the ladder, the tests and the C
// ABI (fl_decode, fl_decode_host) reach it through `decode` and `twin_decode`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io_model.hpp"
#include "problem.hpp"

namespace fl::decoding {

inline constexpr int64_t kBlockKeys = 64;  // keys a block of the split pass takes at a time
inline constexpr int64_t kMaxSeqQ = 16;    // new rows per sequence (speculative or chunked decoding)
inline constexpr int kMaxSplits = 256;     // pieces a sequence's keys are cut into, at most
inline constexpr int64_t kMinPieceKeys = 512;  // choose_splits makes no piece shorter

// The problem. Q, O: [B, H, Nq, d]; lse: [B, H, Nq] fp32, natural log. The KV cache, either
//   contiguous: K, V [B, Hkv, capacity, d]; sequence b's keys are rows 0 .. len_b − 1 of its head;
//   paged:      K, V [num_pages, Hkv, page_size, d] (a pool of pages; FlashInfer's "HND" order)
//               and a page table [B, pages_per_seq] of int32 page ids: key j of sequence b is row
//               j % page_size of page table[b][j / page_size]. capacity = pages_per_seq · page_size.
// Lengths: kv_len [B] int32, 0 ≤ len_b ≤ capacity; a sequence of length 0 gets O = 0, lse = −∞.
// Causal: the Nq new rows are the last Nq of the sequence: row i sees keys ≤ i + len_b − Nq
// (bottom-right aligned, as in every rung), and a row that sees no key gets O = 0, lse = −∞.
struct DecodeShape {
  int64_t batch = 1;          // B sequences
  int64_t heads = 1;          // H query heads
  int64_t kv_heads = 1;       // Hkv; H must be a multiple of it
  int64_t seq_q = 1;          // Nq, 1 .. kMaxSeqQ
  int64_t head_dim = 128;     // d
  int64_t capacity = 1;       // contiguous: key slots per (sequence, KV head); paged: pages_per_seq · page_size
  int64_t page_size = 0;      // 0: contiguous; else keys per page, a multiple of 16
  int64_t num_pages = 0;      // paged: pages in the pool
  int64_t pages_per_seq = 0;  // paged: page-table entries per sequence
  bool causal = false;
  double scale = 0.0;  // 0 means 1/√d

  // Throws InputError (before any work) for sizes out of range, H % Hkv ≠ 0, Nq outside 1..16,
  // a page size that is not a positive multiple of 16, or a capacity that does not match the pages.
  void validate() const;
  bool paged() const { return page_size > 0; }
  int64_t group() const { return heads / kv_heads; }  // query heads per KV head
  int64_t rows() const { return group() * seq_q; }    // query rows packed per (sequence, KV head)
  float softmax_scale() const;
  int64_t q_row0(int64_t b, int64_t h) const { return (b * heads + h) * seq_q; }  // in [B·H·Nq] rows
  // Keys every split starts on a multiple of: whole blocks of kBlockKeys and, paged, whole pages.
  int64_t granule() const;
  std::string str() const;  // "B=16 H=32 Hkv=8 Nq=1 d=128 capacity=32768 page=16 causal=0"
};

// Pointers of one call, host memory for the twin (device memory for the kernels to come).
struct DecodeArgs {
  const void* q = nullptr;               // [B, H, Nq, d]
  const void* k = nullptr;               // contiguous [B, Hkv, capacity, d] or paged [num_pages, Hkv, page_size, d]
  const void* v = nullptr;               // the same as k
  const int32_t* page_table = nullptr;   // paged: [B, pages_per_seq]; contiguous: null
  const int32_t* kv_len = nullptr;       // [B]
  void* o = nullptr;                     // [B, H, Nq, d]
  float* lse = nullptr;                  // [B, H, Nq]
  void* workspace = nullptr;             // workspace_bytes(shape, splits): the pieces' outputs
  int splits = 0;                        // 0: choose_splits for sm_count SMs; else 1 .. kMaxSplits
  int sm_count = 132;                    // the SMs choose_splits fills (the twin has none: an H100's)
  IoCounter* io = nullptr;               // the twin's bytes moved, when not null
  void* stream = nullptr;                // the kernels: the cudaStream_t to queue on (null: default)
};

// How many pieces to cut every sequence's keys into: as many as keep the split pass's blocks
// (B · Hkv · ⌈R / 16⌉ · splits) at or under one per SM of the GPU's `sm_count` (two on a paged
// cache), but no piece of the longest sequence shorter than kMinPieceKeys (nor than one granule),
// and at most kMaxSplits. 1 when B · Hkv · ⌈R / 16⌉ blocks already fill the GPU. Measured on an
// H100 (appendix 10): on a contiguous cache one block an SM streams as fast as two, a second
// partial wave of blocks costs up to a sixth more, and pieces under about 512 keys spend more on
// their start and the merge than they save; pages read from scattered places need the second
// block's bytes in flight.
int choose_splits(const DecodeShape& s, int64_t max_len, int sm_count);

// Keys in each piece of a sequence of `len` keys cut into `splits`: ⌈len / splits⌉ rounded up to
// the granule, so that pieces start on block and page boundaries; the last pieces may be short or
// empty. Pieces that start at or past len hold nothing and are not computed.
int64_t piece_keys(const DecodeShape& s, int64_t len, int splits);
int64_t active_pieces(const DecodeShape& s, int64_t len, int splits);  // ⌈len / piece_keys⌉, 0 if len = 0

// Device memory the pieces' outputs need: for splits > 1, an fp32 output row and an fp32
// log-sum-exp per (sequence, KV head, piece, packed row); nothing for splits = 1, where the one
// piece writes O and lse itself. The workspace may hold anything before a call (every value the
// merge reads, a piece wrote first) and must not be shared by two calls in flight at once.
std::size_t workspace_bytes(const DecodeShape& s, int splits);

// The bytes the algorithm moves, by closed form (docs/10_decoding.md): per (sequence, KV head), Q's
// packed rows read once, each of the sequence's keys and values read once (not once per query
// head), the page-table entries of its pages read once; O and lse written once; with splits > 1,
// each active piece's outputs written and read back by the merge.
IoModel io_model(const DecodeShape& s, DType t, const std::vector<int32_t>& kv_len, int splits);

// The CPU twin: the same pieces, the same packed rows, the same pages, the same roundings as the
// kernels (P rounded to the dtype before P·V), every array behind the IO counter. fp16 and bf16.
// Throws InputError for a bad shape, a null pointer, a length past the capacity or a page id
// outside the pool, before any work.
void twin_decode(const DecodeShape& s, DType t, const DecodeArgs& a);

// A contiguous cache (s: page_size 0; k, v [B, Hkv, capacity, d]) copied into the paged layout:
// the pages of every sequence scattered over a pool in an order drawn from `seed`, `spare` pages
// no sequence owns among them, and every slot no key was copied to (spare pages, the end of a
// last page) holding `fill`. The tests and the ladder give a kernel the same keys both ways.
struct PagedCopy {
  DecodeShape shape;            // paged: pages_per_seq = ⌈capacity / page_size⌉, num_pages
  std::vector<float> k, v;      // [num_pages, Hkv, page_size, d]
  std::vector<int32_t> table;   // [B, pages_per_seq]
};
PagedCopy to_paged(const DecodeShape& s, const std::vector<float>& k, const std::vector<float>& v, int64_t page_size,
                   uint64_t seed, int64_t spare, float fill);

// ---- The GPU kernels ---------------------------------------------------------------------------

// One version of the rung's kernel: what a version file registers at program start.
struct Kernel {
  std::string name;  // "10_decoding/v1_split_kv"
  std::string idea;  // one line
  bool paged;        // reads a paged cache too (else contiguous only)
  // Launches the split pass (and, for splits > 1, the merge) for a checked call; a.splits ≥ 1.
  void (*launch)(const DecodeShape& s, DType t, const DecodeArgs& a);
};
void register_kernel(const Kernel& k);
const std::vector<Kernel>& kernels();              // by name: the chapter's order; empty without CUDA
const Kernel& find_kernel(const std::string& name);  // throws InputError listing the names

// Checks a call and queues kernel `k` on a.stream (device pointers): the shape, the dtype, head
// dims 64 and 128, null and misaligned pointers, a paged cache for a kernel without pages, the
// number of pieces and the workspace, all before any launch. a.splits = 0 picks choose_splits for
// a.sm_count SMs with the longest sequence taken as the capacity (the lengths are on the device).
// Lengths and page ids are not checked (they are on the device); out-of-range ones are the
// caller's bug, as in every paged-attention library.
void decode(const Kernel& k, const DecodeShape& s, DType t, const DecodeArgs& a, std::size_t workspace_bytes);

// The ceiling a decoding kernel is measured against: reads `bytes` (a multiple of 16, 16-byte
// aligned) at `data` once, in 16-byte loads over the whole GPU, and XORs a checksum of them into
// sink[0]'s bits (so no load can be dropped). Queued on `stream`. Throws without CUDA.
void stream_read(const void* data, std::size_t bytes, float* sink, void* stream);

}  // namespace fl::decoding
