// The CUDA backend's kernels, compiled at run time by NVRTC (with --fmad=false: a product
// and a sum are contracted only where a kernel asks for it with __fmaf_rn).
//
// Batch invariance: every kernel computes a row (a token) the same way, in the same order,
// however many rows it is launched with. A row's logits are then the same bits in a decode
// step, a prefill chunk or a speculative verify block, so greedy speculation reproduces
// plain decoding token for token.

#define FULL_MASK 0xffffffffu
// NVRTC compiles without the host headers: no INFINITY, no size_t.
#define NEG_INF __int_as_float(0xff800000)
// Rows a matvec block computes per pass over its weight rows.
#define ROWS 8

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// The sum of `v` over the block (a multiple of 32 threads), in a fixed order; every thread
// gets it. `red` holds 32 floats of shared memory.
__device__ float block_sum(float v, float* red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_sum(lane < warps ? red[lane] : 0.0f);
}

__device__ float block_max(float v, float* red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_max(lane < warps ? red[lane] : NEG_INF);
}

// A forward pass's launches read what changes from one pass to the next from device
// memory, so one captured graph serves every pass of the same row count:
//   meta = [row0, pos0, token ids...]: row r's K/V go to cache row row0 + r and it is
//          rotated for position pos0 + r (the same for the trunk; an MTP head's cache may
//          start after position 0)
//   kv   = [K of layer 0, V of layer 0, K of layer 1, ...] (device addresses)

// Programmatic dependent launch (sm_90 and later): in a captured pass whose edges from one
// kernel to the next are programmatic (`cuda/graph.rs`), a kernel's blocks may start while
// the kernel before it is finishing. Every kernel first lets the next one start
// (GRID_LAUNCH_NEXT) and then waits (GRID_WAIT) for the one before it to have finished and
// its writes to be seen, before it reads or writes anything a kernel writes; only the
// weights, which no kernel writes, may be asked for before (matvec1_body). Outside such a
// pass, and before sm_90, both are nothing: the stream's order holds as it always did.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GRID_LAUNCH_NEXT() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#define GRID_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define GRID_LAUNCH_NEXT()
#define GRID_WAIT()
#endif
#define GRID_ORDER() \
    GRID_LAUNCH_NEXT(); \
    GRID_WAIT()

// ---- Weights in their file's own blocks ----
//
// A weight row is `in` values stored as the GGUF file stores them; `fmt` names the format
// (the codes of `WeightCode` in device.rs). Every format is read 32 values at a time (a
// "chunk": a Q4_0..Q8_0 block, a sub-block of a K-quant super-block, 32 dense values), and
// each value is dequantized as ggml's dequantize_row_* computes it.
#define FMT_F32 0
#define FMT_F16 1
#define FMT_BF16 2
#define FMT_Q4_0 3
#define FMT_Q4_1 4
#define FMT_Q5_0 5
#define FMT_Q5_1 6
#define FMT_Q8_0 7
#define FMT_Q4K 8
#define FMT_Q5K 9
#define FMT_Q6K 10

typedef unsigned char u8;

// An IEEE half's bits as a float (exact; PTX's conversion, so no header is needed).
__device__ __forceinline__ float half_bits(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Loads. A warp's loads are what a matvec is bound by, so every format is read in 32-bit
// words or wider (byte loads take one instruction a byte): 16-byte vectors where its blocks
// keep that alignment, else aligned words shifted into place. A weight part is uploaded
// with 16 bytes of padding after its last row (`DeviceMatrix::from_parts`), so the aligned
// word after a block's last byte is always inside the allocation.

// The N 32-bit little-endian words of the 4N bytes from p (p 2-byte aligned): N + 1
// aligned words, funnel-shifted into place.
template <int N>
__device__ __forceinline__ void words_at(const u8* p, unsigned* out) {
    unsigned long long at = reinterpret_cast<unsigned long long>(p);
    const unsigned* a = reinterpret_cast<const unsigned*>(at & ~3ull);
    unsigned shift = (unsigned)(at & 3ull) * 8u;
    unsigned raw[N + 1];
#pragma unroll
    for (int i = 0; i <= N; i++) raw[i] = a[i];
#pragma unroll
    for (int i = 0; i < N; i++) out[i] = __funnelshift_r(raw[i], raw[i + 1], shift);
}

// The 8 words of the 32 bytes from p (16-byte aligned).
__device__ __forceinline__ void words32_aligned(const u8* p, unsigned* out) {
    const uint4* v = reinterpret_cast<const uint4*>(p);
    uint4 a = v[0], b = v[1];
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

// The float of a small unsigned integer u (< 2^23), exactly as (float)u: u in the low bits
// of 2^23's float is 2^23 + u, and taking 2^23 away is exact. Two full-rate operations where
// the conversion instruction runs at a quarter of the rate, and a matvec converts every
// weight value.
__device__ __forceinline__ float small_float(unsigned u) {
    return __int_as_float(0x4B000000 | u) - 8388608.0f;
}

// The float of a signed byte's value, exactly.
__device__ __forceinline__ float byte_float(unsigned b) {
    return small_float(b ^ 0x80u) - 128.0f;
}

// Byte j of the words w.
__device__ __forceinline__ unsigned byte_of(const unsigned* w, int j) {
    return (w[j >> 2] >> (8 * (j & 3))) & 0xFFu;
}

__device__ __forceinline__ unsigned short u16_at(const u8* p) {
    return *reinterpret_cast<const unsigned short*>(p);
}

// ggml's get_scale_min_k4 on the 12 scale bytes held in words sc.
__device__ __forceinline__ void scale_min_k4w(int j, const unsigned* sc, int* d, int* m) {
    if (j < 4) {
        *d = (int)(byte_of(sc, j) & 63);
        *m = (int)(byte_of(sc, j + 4) & 63);
    } else {
        *d = (int)((byte_of(sc, j + 4) & 0xF) | ((byte_of(sc, j - 4) >> 6) << 4));
        *m = (int)((byte_of(sc, j + 4) >> 4) | ((byte_of(sc, j) >> 6) << 4));
    }
}

// The two halves packed in a word (the low one first), as floats.
__device__ __forceinline__ void half_pair(unsigned w, float* lo, float* hi) {
    *lo = half_bits((unsigned short)(w & 0xFFFF));
    *hi = half_bits((unsigned short)(w >> 16));
}

// The scale d1 and offset m1 of sub-block s of a Q4_K / Q5_K block at b (16-byte aligned:
// d, dmin, then 12 bytes of 6-bit scales and mins), as ggml's dequantize_row_q4_K forms them.
__device__ __forceinline__ void k4_sub_block(const u8* b, int s, float* d1, float* m1) {
    const unsigned* hdr = reinterpret_cast<const unsigned*>(b);
    float d, dmin;
    half_pair(hdr[0], &d, &dmin);
    unsigned sc[3] = {hdr[1], hdr[2], hdr[3]};
    int scv, mv;
    scale_min_k4w(s, sc, &scv, &mv);
    *d1 = d * (float)scv;
    *m1 = dmin * (float)mv;
}

// Values 32c .. 32c + 31 of a row stored at `row` in format `fmt`, into w, each dequantized
// as ggml's dequantize_row_* computes it.
__device__ __forceinline__ void chunk_values(int fmt, const u8* __restrict__ row, int c, float* w) {
    switch (fmt) {
    case FMT_F32: {
        const float4* p = reinterpret_cast<const float4*>(row) + 8 * c;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float4 v = p[i];
            w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
        }
        break;
    }
    case FMT_F16:
    case FMT_BF16: {
        // 64 bytes: rows are whole chunks, so 16-byte aligned.
        unsigned h[16];
        words32_aligned(row + 64 * c, h);
        words32_aligned(row + 64 * c + 32, h + 8);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            unsigned lo = h[i] & 0xFFFFu, hi = h[i] >> 16;
            if (fmt == FMT_F16) {
                w[2 * i] = half_bits((unsigned short)lo);
                w[2 * i + 1] = half_bits((unsigned short)hi);
            } else {
                w[2 * i] = __uint_as_float(lo << 16);
                w[2 * i + 1] = __uint_as_float(hi << 16);
            }
        }
        break;
    }
    case FMT_Q4_0: {
        // 18-byte blocks: d, then 16 bytes of nibbles (2-byte aligned).
        const u8* b = row + 18 * c;
        float d = half_bits(u16_at(b));
        unsigned q[4];
        words_at<4>(b + 2, q);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            unsigned x = byte_of(q, j);
            w[j] = (small_float(x & 0xF) - 8.0f) * d;
            w[j + 16] = (small_float(x >> 4) - 8.0f) * d;
        }
        break;
    }
    case FMT_Q4_1: {
        // 20-byte blocks: rows and blocks start 4-byte aligned, so five 32-bit loads.
        const unsigned* b = reinterpret_cast<const unsigned*>(row + 20 * c);
        float d, m;
        half_pair(b[0], &d, &m);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            unsigned q = b[1 + k];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                unsigned byte = (q >> (8 * i)) & 0xFF;
                w[4 * k + i] = small_float(byte & 0xF) * d + m;
                w[4 * k + i + 16] = small_float(byte >> 4) * d + m;
            }
        }
        break;
    }
    case FMT_Q5_0: {
        // 22-byte blocks: d, qh (4 bytes), qs (16 bytes), 2-byte aligned.
        const u8* b = row + 22 * c;
        float d = half_bits(u16_at(b));
        unsigned v[5];
        words_at<5>(b + 2, v);
        unsigned qh = v[0];
        const unsigned* qs = v + 1;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            unsigned x = byte_of(qs, j);
            int x0 = (int)((x & 0xF) | (((qh >> j) << 4) & 0x10));
            int x1 = (int)((x >> 4) | ((qh >> (j + 12)) & 0x10));
            w[j] = (small_float(x0) - 16.0f) * d;
            w[j + 16] = (small_float(x1) - 16.0f) * d;
        }
        break;
    }
    case FMT_Q5_1: {
        // 24-byte blocks: d, m, qh, qs, all 4-byte aligned.
        const unsigned* b = reinterpret_cast<const unsigned*>(row + 24 * c);
        unsigned dm = b[0], qh = b[1];
        unsigned qs[4] = {b[2], b[3], b[4], b[5]};
        float d, m;
        half_pair(dm, &d, &m);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            unsigned x = byte_of(qs, j);
            int x0 = (int)((x & 0xF) | (((qh >> j) << 4) & 0x10));
            int x1 = (int)((x >> 4) | ((qh >> (j + 12)) & 0x10));
            w[j] = small_float(x0) * d + m;
            w[j + 16] = small_float(x1) * d + m;
        }
        break;
    }
    case FMT_Q8_0: {
        // 34-byte blocks: d, then 32 signed bytes (2-byte aligned).
        const u8* b = row + 34 * c;
        float d = half_bits(u16_at(b));
        unsigned q[8];
        words_at<8>(b + 2, q);
#pragma unroll
        for (int j = 0; j < 32; j++) w[j] = byte_float(byte_of(q, j)) * d;
        break;
    }
    case FMT_Q4K: {
        // 144 bytes per 256 values: d, dmin, scales[12], qs[128]; sub-block s of 32. Rows
        // are whole blocks, so blocks are 16-byte aligned.
        const u8* b = row + 144 * (c >> 3);
        int s = c & 7;
        float d1, m1;
        k4_sub_block(b, s, &d1, &m1);
        unsigned q[8];
        words32_aligned(b + 16 + 32 * (s >> 1), q);
        int shift = (s & 1) * 4;
#pragma unroll
        for (int l = 0; l < 32; l++) w[l] = d1 * small_float((byte_of(q, l) >> shift) & 0xF) - m1;
        break;
    }
    case FMT_Q5K: {
        // 176 bytes per 256 values: d, dmin, scales[12], qh[32], qs[128]; 16-byte aligned.
        const u8* b = row + 176 * (c >> 3);
        int s = c & 7;
        float d1, m1;
        k4_sub_block(b, s, &d1, &m1);
        unsigned qh[8], ql[8];
        words32_aligned(b + 16, qh);
        words32_aligned(b + 48 + 32 * (s >> 1), ql);
        int shift = (s & 1) * 4;
        unsigned u = 1u << s;
#pragma unroll
        for (int l = 0; l < 32; l++)
            w[l] = d1 * small_float(((byte_of(ql, l) >> shift) & 0xF) + ((byte_of(qh, l) & u) ? 16 : 0)) - m1;
        break;
    }
    case FMT_Q6K: {
        // 210 bytes per 256 values: ql[128], qh[64], scales[16] (i8), d; sub-block s of 32.
        // Blocks are 2-byte aligned.
        const u8* b = row + 210 * (c >> 3);
        int s = c & 7;
        int half = s >> 2, k = s & 3;
        unsigned ql[8], qh[8];
        words_at<8>(b + 64 * half + ((k & 1) ? 32 : 0), ql);
        words_at<8>(b + 128 + 32 * half, qh);
        // The two scales of the sub-block (its values 0..15 and 16..31).
        unsigned short sc2 = u16_at(b + 192 + 8 * half + 2 * k);
        float d = half_bits(u16_at(b + 208));
        float s0 = (float)(signed char)(sc2 & 0xFF), s1 = (float)(signed char)(sc2 >> 8);
        int nshift = (k >> 1) * 4, hshift = 2 * k;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            unsigned q = ((byte_of(ql, l) >> nshift) & 0xF) | (((byte_of(qh, l) >> hshift) & 3) << 4);
            w[l] = d * (l < 16 ? s0 : s1) * (small_float(q) - 32.0f);
        }
        break;
    }
    }
}

// out[r] = the embedding row of token meta[2 + r] (a weight of `h` values a row, in its
// file's format); one block per row, threads over the row's chunks.
extern "C" __global__ void embed(const unsigned* meta, const u8* table, int fmt,
                                 long long row_bytes, float* out, int h) {
    GRID_ORDER();
    int r = blockIdx.x;
    const u8* src = table + (long long)meta[2 + r] * row_bytes;
    float w[32];
    for (int c = threadIdx.x; c < h / 32; c += blockDim.x) {
        chunk_values(fmt, src, c, w);
        float* o = out + (long long)r * h + 32 * c;
#pragma unroll
        for (int i = 0; i < 32; i++) o[i] = w[i];
    }
}

// RMSNorm of rows of `d` values; one block per row.
// Thread t sums the squares of values t, t + blockDim.x, ... in that order, then the block's
// fixed tree. The first NORM_HELD of a thread's values are loaded together into registers
// (a row's loads in flight at once, not one after another) and reused for the output.
#define NORM_HELD 16
__device__ __forceinline__ void rms_norm_body(const float* x, const float* w, float* out, int d,
                                              float eps) {
    __shared__ float red[32];
    const float* row = x + (long long)blockIdx.x * d;
    float* o = out + (long long)blockIdx.x * d;
    int step = blockDim.x;
    // The weights come in beside the values, not after the sum: one wait on memory, not two.
    float v[NORM_HELD], wv[NORM_HELD];
#pragma unroll
    for (int u = 0; u < NORM_HELD; u++) {
        int j = threadIdx.x + u * step;
        v[u] = j < d ? row[j] : 0.0f;
        wv[u] = j < d ? w[j] : 0.0f;
    }
    float s = 0.0f;
#pragma unroll
    for (int u = 0; u < NORM_HELD; u++)
        if (threadIdx.x + u * step < d) s = __fmaf_rn(v[u], v[u], s);
    for (int j = threadIdx.x + NORM_HELD * step; j < d; j += step) s = __fmaf_rn(row[j], row[j], s);
    float inv = 1.0f / sqrtf(block_sum(s, red) / (float)d + eps);
#pragma unroll
    for (int u = 0; u < NORM_HELD; u++) {
        int j = threadIdx.x + u * step;
        if (j < d) o[j] = v[u] * inv * wv[u];
    }
    for (int j = threadIdx.x + NORM_HELD * step; j < d; j += step) o[j] = row[j] * inv * w[j];
}

extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, int d,
                                    float eps) {
    GRID_ORDER();
    rms_norm_body(x, w, out, d, eps);
}

// t plus a chunk's 32 products w[i] · x[i], x at xs (16-byte aligned), in value order:
// the one order every matvec sums a chunk in.
__device__ __forceinline__ float chunk_dot(const float* w, const float4* xs, float t) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float4 b = xs[i];
        t = __fmaf_rn(w[4 * i], b.x, t);
        t = __fmaf_rn(w[4 * i + 1], b.y, t);
        t = __fmaf_rn(w[4 * i + 2], b.z, t);
        t = __fmaf_rn(w[4 * i + 3], b.w, t);
    }
    return t;
}

// y[r, y_off + o] = x[r] . W[o] (+ bias[y_off + o] unless bias is null) (+ y[r, y_off + o]
// when accumulating) for the `rows` rows of a weight part W (row-major, `row_bytes` a row,
// in format FMT), x rows of `in` values (a multiple of 32), y rows of `y_stride` values.
// A warp computes OUTS consecutive outputs; for each, lane l sums chunks l, l + 32, ... in
// order (32 fused multiply-adds a chunk, in value order), then the lanes are summed in a
// fixed tree: a row's sum runs in the same order whatever rows share the launch, and
// however the warp's loops are ordered. blockIdx.y picks a group of up to ROWS rows, all
// computed in one pass over W. One kernel per format (`matvec_F`, F the format's code), so
// each holds only its own format's code.
//
// Several rows (a prefill chunk, a verify block) take x in tiles of 32 chunks a row, one
// lane-loop step: the block copies the tile into shared memory, a chunk's 32 values 36
// floats apart (the lanes' 16-byte reads of their chunks fall in different banks; read from
// global memory they would touch 32 cache lines a read, and a chunk is read once for each
// of the warp's OUTS outputs). A lone row comes here only when `matvec1_F` cannot take it
// (an x too wide for shared memory, or a kernel source without it): it holds its chunk of x
// in registers for all OUTS outputs. `MATVEC_OUTS` in source.rs sizes the launches by OUTS
// (a test holds the two equal).
#define OUTS 2
// Floats between two chunks of x in shared memory: 32 values and 4 apart, so that lane l's
// 16-byte reads start at bank 4l (mod 32) and a quarter warp's reads are in 32 banks.
#define XSTRIDE 36
template <int FMT>
__device__ __forceinline__ void matvec_body(const u8* __restrict__ W, long long row_bytes,
                                            const float* __restrict__ x,
                                            const float* __restrict__ bias, float* y, int n,
                                            int in, int rows, int y_stride, int y_off,
                                            int accumulate) {
    __shared__ float4 xt[ROWS * 32 * (XSTRIDE / 4)];
    int o0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * OUTS;
    int lane = threadIdx.x & 31;
    int r0 = blockIdx.y * ROWS;
    int nr = min(ROWS, n - r0);
    // Only a lone row's warps leave early: the others all take part in copying the tiles.
    if (nr == 1 && o0 >= rows) return;
    float acc[OUTS][ROWS];
#pragma unroll
    for (int k = 0; k < OUTS; k++)
#pragma unroll
        for (int r = 0; r < ROWS; r++) acc[k][r] = 0.0f;
    int chunks = in >> 5;
    float w[32];
    if (nr == 1) {
        const float4* xr = reinterpret_cast<const float4*>(x + (long long)r0 * in);
        for (int c = lane; c < chunks; c += 32) {
            float xv[32];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 b = xr[8 * c + i];
                xv[4 * i] = b.x; xv[4 * i + 1] = b.y; xv[4 * i + 2] = b.z; xv[4 * i + 3] = b.w;
            }
#pragma unroll
            for (int k = 0; k < OUTS; k++) {
                if (o0 + k < rows) {
                    chunk_values(FMT, W + (long long)(o0 + k) * row_bytes, c, w);
                    float t = acc[k][0];
#pragma unroll
                    for (int i = 0; i < 32; i++) t = __fmaf_rn(w[i], xv[i], t);
                    acc[k][0] = t;
                }
            }
        }
    } else {
        const float4* x4 = reinterpret_cast<const float4*>(x + (long long)r0 * in);
        int in4 = in >> 2;
        for (int c0 = 0; c0 < chunks; c0 += 32) {
            // The tile: chunks c0 .. c0 + 31 (or to the row's end) of each of the nr rows.
            int per_row = 8 * min(32, chunks - c0);
            __syncthreads();
            for (int i = threadIdx.x; i < nr * per_row; i += blockDim.x) {
                int r = i / per_row, j = i - r * per_row;
                xt[(r * 32 + (j >> 3)) * (XSTRIDE / 4) + (j & 7)] = x4[(long long)r * in4 + 8 * c0 + j];
            }
            __syncthreads();
            int c = c0 + lane;
            if (c >= chunks) continue;
#pragma unroll
            for (int k = 0; k < OUTS; k++) {
                if (o0 + k >= rows) continue;
                chunk_values(FMT, W + (long long)(o0 + k) * row_bytes, c, w);
#pragma unroll
                for (int r = 0; r < ROWS; r++) {
                    if (r < nr) acc[k][r] = chunk_dot(w, xt + (r * 32 + lane) * (XSTRIDE / 4), acc[k][r]);
                }
            }
        }
    }
#pragma unroll
    for (int k = 0; k < OUTS; k++) {
        int o = o0 + k;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            // Rows past the block's (and outputs past the part's) are never summed: the
            // same test for the whole warp.
            if (r >= nr || o >= rows) break;
            float t = warp_sum(acc[k][r]);
            if (lane == 0) {
                if (bias) t = t + bias[y_off + o];
                float* dst = y + (long long)(r0 + r) * y_stride + y_off + o;
                *dst = accumulate ? *dst + t : t;
            }
        }
    }
}

#define MATVEC(F)                                                                          \
    extern "C" __global__ void matvec_##F(const u8* W, long long row_bytes, const float* x,  \
                                          const float* bias, float* y, int n, int in,        \
                                          int rows, int y_stride, int y_off,                 \
                                          int accumulate) {                                  \
        GRID_ORDER();                                                                        \
        matvec_body<F>(W, row_bytes, x, bias, y, n, in, rows, y_stride, y_off, accumulate);  \
    }
MATVEC(0)
MATVEC(1)
MATVEC(2)
MATVEC(3)
MATVEC(4)
MATVEC(5)
MATVEC(6)
MATVEC(7)
MATVEC(8)
MATVEC(9)
MATVEC(10)

// The decode step's matvec (one row of x): the same sums as matvec_F's, in the same order
// (lane l takes chunks l, l + 32, ... with 32 fused multiply-adds a chunk in value order,
// then the lanes' fixed tree), so its outputs are the same bits as a row of a larger launch.
// What differs is how the inputs arrive. The block first copies x into shared memory, a
// chunk's 32 values 36 floats apart, so that the lanes' 16-byte reads of their chunks fall
// in different banks (from global memory they touch 32 cache lines a read). Each warp then
// computes OUTS1 outputs, reading its chunk of x once for all of them; with no x in
// registers across rows and no row block, it needs few registers, so more warps fit on a
// multiprocessor to keep loads in flight. Dynamic shared memory: 36 · in / 32 floats.
// `MATVEC1_OUTS` in source.rs sizes the launches by OUTS1.
//
// A decode step's product may also make its x from the row before it, inside the block
// (each block again: for rows of a few thousand values that costs less than a launch of its
// own, which is most of a small model's step): PRE_NORM, `rms_norm` of x with weights nw
// (the same floats as `rms_norm`'s launch of NORM_THREADS threads: threads t < NORM_THREADS
// sum the squares of values t, t + NORM_THREADS, ... in that order, the others add zeros to
// the block's fixed tree); PRE_SILU, `silu_mul` of the row [gate | up] of 2 · in values
// at x (the same expression). The values land where the copy of x would have.
#define OUTS1 1
// Warps of a matvec1 block (its launch bounds; `MATVEC1_WARPS` in source.rs).
#define MATVEC1_WARPS 16
#define PRE_COPY 0
#define PRE_NORM 1
#define PRE_SILU 2
// Threads of an `rms_norm` launch (`ROW_THREADS` in source.rs).
#define NORM_THREADS 256
template <int FMT, int PRE>
__device__ __forceinline__ void matvec1_body(const u8* __restrict__ W, long long row_bytes,
                                             const float* __restrict__ x,
                                             const float* __restrict__ bias, float* y, int in,
                                             int rows, int y_off, int accumulate,
                                             const float* __restrict__ nw, float eps) {
    GRID_LAUNCH_NEXT();
    extern __shared__ float4 xs[];
    int chunks = in >> 5;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    int o0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * OUTS1;
    int lane = threadIdx.x & 31;
    // The warp's rows of W asked for first, a line a lane: their trip from device memory
    // overlaps x's (and the norm's) instead of following it. A small model's products are
    // a few hundred bytes a warp, so their time is mostly these two waits.
    {
        long long span = (long long)min(OUTS1, max(rows - o0, 0)) * row_bytes;
        const u8* first = W + (long long)o0 * row_bytes;
        // From the line the rows start in to the one they end in.
        const u8* line = reinterpret_cast<const u8*>(reinterpret_cast<unsigned long long>(first) & ~127ULL);
        for (const u8* p = line + 128 * lane; span > 0 && p < first + span; p += 32 * 128)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
    }
    GRID_WAIT();
    if (PRE == PRE_NORM) {
        // The norm's 32 floats of reduction follow x's chunks (no static shared memory:
        // the dynamic size is raised to the device's limit at load).
        float* red = reinterpret_cast<float*>(xs + chunks * (XSTRIDE / 4));
        float s = 0.0f;
        if (threadIdx.x < NORM_THREADS)
            for (int j = threadIdx.x; j < in; j += NORM_THREADS) s = __fmaf_rn(x[j], x[j], s);
        float inv = 1.0f / sqrtf(block_sum(s, red) / (float)in + eps);
        const float4* w4 = reinterpret_cast<const float4*>(nw);
        for (int i = threadIdx.x; i < 8 * chunks; i += blockDim.x) {
            float4 a = x4[i], b = w4[i];
            xs[(i >> 3) * (XSTRIDE / 4) + (i & 7)] =
                make_float4(a.x * inv * b.x, a.y * inv * b.y, a.z * inv * b.z, a.w * inv * b.w);
        }
    } else if (PRE == PRE_SILU) {
        const float4* u4 = x4 + 8 * chunks;
        for (int i = threadIdx.x; i < 8 * chunks; i += blockDim.x) {
            float4 g = x4[i], u = u4[i];
            xs[(i >> 3) * (XSTRIDE / 4) + (i & 7)] = make_float4(
                g.x / (1.0f + expf(-g.x)) * u.x, g.y / (1.0f + expf(-g.y)) * u.y,
                g.z / (1.0f + expf(-g.z)) * u.z, g.w / (1.0f + expf(-g.w)) * u.w);
        }
    } else {
        for (int i = threadIdx.x; i < 8 * chunks; i += blockDim.x) xs[(i >> 3) * (XSTRIDE / 4) + (i & 7)] = x4[i];
    }
    __syncthreads();
    if (o0 >= rows) return;
    float acc[OUTS1];
#pragma unroll
    for (int k = 0; k < OUTS1; k++) acc[k] = 0.0f;
    float w[32];
    for (int c = lane; c < chunks; c += 32) {
        const float4* xc = xs + c * (XSTRIDE / 4);
#pragma unroll
        for (int k = 0; k < OUTS1; k++) {
            if (o0 + k < rows) {
                chunk_values(FMT, W + (long long)(o0 + k) * row_bytes, c, w);
                acc[k] = chunk_dot(w, xc, acc[k]);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < OUTS1; k++) {
        int o = o0 + k;
        if (o >= rows) break;
        float t = warp_sum(acc[k]);
        if (lane == 0) {
            if (bias) t = t + bias[y_off + o];
            float* dst = y + y_off + o;
            *dst = accumulate ? *dst + t : t;
        }
    }
}

// matvec1_F copies x; matvec1n_F norms it (weights nw, eps); matvec1s_F takes silu_mul of
// the [gate | up] row at x.
#define MATVEC1(F)                                                                         \
    extern "C" __global__ void __launch_bounds__(32 * MATVEC1_WARPS) matvec1_##F(           \
        const u8* W, long long row_bytes, const float* x, const float* bias, float* y,       \
        int in, int rows, int y_off, int accumulate) {                                       \
        matvec1_body<F, PRE_COPY>(W, row_bytes, x, bias, y, in, rows, y_off, accumulate,     \
                                  nullptr, 0.0f);                                            \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * MATVEC1_WARPS) matvec1n_##F(          \
        const u8* W, long long row_bytes, const float* x, const float* bias, float* y,       \
        int in, int rows, int y_off, int accumulate, const float* nw, float eps) {           \
        matvec1_body<F, PRE_NORM>(W, row_bytes, x, bias, y, in, rows, y_off, accumulate, nw, \
                                  eps);                                                      \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * MATVEC1_WARPS) matvec1s_##F(          \
        const u8* W, long long row_bytes, const float* x, const float* bias, float* y,       \
        int in, int rows, int y_off, int accumulate) {                                       \
        matvec1_body<F, PRE_SILU>(W, row_bytes, x, bias, y, in, rows, y_off, accumulate,     \
                                  nullptr, 0.0f);                                            \
    }
MATVEC1(0)
MATVEC1(1)
MATVEC1(2)
MATVEC1(3)
MATVEC1(4)
MATVEC1(5)
MATVEC1(6)
MATVEC1(7)
MATVEC1(8)
MATVEC1(9)
MATVEC1(10)

// 8-bit activations (the CPU's `Activations::Q8`, WeightFormat::NativeQ8): the products of
// Q4_K and Q6_K weights with x rounded to 8 bits per block of 256, as mtplx_kernels::q8
// rounds it: amax the block's largest magnitude, d = amax / 127, q = rint(x · (127 / amax))
// (0 where amax is 0), and the sums of each 16 consecutive q. The weights' integers times
// those q are summed exactly (dp4a), and each output is one float accumulator updated once
// per block of 256 inputs, in input order: Q4_K acc = fma(float(Σ sc Σ q x), d · dx, acc),
// then acc = fma(float(Σ min Σ x), dmin · (−dx), acc); Q6_K acc = fma(float(Σ sc (Σ q x −
// 32 Σ x)), d · dx, acc). These are the CPU kernel's operations, so a product gives its bits,
// whatever rows share the launch.
//
// A block rounds its rows of x into shared memory itself (no launch or buffer of its own):
// half blocks of 128 values QHALF bytes apart, so that the eight lanes of a quarter warp,
// reading 16 bytes of eight consecutive half blocks, hit distinct banks. A warp computes
// QOUTS outputs; lane l takes half l & 1 of block 16 i + l / 2 (i = 0, 1, ...), its exact
// integer sums for each output and row are added to its neighbour's, and the even lanes
// leave each block's two (Q6_K: one) products and scales in the warp's slots; then lane
// k < QOUTS · NR runs output k / NR, row k % NR's chain over the 16 blocks, in order.
#define QHALF 144
#define QOUTS 2
#define QROWS 4
#define QWARPS 8

// One block of 256 values of x rounded by a warp, lane l holding values 8 l .. 8 l + 7 in v:
// the words of its eight rounded values in w, the sum of the sixteen values of its lane
// pair (l & ~1, l | 1) in *s16, and the block's d in *d. Every rounding of x to 8 bits (the
// products of a few rows and the tiles of a prefill chunk) runs this, so they agree.
__device__ __forceinline__ void q8k_round_warp(const float* v, unsigned* w, int* s16, float* d_out) {
    // The largest magnitude as bits: non-negative floats order as their bits do.
    unsigned m = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) m = max(m, __float_as_uint(v[i]) & 0x7FFFFFFFu);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(FULL_MASK, m, o));
    float amax = __uint_as_float(m), d = 0.0f, id = 0.0f;
    if (amax != 0.0f) {
        d = __fdiv_rn(amax, 127.0f);
        id = __fdiv_rn(127.0f, amax);
    }
    w[0] = w[1] = 0u;
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int q = __float2int_rn(__fmul_rn(v[i], id));
        s += q;
        w[i >> 2] |= ((unsigned)q & 0xFFu) << (8 * (i & 3));
    }
    *s16 = s + __shfl_xor_sync(FULL_MASK, s, 1);
    *d_out = d;
}

// One warp's block of 256 values (lane l holding values 8 l .. 8 l + 7 in v) rounded into
// `q8_round_rows`' layout: its 256 bytes at q, its sums of each 16 values at s16, its scale
// at *d.
__device__ __forceinline__ void q8k_store_warp(const float* v, signed char* q, int* s16, float* d) {
    int lane = threadIdx.x & 31;
    unsigned w[2];
    int s;
    float dd;
    q8k_round_warp(v, w, &s, &dd);
    *reinterpret_cast<uint2*>(q + 8 * lane) = make_uint2(w[0], w[1]);
    if ((lane & 1) == 0) s16[lane >> 1] = s;
    if (lane == 0) *d = dd;
}

// Rows 0 .. nr - 1 of x (rows of `in` values, in a multiple of 256) rounded into sq (int8
// values, half blocks QHALF bytes apart), sd (each block's d) and ss (each 16 values' sum).
__device__ __forceinline__ void q8k_round(const float* __restrict__ x, int in, int nr,
                                          signed char* sq, float* sd, int* ss) {
    int nb = in >> 8, warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int t = warp; t < nr * nb; t += warps) {
        int r = t / nb, b = t - r * nb;
        const float4* xs = reinterpret_cast<const float4*>(x + (long long)r * in + 256 * b + 8 * lane);
        float4 a = xs[0], c = xs[1];
        float v[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
        unsigned w[2];
        int s;
        float d;
        q8k_round_warp(v, w, &s, &d);
        // Values 8 lane .. 8 lane + 7: half lane / 16 of the block.
        *reinterpret_cast<uint2*>(sq + (r * (in >> 7) + 2 * b + (lane >> 4)) * QHALF + 8 * (lane & 15)) =
            make_uint2(w[0], w[1]);
        if ((lane & 1) == 0) ss[r * (in >> 4) + 16 * b + (lane >> 1)] = s;
        if (lane == 0) sd[r * nb + b] = d;
    }
}

// The 32 words (128 values) of half block q of rounded row r.
__device__ __forceinline__ void q8_half(const signed char* sq, int in, int r, int q, int* xw) {
    const int4* p = reinterpret_cast<const int4*>(sq + (r * (in >> 7) + q) * QHALF);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int4 v = p[i];
        xw[4 * i] = v.x; xw[4 * i + 1] = v.y; xw[4 * i + 2] = v.z; xw[4 * i + 3] = v.w;
    }
}

// Half h of block b of a weight row at `row` against rows 0 .. nr - 1 of the rounded x:
// the exact integer sums tot[r] (and, Q4_K, mins[r]); the block's two float scales in
// *d and *dm (Q6_K: *dm unused).
template <int FMT, int NR>
__device__ __forceinline__ void q8_half_sums(const u8* __restrict__ row, int b, int h, int nr,
                                             const signed char* sq, const int* ss, int in,
                                             int* tot, int* mins, float* d, float* dm) {
    int xw[32];
    if (FMT == FMT_Q4K) {
        const u8* blk = row + 144 * b;
        uint4 hdr = *reinterpret_cast<const uint4*>(blk);
        half_pair(hdr.x, d, dm);
        unsigned scw[3] = {hdr.y, hdr.z, hdr.w};
        // get_scale_min_k4 for sub-blocks 4h .. 4h + 3 (bytes named at compile time).
        int sc[4], mn[4];
#pragma unroll
        for (int s = 0; s < 4; s++) {
            unsigned lo = byte_of(scw, s), mid = byte_of(scw, s + 4), hi = byte_of(scw, s + 8);
            sc[s] = h == 0 ? (int)(lo & 63) : (int)((hi & 0xF) | ((lo >> 6) << 4));
            mn[s] = h == 0 ? (int)(mid & 63) : (int)((hi >> 4) | ((mid >> 6) << 4));
        }
        unsigned qw[16];
        words32_aligned(blk + 16 + 64 * h, qw);
        words32_aligned(blk + 48 + 64 * h, qw + 8);
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r >= nr) break;
            q8_half(sq, in, r, 2 * b + h, xw);
            int dot[4] = {0, 0, 0, 0};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                dot[0] = __dp4a((int)(qw[i] & 0x0F0F0F0Fu), xw[i], dot[0]);
                dot[1] = __dp4a((int)((qw[i] >> 4) & 0x0F0F0F0Fu), xw[8 + i], dot[1]);
                dot[2] = __dp4a((int)(qw[8 + i] & 0x0F0F0F0Fu), xw[16 + i], dot[2]);
                dot[3] = __dp4a((int)((qw[8 + i] >> 4) & 0x0F0F0F0Fu), xw[24 + i], dot[3]);
            }
            const int* s16 = ss + r * (in >> 4) + 16 * b + 8 * h;
            int t = 0, m = 0;
#pragma unroll
            for (int s = 0; s < 4; s++) {
                t += sc[s] * dot[s];
                m += mn[s] * (s16[2 * s] + s16[2 * s + 1]);
            }
            tot[r] = t;
            mins[r] = m;
        }
    } else {
        // Q6_K: 210 bytes a block (2-byte aligned): ql[128], qh[64], scales[16] (i8), d.
        const u8* blk = row + 210 * b;
        unsigned ql[16], qh[8], scw[4];
        words_at<16>(blk + 64 * h, ql);
        words_at<8>(blk + 128 + 32 * h, qh);
        words_at<2>(blk + 192 + 8 * h, scw);
        *d = half_bits(u16_at(blk + 208));
        // Value word i of each 32-value quarter: l = 4i.., l + 32, l + 64, l + 96.
        unsigned v[32];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            v[i] = (ql[i] & 0x0F0F0F0Fu) | ((qh[i] & 0x03030303u) << 4);
            v[8 + i] = (ql[8 + i] & 0x0F0F0F0Fu) | (((qh[i] >> 2) & 0x03030303u) << 4);
            v[16 + i] = ((ql[i] >> 4) & 0x0F0F0F0Fu) | (((qh[i] >> 4) & 0x03030303u) << 4);
            v[24 + i] = ((ql[8 + i] >> 4) & 0x0F0F0F0Fu) | (((qh[i] >> 6) & 0x03030303u) << 4);
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r >= nr) break;
            q8_half(sq, in, r, 2 * b + h, xw);
            const int* s16 = ss + r * (in >> 4) + 16 * b + 8 * h;
            int t = 0;
#pragma unroll
            for (int m = 0; m < 8; m++) {
                int dot = 0;
#pragma unroll
                for (int i = 0; i < 4; i++) dot = __dp4a((int)v[4 * m + i], xw[4 * m + i], dot);
                int sc = (int)(signed char)byte_of(scw, m);
                t += sc * (dot - 32 * s16[m]);
            }
            tot[r] = t;
        }
    }
}

// y[r, y_off + o] = x[r] . W[o] (+ bias) (+ y when accumulating) with x rounded to 8 bits,
// for rows r0 .. r0 + NR - 1 (blockIdx.y) of x. Dynamic shared memory: NR rows of rounded x
// (in / 128 · QHALF bytes a row), their sums (in / 16 words a row), their scales (in / 256
// words a row, rounded up to 4 words), then 16 float4 slots for each of a warp's QOUTS · NR
// chains.
//
// ROUNDED (a decode step's one row, NR = 1): x is not rounded here but copied in as
// `q8_round_rows` (or the kernel that wrote x) left it (one row: the values, then the sums
// of each 16, then the block scales): the same numbers, so the same bits. A block rounding
// x for itself reads 16 KB of floats from L2 and rounds them (a launch of hundreds of
// blocks, before any weight load); the copy is 4.6 KB in 16-byte pieces. (The first form
// read x straight from global memory, a lane's 128 bytes 128 bytes from its neighbour's,
// each load touching 32 lines; with it, and the split attention, the server's decode steps
// were 25% slower on an H200.)
template <int FMT, int NR, bool ROUNDED>
__device__ __forceinline__ void matvec_q8_body(const u8* __restrict__ W, long long row_bytes,
                                               const float* __restrict__ x,
                                               const float* __restrict__ bias, float* y, int n,
                                               int in, int rows, int y_stride, int y_off,
                                               int accumulate) {
    extern __shared__ int4 qsh[];
    int r0 = blockIdx.y * NR, nr = min(NR, n - r0);
    int nb = in >> 8;
    signed char* sq = reinterpret_cast<signed char*>(qsh);
    int* ss = reinterpret_cast<int*>(sq + NR * (in >> 7) * QHALF);
    float* sd = reinterpret_cast<float*>(ss + NR * (in >> 4));
    float4* slots = reinterpret_cast<float4*>(sd + ((NR * nb + 3) & ~3));
    if (ROUNDED) {
        const int4* values = reinterpret_cast<const int4*>(x);
        const int4* sums = values + (in >> 4);
        const float* scales = reinterpret_cast<const float*>(sums + (in >> 6));
        for (int i = threadIdx.x; i < (in >> 4); i += blockDim.x)
            *reinterpret_cast<int4*>(sq + (i >> 3) * QHALF + 16 * (i & 7)) = values[i];
        for (int i = threadIdx.x; i < (in >> 6); i += blockDim.x) reinterpret_cast<int4*>(ss)[i] = sums[i];
        for (int i = threadIdx.x; i < nb; i += blockDim.x) sd[i] = scales[i];
    } else {
        q8k_round(x + (long long)r0 * in, in, nr, sq, sd, ss);
    }
    __syncthreads();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int o0 = (blockIdx.x * (blockDim.x >> 5) + warp) * QOUTS;
    if (o0 >= rows) return;
    float4* my = slots + warp * (QOUTS * NR * 16);
    int j = lane >> 1, h = lane & 1;
    // Lane k's chain: output o0 + k / NR, row k % NR.
    int kc = lane / NR, rc = lane % NR;
    float acc = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += 16) {
        int b = b0 + j;
#pragma unroll
        for (int k = 0; k < QOUTS; k++) {
            int tot[NR], mins[NR];
            float d = 0.0f, dm = 0.0f;
#pragma unroll
            for (int r = 0; r < NR; r++) tot[r] = mins[r] = 0;
            if (b < nb && o0 + k < rows)
                q8_half_sums<FMT, NR>(W + (long long)(o0 + k) * row_bytes, b, h, nr, sq, ss, in,
                                      tot, mins, &d, &dm);
#pragma unroll
            for (int r = 0; r < NR; r++) {
                int t = tot[r] + __shfl_xor_sync(FULL_MASK, tot[r], 1);
                // Q6_K has no mins: nothing to add up (its chain reads no z).
                int m = FMT == FMT_Q4K ? mins[r] + __shfl_xor_sync(FULL_MASK, mins[r], 1) : 0;
                if (h == 0 && b < nb) {
                    float dx = sd[r * nb + b];
                    my[(k * NR + r) * 16 + j] =
                        make_float4(__int2float_rn(t), __fmul_rn(d, dx), __int2float_rn(m), __fmul_rn(dm, -dx));
                }
            }
        }
        __syncwarp();
        if (kc < QOUTS && o0 + kc < rows && rc < nr) {
            int blocks = min(16, nb - b0);
            const float4* s = my + lane * 16;
            for (int i = 0; i < blocks; i++) {
                float4 e = s[i];
                acc = __fmaf_rn(e.x, e.y, acc);
                if (FMT == FMT_Q4K) acc = __fmaf_rn(e.z, e.w, acc);
            }
        }
        __syncwarp();
    }
    if (kc < QOUTS && rc < nr) {
        int o = o0 + kc;
        if (o < rows) {
            float t = acc;
            if (bias) t = t + bias[y_off + o];
            float* dst = y + (long long)(r0 + rc) * y_stride + y_off + o;
            *dst = accumulate ? *dst + t : t;
        }
    }
}

// One entry of matvec_q8_body: NAME_F for NR rows a block, x ROUNDED beforehand or not.
#define MATVEC_Q8_ENTRY(NAME, F, NR, ROUNDED)                                              \
    extern "C" __global__ void __launch_bounds__(32 * QWARPS) NAME##_##F(                    \
        const u8* W, long long row_bytes, const float* x, const float* bias, float* y, int n, \
        int in, int rows, int y_stride, int y_off, int accumulate) {                         \
        GRID_ORDER();                                                                        \
        matvec_q8_body<F, NR, ROUNDED>(W, row_bytes, x, bias, y, n, in, rows, y_stride,      \
                                       y_off, accumulate);                                   \
    }
#define MATVEC_Q8(F)                                                                        \
    MATVEC_Q8_ENTRY(matvecq, F, QROWS, false)                                               \
    MATVEC_Q8_ENTRY(matvec1q, F, 1, false)                                                  \
    MATVEC_Q8_ENTRY(matvec1r, F, 1, true)
MATVEC_Q8(8)
MATVEC_Q8(10)

// The same products for a prefill chunk's many rows, on tensor cores. x is rounded first,
// once for every part and output block (`q8_round_rows`, by q8k_round_warp: the rounding
// matvecq_F does in its blocks), into a buffer of three arrays for n rows of `in` inputs
// (nb = in / 256 blocks a row): the n · in rounded bytes (row r from r · in), then the
// n · in / 16 sums of each 16 consecutive values, then the n · nb block scales.
//
// A block of `mmq_F` takes MMQ_ROWS rows of x and MMQ_OUTS outputs, so a chunk reads the
// weights once per MMQ_ROWS rows (matvecq_F: once per QROWS). For each block of 256 inputs
// in order its threads copy the rounded rows and the weight blocks into shared memory
// (`cp.async`, the next block's copy in flight while this one is computed), and the integer
// sums of weight values times rounded x come from `mma` on 8-bit integers: each
// sub-block's (Q4_K: 32 values; Q6_K: 16) exact sum, then the sub-block scales applied in
// integers. Integer sums are exact in any order, so t and m are matvecq_F's integers, and
// each output's float chain (Q4_K: acc = fma(float(t), d · dx, acc), then acc =
// fma(float(m), dmin · (−dx), acc); Q6_K: the first only) runs over the blocks in the same
// order: a row's result is the same bits whichever kernel computes it.
//
// Warp w takes rows 16 (w % 4) .. + 15 of the block's rows and outputs 64 (w / 4) .. + 63 of
// its outputs: eight tiles of 16 rows × 8 outputs, in the `mma` fragment layouts (lane l:
// g = l / 4, c = l % 4; A holds row g and g + 8, inputs 4c .. 4c + 3 and 16 + 4c ..; B
// output g, inputs 4c .. 4c + 3 (and 16 + 4c .. at k = 32); C rows g and g + 8, outputs
// 2c and 2c + 1). Needs sm_80 (the launch checks the kernels loaded).
#define MMQ_ROWS 64
#define MMQ_OUTS 128
#define MMQ_WARPS 8
// A rounded row of one block of 256 in shared memory, padded so that the eight rows a
// fragment load reads start in different banks.
#define MMQ_XSTRIDE 272
// A staged weight block: Q4_K's 144 bytes (16-byte aligned in the file's rows); Q6_K's 210
// bytes are 2-byte aligned, so the 14 aligned 16-byte pieces around them are copied, 240
// bytes apart (so that eight outputs' words fall in different banks).
#define MMQ_W4K 144
#define MMQ_W6K 240
// The bytes of one stage (a block of 256 inputs): rounded x, its sums, its scales, weights.
#define MMQ_SX (MMQ_ROWS * MMQ_XSTRIDE)
#define MMQ_SS (MMQ_ROWS * 16 * 4)
#define MMQ_SD (MMQ_ROWS * 4)
#define MMQ_STAGE(WB) (MMQ_SX + MMQ_SS + MMQ_SD + MMQ_OUTS * (WB))
// Q4_K's sub-block scales and mins decoded once a stage: 16 bytes an output (8 scales, 8
// mins), then its d and dmin.
#define MMQ_SCALES (MMQ_OUTS * 16 + MMQ_OUTS * 8)

// Rounds rows of x (n rows of `in` values, a multiple of 256) into `out` (the layout
// above): one warp a block of 256 values.
extern "C" __global__ void q8_round_rows(const float* __restrict__ x, int n, int in,
                                         signed char* __restrict__ out) {
    GRID_ORDER();
    int nb = in >> 8, lane = threadIdx.x & 31;
    int t = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    // The same for every lane of a warp: a warp rounds together or returns together.
    if (t >= n * nb) return;
    int r = t / nb, b = t - r * nb;
    const float4* xs = reinterpret_cast<const float4*>(x + (long long)r * in + 256 * b + 8 * lane);
    float4 p = xs[0], q = xs[1];
    float v[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
    int* sums = reinterpret_cast<int*>(out + (long long)n * in);
    float* scales = reinterpret_cast<float*>(sums + (long long)n * (in >> 4));
    q8k_store_warp(v, out + (long long)r * in + 256 * b, sums + (long long)r * (in >> 4) + 16 * b,
                   scales + (long long)r * nb + b);
}

// A decode step's row normed as `rms_norm` normalizes it (out: the same floats), then
// rounded into rq as `q8_round_rows` rounds one row (the numbers the products that read it
// rounded take): no launch of its own before each product. The block's warps round its
// blocks of 256 from the values it has just written (read back past L1: other threads
// wrote them).
extern "C" __global__ void rms_norm_q8(const float* x, const float* w, float* out, int d,
                                       float eps, signed char* rq) {
    GRID_ORDER();
    rms_norm_body(x, w, out, d, eps);
    __syncthreads();
    int nb = d >> 8, warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int* sums = reinterpret_cast<int*>(rq + d);
    float* scales = reinterpret_cast<float*>(sums + (d >> 4));
    for (int b = warp; b < nb; b += warps) {
        const float4* xs = reinterpret_cast<const float4*>(out + 256 * b + 8 * lane);
        float4 p = __ldcg(xs), q = __ldcg(xs + 1);
        float v[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
        q8k_store_warp(v, rq + 256 * b, sums + 16 * b, scales + b);
    }
}

// `silu_mul` of a decode step's row (`width` a multiple of 256), its output also rounded
// into rq as `q8_round_rows` rounds one row: warp b computes values 256 b .. 256 b + 255
// (lane l: 8 l .. 8 l + 7, each as silu_mul computes it) and rounds them.
extern "C" __global__ void silu_mul_q8(const float* gu, float* out, int width, signed char* rq) {
    GRID_ORDER();
    int b = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (b >= (width >> 8)) return;
    int i0 = 256 * b + 8 * lane;
    const float4* g4 = reinterpret_cast<const float4*>(gu + i0);
    const float4* u4 = reinterpret_cast<const float4*>(gu + width + i0);
    float4 ga = g4[0], gb = g4[1], ua = u4[0], ub = u4[1];
    float g[8] = {ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w};
    float u[8] = {ua.x, ua.y, ua.z, ua.w, ub.x, ub.y, ub.z, ub.w};
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = g[e] / (1.0f + expf(-g[e])) * u[e];
    float4* o4 = reinterpret_cast<float4*>(out + i0);
    o4[0] = make_float4(v[0], v[1], v[2], v[3]);
    o4[1] = make_float4(v[4], v[5], v[6], v[7]);
    int* sums = reinterpret_cast<int*>(rq + width);
    float* scales = reinterpret_cast<float*>(sums + (width >> 4));
    q8k_store_warp(v, rq + 256 * b, sums + 16 * b, scales + b);
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
__device__ __forceinline__ void mma_k32(const unsigned* a, unsigned b0, unsigned b1, int* c) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%11,%12,%13};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0),
          "r"(0));
}

__device__ __forceinline__ void mma_k16(unsigned a0, unsigned a1, unsigned b, int* c) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%8,%9,%10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(0), "r"(0), "r"(0), "r"(0));
}

// Asynchronous copies into shared memory (sm_80): BYTES (4 or 16, both addresses aligned
// to it) from global memory, waited for by stage.
__device__ __forceinline__ unsigned shared_address(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (unsigned)a;
}
__device__ __forceinline__ void copy16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(dst)), "l"(src));
}
__device__ __forceinline__ void copy4(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(shared_address(dst)), "l"(src));
}
__device__ __forceinline__ void copies_commit() { asm volatile("cp.async.commit_group;"); }
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void copies_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// Starts the copies of block b's stage: rows r0 .. of the rounded x (q, sums, scales, as
// q8_round_rows lays them out) and outputs o0 .. of W. Rows past n and outputs past
// `rows` are not copied (what their slots hold is computed and never stored).
template <int FMT>
__device__ __forceinline__ void mmq_stage(u8* st, const u8* __restrict__ W, long long row_bytes,
                                          const signed char* __restrict__ xq, int n, int in,
                                          int rows, int r0, int o0, int b) {
    const int WB = FMT == FMT_Q4K ? MMQ_W4K : MMQ_W6K;
    int nb = in >> 8, tid = threadIdx.x;
    u8* sx = st;
    u8* ss = st + MMQ_SX;
    u8* sd = ss + MMQ_SS;
    u8* sw = sd + MMQ_SD;
    const int* sums = reinterpret_cast<const int*>(xq + (long long)n * in);
    const float* scales = reinterpret_cast<const float*>(sums + (long long)n * (in >> 4));
    // x: 16 pieces of 16 bytes a row.
    for (int t = tid; t < MMQ_ROWS * 16; t += 32 * MMQ_WARPS) {
        int rr = t >> 4, p = t & 15;
        if (r0 + rr < n) copy16(sx + rr * MMQ_XSTRIDE + 16 * p, xq + (long long)(r0 + rr) * in + 256 * b + 16 * p);
    }
    // Its sums: 4 pieces a row; its scales: one word a row.
    for (int t = tid; t < MMQ_ROWS * 4; t += 32 * MMQ_WARPS) {
        int rr = t >> 2, p = t & 3;
        if (r0 + rr < n) copy16(ss + 64 * rr + 16 * p, sums + (long long)(r0 + rr) * (in >> 4) + 16 * b + 4 * p);
    }
    if (tid < MMQ_ROWS && r0 + tid < n) copy4(sd + 4 * tid, scales + (long long)(r0 + tid) * nb + b);
    // The weights: Q4_K's 9 pieces an output; Q6_K's 14 from the block's aligned start.
    const int P = FMT == FMT_Q4K ? 9 : 14;
    for (int t = tid; t < MMQ_OUTS * P; t += 32 * MMQ_WARPS) {
        int o = t / P, p = t - o * P;
        if (o0 + o < rows) {
            unsigned long long at = reinterpret_cast<unsigned long long>(W + (long long)(o0 + o) * row_bytes +
                                                                          (FMT == FMT_Q4K ? 144 : 210) * b);
            copy16(sw + o * WB + 16 * p, reinterpret_cast<const u8*>((at & ~15ull) + 16 * p));
        }
    }
}

template <int FMT>
__device__ __forceinline__ void mmq_body(const u8* __restrict__ W, long long row_bytes,
                                         const signed char* __restrict__ xq,
                                         const float* __restrict__ bias, float* y, int n, int in,
                                         int rows, int y_stride, int y_off, int accumulate) {
    const int WB = FMT == FMT_Q4K ? MMQ_W4K : MMQ_W6K;
    const int STAGE = MMQ_STAGE(WB);
    extern __shared__ int4 mmq_shared[];
    u8* sh = reinterpret_cast<u8*>(mmq_shared);
    // Q4_K's decoded scales, after the two stages.
    u8* ssc = sh + 2 * STAGE;
    float2* sdm = reinterpret_cast<float2*>(ssc + MMQ_OUTS * 16);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, c = lane & 3;
    int r0 = blockIdx.y * MMQ_ROWS, wr = 16 * (warp & 3);
    int o0 = blockIdx.x * MMQ_OUTS, ow = 64 * (warp >> 2);
    int nb = in >> 8;
    float acc[8][4];
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[j][i] = 0.0f;
    mmq_stage<FMT>(sh, W, row_bytes, xq, n, in, rows, r0, o0, 0);
    copies_commit();
    for (int b = 0; b < nb; b++) {
        u8* st = sh + (b & 1) * STAGE;
        if (b + 1 < nb) {
            // The other stage was last read in block b - 1, before its closing barrier.
            mmq_stage<FMT>(sh + ((b + 1) & 1) * STAGE, W, row_bytes, xq, n, in, rows, r0, o0, b + 1);
            copies_commit();
            copies_wait<1>();
        } else {
            copies_wait<0>();
        }
        __syncthreads();
        const u8* sx = st;
        const int* ss = reinterpret_cast<const int*>(st + MMQ_SX);
        const float* sd = reinterpret_cast<const float*>(st + MMQ_SX + MMQ_SS);
        const u8* sw = st + MMQ_SX + MMQ_SS + MMQ_SD;
        if (FMT == FMT_Q4K) {
            // Each output's eight scales and mins, two threads an output, four sub-blocks each.
            int o = threadIdx.x >> 1, half = threadIdx.x & 1;
            const unsigned* hdr = reinterpret_cast<const unsigned*>(sw + o * MMQ_W4K);
            unsigned scw[3] = {hdr[1], hdr[2], hdr[3]};
            unsigned sw4 = 0, mw4 = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int scv, mv;
                scale_min_k4w(4 * half + k, scw, &scv, &mv);
                sw4 |= (unsigned)scv << (8 * k);
                mw4 |= (unsigned)mv << (8 * k);
            }
            unsigned* out = reinterpret_cast<unsigned*>(ssc + 16 * o);
            out[half] = sw4;
            out[2 + half] = mw4;
            if (half == 0) {
                float d, dm;
                half_pair(hdr[0], &d, &dm);
                sdm[o] = make_float2(d, dm);
            }
            __syncthreads();
        }
        // This lane's A words: rows wr + g and wr + g + 8, inputs 16 k + 4 c .. + 3 for each
        // 16 inputs k of the block.
        unsigned xa[16], xb[16];
        const u8* ra = sx + (wr + g) * MMQ_XSTRIDE + 4 * c;
        const u8* rb = ra + 8 * MMQ_XSTRIDE;
#pragma unroll
        for (int k = 0; k < 16; k++) {
            xa[k] = *reinterpret_cast<const unsigned*>(ra + 16 * k);
            xb[k] = *reinterpret_cast<const unsigned*>(rb + 16 * k);
        }
        // The scales of x for this lane's two rows, and their sums of each 16 values.
        float dxa = sd[wr + g], dxb = sd[wr + g + 8];
        const int* sa = ss + (wr + g) * 16;
        const int* sb = sa + 8 * 16;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            // B: output ob's values; C: outputs oc and oc + 1 (of the block's).
            int ob = ow + 8 * j + g, oc = ow + 8 * j + 2 * c;
            int t[4] = {0, 0, 0, 0}, m[4] = {0, 0, 0, 0};
            float dw[2], mw[2];
            if (FMT == FMT_Q4K) {
                const u8* blk = sw + ob * MMQ_W4K + 16 + 4 * c;
                unsigned qw[8];
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    qw[2 * h] = *reinterpret_cast<const unsigned*>(blk + 32 * h);
                    qw[2 * h + 1] = *reinterpret_cast<const unsigned*>(blk + 32 * h + 16);
                }
                uint4 sm[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    sm[e] = *reinterpret_cast<const uint4*>(ssc + 16 * (oc + e));
                    float2 v = sdm[oc + e];
                    dw[e] = v.x;
                    mw[e] = v.y;
                }
                // Sub-block k (32 values): chunk k / 2's bytes, low nibbles then high.
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    int sh4 = 4 * (k & 1);
                    unsigned b0 = (qw[2 * (k >> 1)] >> sh4) & 0x0F0F0F0Fu;
                    unsigned b1 = (qw[2 * (k >> 1) + 1] >> sh4) & 0x0F0F0F0Fu;
                    unsigned a[4] = {xa[2 * k], xb[2 * k], xa[2 * k + 1], xb[2 * k + 1]};
                    int dot[4];
                    mma_k32(a, b0, b1, dot);
                    int xs_a = sa[2 * k] + sa[2 * k + 1], xs_b = sb[2 * k] + sb[2 * k + 1];
                    int sc0 = (int)(((k < 4 ? sm[0].x : sm[0].y) >> (8 * (k & 3))) & 0xFFu);
                    int sc1 = (int)(((k < 4 ? sm[1].x : sm[1].y) >> (8 * (k & 3))) & 0xFFu);
                    int mn0 = (int)(((k < 4 ? sm[0].z : sm[0].w) >> (8 * (k & 3))) & 0xFFu);
                    int mn1 = (int)(((k < 4 ? sm[1].z : sm[1].w) >> (8 * (k & 3))) & 0xFFu);
                    t[0] += sc0 * dot[0];
                    t[1] += sc1 * dot[1];
                    t[2] += sc0 * dot[2];
                    t[3] += sc1 * dot[3];
                    m[0] += mn0 * xs_a;
                    m[1] += mn1 * xs_a;
                    m[2] += mn0 * xs_b;
                    m[3] += mn1 * xs_b;
                }
            } else {
                // Q6_K: ql[128], qh[64], scales[16] (i8), d, from the block's start `off`
                // bytes into its staged pieces (even: a 2-byte aligned block).
                // The two outputs' sixteen scales, as words (bytes taken out where used).
                unsigned scw[2][4];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int off = (int)(((unsigned long long)(W + (long long)(o0 + oc + e) * row_bytes) + 210ull * b) & 15ull);
                    const u8* blk = sw + (oc + e) * MMQ_W6K + off;
                    words_at<4>(blk + 192, scw[e]);
                    dw[e] = half_bits(u16_at(blk + 208));
                }
                int off = (int)(((unsigned long long)(W + (long long)(o0 + ob) * row_bytes) + 210ull * b) & 15ull);
                const u8* blk = sw + ob * MMQ_W6K + off + 4 * c;
                // Group k (16 values, scale k): half h = k / 8, quarter q = (k % 8) / 2:
                // ql word 4 h + 2 (q % 2) + k % 2 and qh word 2 h + k % 2 of this lane's.
                unsigned ql[8], qh[4];
#pragma unroll
                for (int i = 0; i < 8; i++) words_at<1>(blk + 16 * i, ql + i);
#pragma unroll
                for (int i = 0; i < 4; i++) words_at<1>(blk + 128 + 16 * i, qh + i);
#pragma unroll
                for (int k = 0; k < 16; k++) {
                    int h = k >> 3, q = (k & 7) >> 1;
                    unsigned v = ((ql[4 * h + 2 * (q & 1) + (k & 1)] >> (4 * (q >> 1))) & 0x0F0F0F0Fu) |
                                 (((qh[2 * h + (k & 1)] >> (2 * q)) & 0x03030303u) << 4);
                    int dot[4];
                    mma_k16(xa[k], xb[k], v, dot);
                    int sc0 = (int)(signed char)byte_of(scw[0], k);
                    int sc1 = (int)(signed char)byte_of(scw[1], k);
                    int za = 32 * sa[k], zb = 32 * sb[k];
                    t[0] += sc0 * (dot[0] - za);
                    t[1] += sc1 * (dot[1] - za);
                    t[2] += sc0 * (dot[2] - zb);
                    t[3] += sc1 * (dot[3] - zb);
                }
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float dx = i < 2 ? dxa : dxb;
                acc[j][i] = __fmaf_rn(__int2float_rn(t[i]), __fmul_rn(dw[i & 1], dx), acc[j][i]);
                if (FMT == FMT_Q4K)
                    acc[j][i] = __fmaf_rn(__int2float_rn(m[i]), __fmul_rn(mw[i & 1], -dx), acc[j][i]);
            }
        }
        // Every warp is done with this stage (and the decoded scales) before they are refilled.
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = r0 + wr + g + 8 * (i >> 1), o = o0 + ow + 8 * j + 2 * c + (i & 1);
            if (r < n && o < rows) {
                float t = acc[j][i];
                if (bias) t = t + bias[y_off + o];
                float* dst = y + (long long)r * y_stride + y_off + o;
                *dst = accumulate ? *dst + t : t;
            }
        }
    }
}

// x here is q8_round_rows' output for these n rows. Dynamic shared memory: two stages
// (MMQ_STAGE of the format's staged block) and, Q4_K, MMQ_SCALES. Q4_K's kernel fits in
// 128 registers (two blocks a multiprocessor, a few bytes spilled); Q6_K's spills hundreds
// of bytes there, so it keeps one block of all the registers it needs.
#define MMQ(F, BLOCKS)                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * MMQ_WARPS, BLOCKS) mmq_##F(          \
        const u8* W, long long row_bytes, const signed char* x, const float* bias, float* y, \
        int n, int in, int rows, int y_stride, int y_off, int accumulate) {                  \
        GRID_ORDER();                                                                        \
        mmq_body<F>(W, row_bytes, x, bias, y, n, in, rows, y_stride, y_off, accumulate);     \
    }
MMQ(8, 2)
MMQ(10, 1)
#endif

// ---- K/V rows as the cache stores them ----
//
// A cache stores K and V as f32 (`float`) or as IEEE halves (`unsigned short`, the bits):
// a value is rounded to the stored type once, when its row is written (to nearest, ties to
// even, as the CPU's f16 caches round), and read back exactly. `_h` kernels are the f16
// caches' builds of the same code.
__device__ __forceinline__ void kv_put(float* p, float x) { *p = x; }
__device__ __forceinline__ void kv_put(unsigned short* p, float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    *p = h;
}
// Four consecutive stored values from p (16-byte aligned for f32, 8 for f16), widened.
__device__ __forceinline__ float4 kv_get4(const float* p) {
    return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 kv_get4(const unsigned short* p) {
    uint2 u = *reinterpret_cast<const uint2*>(p);
    return make_float4(half_bits((unsigned short)(u.x & 0xffffu)),
                       half_bits((unsigned short)(u.x >> 16)),
                       half_bits((unsigned short)(u.y & 0xffffu)),
                       half_bits((unsigned short)(u.y >> 16)));
}

// Splits fused QKV rows ([n, qd + 2 kvd]), norms each Q and K head by its RMS (Qwen3's
// per-head norms, when `qn` is given), rotates Q and K (RoPE at positions pos0 + r), writes Q
// to q_out ([n, qd]) and K, V into the layer's cache rows row0 + r ([cap, kvd], stored as
// KV). One block per row.
#define MAX_NORM_HEADS 256
template <typename KV>
__device__ __forceinline__ void qkv_post_rows(const float* qkv, float* q_out,
                                              const unsigned long long* kv, int layer,
                                              const float* cos_t, const float* sin_t, int qh,
                                              int kvh, int hd, const unsigned* meta,
                                              int interleaved, const float* qn,
                                              const float* kn, float eps) {
    __shared__ float inv[MAX_NORM_HEADS];
    KV* kc = (KV*)kv[2 * layer];
    KV* vc = (KV*)kv[2 * layer + 1];
    int r = blockIdx.x;
    int half = hd / 2, qd = qh * hd, kvd = kvh * hd;
    // The cache row written, and the position rotated for.
    int row = (int)meta[0] + r, p = (int)meta[1] + r;
    const float* src_row = qkv + (long long)r * (qd + 2 * kvd);
    if (qn) {
        // One warp per head: lane-strided squares, then the warp's fixed tree.
        int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
        for (int head = warp; head < qh + kvh; head += warps) {
            const float* x = src_row + head * hd;
            float ss = 0.0f;
            for (int d = lane; d < hd; d += 32) ss = __fmaf_rn(x[d], x[d], ss);
            ss = warp_sum(ss);
            if (lane == 0) inv[head] = 1.0f / sqrtf(ss / (float)hd + eps);
        }
        __syncthreads();
    }
    const float* c = cos_t + (long long)p * half;
    const float* s = sin_t + (long long)p * half;
    int pairs_q = qh * half, pairs_k = kvh * half;
    for (int t = threadIdx.x; t < pairs_q + pairs_k + kvd; t += blockDim.x) {
        if (t < pairs_q + pairs_k) {
            bool is_q = t < pairs_q;
            int u = is_q ? t : t - pairs_q;
            int head = u / half, i = u % half;
            const float* src = src_row + (is_q ? 0 : qd) + head * hd;
            int ia = interleaved ? 2 * i : i;
            int ib = interleaved ? 2 * i + 1 : i + half;
            float a = src[ia], b = src[ib];
            if (qn) {
                float k = inv[is_q ? head : qh + head];
                const float* nw = is_q ? qn : kn;
                a = a * k * nw[ia];
                b = b * k * nw[ib];
            }
            float ra = a * c[i] - b * s[i], rb = a * s[i] + b * c[i];
            if (is_q) {
                float* dst = q_out + (long long)r * qd + head * hd;
                dst[ia] = ra;
                dst[ib] = rb;
            } else {
                KV* dst = kc + (long long)row * kvd + head * hd;
                kv_put(dst + ia, ra);
                kv_put(dst + ib, rb);
            }
        } else {
            int j = t - pairs_q - pairs_k;
            kv_put(vc + (long long)row * kvd + j, src_row[qd + kvd + j]);
        }
    }
}

#define QKV_POST_ARGS                                                                      \
    const float *qkv, float *q_out, const unsigned long long *kv, int layer,                \
        const float *cos_t, const float *sin_t, int qh, int kvh, int hd,                    \
        const unsigned *meta, int interleaved, const float *qn, const float *kn, float eps
#define QKV_POST_CALL qkv, q_out, kv, layer, cos_t, sin_t, qh, kvh, hd, meta, interleaved, qn, kn, eps
extern "C" __global__ void qkv_post(QKV_POST_ARGS) {
    GRID_ORDER();
    qkv_post_rows<float>(QKV_POST_CALL);
}
extern "C" __global__ void qkv_post_h(QKV_POST_ARGS) {
    GRID_ORDER();
    qkv_post_rows<unsigned short>(QKV_POST_CALL);
}

// Attention is computed in parts of KEYS consecutive cache positions and merged: no part
// needs more shared memory than KEYS scores, so the context is not capped by it, and a long
// context's keys spread over many blocks. Where the parts fall depends only on positions, so
// a query row's result does not depend on which rows share its launch.
#define KEYS 256
// Warps of an attention block (`ATTEND_WARPS` in source.rs) and the keys a warp scores at a
// time (each lane's loads of them in flight together). Neither changes a key's score; the
// warps' runs of the weighted sum of V (and the order their sums are added in) follow the
// warp count, fixed per source.
#define ATTEND_WARPS 4
#define ATTEND_INFLIGHT 4

// A (row, head)'s np parts (at base, hd + 2 floats each: the weighted sums of V, the
// maximum score, the sum of exponentials) merged in part order into dst's hd values:
// the largest maximum first, then the parts' sums rescaled to it. Thread t of `threads`
// takes dimensions t, t + threads, ...; every attention kernel's last part merges here, so
// the merge is one computation whichever kernel ran the parts.
//
// The sums run over the parts one after another (the same terms in the same order for any
// thread count), but the loads are taken MERGE_BATCH parts at a time, all in flight
// together: a long context's merge was a chain of dependent L2 round trips, most of a
// decode step's attention at 8K positions. Each thread's dimensions go MERGE_DIMS at a time;
// the first group also sums the exponentials. Neither count changes a bit of the result;
// the per-row and tile kernels take 4 parts and one dimension at a time (their occupancy
// hides their latency: the tensor-core kernel's 8 x 4 took the per-row kernel from 53 to
// 111 registers and its decode step at 8K positions from 41 to 58 us on an H100). The
// tensor-core kernel's warps (WARP) take 16 parts at a time, which its registers allow
// without a spill, and load the maxima across their lanes: a 512-row chunk's attention
// after 32K cached positions 5.81 -> 5.24 ms a layer on an H100, a decode step's at 32K
// 84.9 -> 80.2 us.
template <int MERGE_BATCH = 8, int MERGE_DIMS = 4, bool WARP = false>
__device__ __forceinline__ void merge_parts(const float* base, int np, int hd, float* dst,
                                            int t, int threads) {
    const int stride = hd + 2;
    float mm = NEG_INF;
    if (WARP) {
        // One warp: its lanes load the maxima side by side and take the warp's largest, the
        // same value in any order (a maximum is exact), in one round trip to L2 for up to
        // 32 parts instead of one for each MERGE_BATCH.
#pragma unroll 4
        for (int s = t; s < np; s += 32) mm = fmaxf(mm, __ldcg(base + s * stride + hd));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mm = fmaxf(mm, __shfl_xor_sync(FULL_MASK, mm, o));
    } else {
        for (int s0 = 0; s0 < np; s0 += MERGE_BATCH) {
            float m[MERGE_BATCH];
#pragma unroll
            for (int b = 0; b < MERGE_BATCH; b++)
                m[b] = s0 + b < np ? __ldcg(base + (s0 + b) * stride + hd) : NEG_INF;
#pragma unroll
            for (int b = 0; b < MERGE_BATCH; b++) mm = fmaxf(mm, m[b]);
        }
    }
    float ll = 0.0f;
    for (int d0 = t; d0 < hd; d0 += MERGE_DIMS * threads) {
        bool first = d0 == t;
        float acc[MERGE_DIMS];
#pragma unroll
        for (int e = 0; e < MERGE_DIMS; e++) acc[e] = 0.0f;
        for (int s0 = 0; s0 < np; s0 += MERGE_BATCH) {
            float m[MERGE_BATCH], l[MERGE_BATCH], v[MERGE_BATCH][MERGE_DIMS];
#pragma unroll
            for (int b = 0; b < MERGE_BATCH; b++) {
                const float* p = base + (s0 + b) * stride;
                bool in = s0 + b < np;
                m[b] = in ? __ldcg(p + hd) : 0.0f;
                l[b] = in && first ? __ldcg(p + hd + 1) : 0.0f;
#pragma unroll
                for (int e = 0; e < MERGE_DIMS; e++) {
                    int d = d0 + e * threads;
                    v[b][e] = in && d < hd ? __ldcg(p + d) : 0.0f;
                }
            }
#pragma unroll
            for (int b = 0; b < MERGE_BATCH; b++) {
                if (s0 + b >= np) break;
                float w = expf(m[b] - mm);
                if (first) ll += l[b] * w;
#pragma unroll
                for (int e = 0; e < MERGE_DIMS; e++) acc[e] += v[b][e] * w;
            }
        }
#pragma unroll
        for (int e = 0; e < MERGE_DIMS; e++) {
            int d = d0 + e * threads;
            if (d < hd) dst[d] = acc[e] / ll;
        }
    }
}

// Part s of the causal attention of query row r0 + blockIdx.x (q: [n, qh, hd]; cache row
// row0 + that row) over cache rows s·KEYS .. min(len, (s + 1)·KEYS), len = its row + 1.
// Grid (rows, qh, parts); a block of 32·W threads. Dynamic shared memory:
// 32 + hd + W·hd + KEYS floats. Each part writes hd weighted sums of V, then its max score
// and its sum of exponentials, to `part` ([rows, qh, parts, hd + 2]); the part that finishes
// last for its (row, head) (counted in `done`, which it sets back to 0) merges them all in
// part order into out ([n, qh, hd]): the largest max first, then the parts' sums rescaled to
// it. A row's output does not depend on which part finished last.
template <typename KV>
__device__ __forceinline__ void attend_part(const float* q, const unsigned long long* kv,
                                            int layer, float* part, int* done, float* out,
                                            int qh, int kvh, int hd, const unsigned* meta,
                                            float scale, int r0, int parts) {
    extern __shared__ float sh[];
    __shared__ int last;
    const KV* kc = (const KV*)kv[2 * layer];
    const KV* vc = (const KV*)kv[2 * layer + 1];
    int r = r0 + blockIdx.x, h = blockIdx.y, ps = blockIdx.z;
    int g = h / (qh / kvh);
    int len = (int)meta[0] + r + 1, kvd = kvh * hd;
    int np = (len + KEYS - 1) / KEYS;
    int j0 = ps * KEYS;
    if (j0 >= len) return;
    int cnt = min(KEYS, len - j0);
    int warps = blockDim.x >> 5, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float* red = sh;
    float* qs = red + 32;
    float* acc = qs + hd;
    float* sc = acc + warps * hd;
    const float* qrow = q + ((long long)r * qh + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qrow[d];
    __syncthreads();
    float m = NEG_INF;
    // A key's score: lane i takes dimensions 4i .. 4i + 3 (and 4i + 128 .., for heads
    // over 128), then the warp's fixed tree sums them. A warp scores keys warp, warp + W,
    // ..., ATTEND_INFLIGHT at a time, so a lane has that many keys' loads in flight (K rows
    // come from DRAM).
    const float4* q4 = reinterpret_cast<const float4*>(qs);
    int hd4 = hd >> 2;
    for (int j = warp; j < cnt; j += ATTEND_INFLIGHT * warps) {
        float t[ATTEND_INFLIGHT];
#pragma unroll
        for (int u = 0; u < ATTEND_INFLIGHT; u++) t[u] = 0.0f;
        for (int d = lane; d < hd4; d += 32) {
            float4 a = q4[d];
#pragma unroll
            for (int u = 0; u < ATTEND_INFLIGHT; u++) {
                int jj = j + u * warps;
                if (jj < cnt) {
                    float4 b = kv_get4(kc + (long long)(j0 + jj) * kvd + g * hd + 4 * d);
                    float v = t[u];
                    v = __fmaf_rn(a.x, b.x, v);
                    v = __fmaf_rn(a.y, b.y, v);
                    v = __fmaf_rn(a.z, b.z, v);
                    v = __fmaf_rn(a.w, b.w, v);
                    t[u] = v;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < ATTEND_INFLIGHT; u++) {
            int jj = j + u * warps;
            float v = warp_sum(t[u]) * scale;
            if (jj < cnt) {
                if (lane == 0) sc[jj] = v;
                m = fmaxf(m, v);
            }
        }
    }
    m = block_max(m, red);
    float l = 0.0f;
    for (int j = threadIdx.x; j < cnt; j += blockDim.x) {
        float e = expf(sc[j] - m);
        sc[j] = e;
        l += e;
    }
    l = block_sum(l, red);
    // The weighted sum of V: warp w takes a run of keys, lane i dimensions 4i .. 4i + 3
    // (a 16-byte load a key, all the warp's loads one contiguous row), eight keys' loads in
    // flight; each dimension's sum runs over the warp's keys in order, and the warps' sums
    // are added in warp order below.
    int chunk = (cnt + warps - 1) / warps;
    int a0 = warp * chunk, a1 = min(cnt, a0 + chunk);
    for (int d = lane; d < hd4; d += 32) {
        float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const KV* v = vc + (long long)j0 * kvd + g * hd + 4 * d;
#pragma unroll 8
        for (int j = a0; j < a1; j++) {
            float4 b = kv_get4(v + (long long)j * kvd);
            float e = sc[j];
            t.x = __fmaf_rn(e, b.x, t.x);
            t.y = __fmaf_rn(e, b.y, t.y);
            t.z = __fmaf_rn(e, b.z, t.z);
            t.w = __fmaf_rn(e, b.w, t.w);
        }
        reinterpret_cast<float4*>(acc + warp * hd)[d] = t;
    }
    __syncthreads();
    if (np == 1) {
        // The only part: what the merge below would compute (a rescale by exp(0) = 1).
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float t = 0.0f;
            for (int w = 0; w < warps; w++) t += acc[w * hd + d];
            out[((long long)r * qh + h) * hd + d] = t / l;
        }
        return;
    }
    float* base = part + ((long long)blockIdx.x * qh + h) * parts * (hd + 2);
    float* o = base + ps * (hd + 2);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float t = 0.0f;
        for (int w = 0; w < warps; w++) t += acc[w * hd + d];
        o[d] = t;
    }
    if (threadIdx.x == 0) {
        o[hd] = m;
        o[hd + 1] = l;
    }
    // Publish this part, then count it; the row and head's last part merges.
    __threadfence();
    __syncthreads();
    int* counter = done + blockIdx.x * qh + h;
    if (threadIdx.x == 0) last = atomicAdd(counter, 1) == np - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    merge_parts<4, 1>(base, np, hd, out + ((long long)r * qh + h) * hd, threadIdx.x, blockDim.x);
    if (threadIdx.x == 0) *counter = 0;
}

// A prefill chunk's attention: the same arithmetic as attend_part for each (row, head), with
// each part's keys and values read from DRAM once for many rows and heads. A block takes
// part blockIdx.z of KV head blockIdx.y for ATILE_ROWS consecutive rows of the launch
// (blockIdx.x) and the query heads that share that KV head: it copies the part's rows of K
// and V (f16, as the cache stores them) into shared memory, then ATILE_GROUPS groups of
// ATTEND_WARPS warps take the (row, head) pairs in turn, each running attend_part's code
// over the copies: the same scores, reductions (a group's barrier where attend_part's
// block has its own), sums and merge, so a row's output is the same bits whichever
// kernel computed it. Dynamic shared memory (none static): 2 · KEYS · hd halves, then per
// group 32 + hd + ATTEND_WARPS · hd + KEYS floats, then a flag (an int) per group.
// Eight groups (32 warps): a block's copy takes most of a multiprocessor's shared memory,
// so it is one block a multiprocessor; with two groups the tiles ran at half the per-row
// kernel's speed on an H100, with eight 4-7% above it from 4K tokens (h200.md, 2026-12-06).
#define ATILE_ROWS 16
#define ATILE_GROUPS 8

// A group's barrier: named barrier 1 + group over its 32 · ATTEND_WARPS threads.
__device__ __forceinline__ void group_sync(int group) {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + group), "r"(32 * ATTEND_WARPS));
}

__device__ float group_sum(float v, float* red, int group) {
    int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % ATTEND_WARPS;
    v = warp_sum(v);
    group_sync(group);
    if (lane == 0) red[warp] = v;
    group_sync(group);
    return warp_sum(lane < ATTEND_WARPS ? red[lane] : 0.0f);
}

__device__ float group_max(float v, float* red, int group) {
    int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % ATTEND_WARPS;
    v = warp_max(v);
    group_sync(group);
    if (lane == 0) red[warp] = v;
    group_sync(group);
    return warp_max(lane < ATTEND_WARPS ? red[lane] : NEG_INF);
}

extern "C" __global__ void __launch_bounds__(32 * ATTEND_WARPS * ATILE_GROUPS) attend_tile_h(
    const float* q, const unsigned long long* kv, int layer, float* part, int* done, float* out,
    int qh, int kvh, int hd, const unsigned* meta, float scale, int r0, int parts, int nrows) {
    GRID_ORDER();
    typedef unsigned short KV;
    extern __shared__ int4 tile_sh[];
    const KV* kc = (const KV*)kv[2 * layer];
    const KV* vc = (const KV*)kv[2 * layer + 1];
    const int warps = ATTEND_WARPS, gthreads = 32 * ATTEND_WARPS;
    int g = blockIdx.y, ps = blockIdx.z, kvd = kvh * hd;
    int i0 = blockIdx.x * ATILE_ROWS, i1 = min(nrows, i0 + ATILE_ROWS);
    int j0 = ps * KEYS;
    // The tile's last row sees the most keys; a part past it is empty for every row.
    int len_max = (int)meta[0] + r0 + i1;
    if (j0 >= len_max) return;
    int cnt_t = min(KEYS, len_max - j0);
    KV* sk = reinterpret_cast<KV*>(tile_sh);
    KV* sv = sk + KEYS * hd;
    int per = hd / 8;  // 16-byte pieces a row
    for (int t = threadIdx.x; t < cnt_t * per; t += blockDim.x) {
        int j = t / per, p = t - j * per;
        const uint4* ks = reinterpret_cast<const uint4*>(kc + (long long)(j0 + j) * kvd + g * hd);
        const uint4* vs = reinterpret_cast<const uint4*>(vc + (long long)(j0 + j) * kvd + g * hd);
        reinterpret_cast<uint4*>(sk + j * hd)[p] = ks[p];
        reinterpret_cast<uint4*>(sv + j * hd)[p] = vs[p];
    }
    __syncthreads();
    int group = threadIdx.x / gthreads, gt = threadIdx.x % gthreads;
    int lane = gt & 31, warp = gt >> 5;
    float* groups = reinterpret_cast<float*>(sv + KEYS * hd);
    // Each group's `last` flag after both groups' buffers.
    int* last = reinterpret_cast<int*>(groups + ATILE_GROUPS * (32 + hd + warps * hd + KEYS));
    float* red = groups + group * (32 + hd + warps * hd + KEYS);
    float* qs = red + 32;
    float* acc = qs + hd;
    float* sc = acc + warps * hd;
    int G = qh / kvh, hd4 = hd >> 2;
    for (int pp = group; pp < ATILE_ROWS * G; pp += ATILE_GROUPS) {
        int i = i0 + pp / G, h = g * G + pp % G;
        int r = r0 + i, len = (int)meta[0] + r + 1;
        // The same for the whole group: it skips a pair together.
        if (i >= i1 || j0 >= len) continue;
        int np = (len + KEYS - 1) / KEYS, cnt = min(KEYS, len - j0);
        // The group's previous pair is done with qs, acc and sc.
        group_sync(group);
        const float* qrow = q + ((long long)r * qh + h) * hd;
        for (int d = gt; d < hd; d += gthreads) qs[d] = qrow[d];
        group_sync(group);
        float m = NEG_INF;
        const float4* q4 = reinterpret_cast<const float4*>(qs);
        for (int j = warp; j < cnt; j += ATTEND_INFLIGHT * warps) {
            float t[ATTEND_INFLIGHT];
#pragma unroll
            for (int u = 0; u < ATTEND_INFLIGHT; u++) t[u] = 0.0f;
            for (int d = lane; d < hd4; d += 32) {
                float4 a = q4[d];
#pragma unroll
                for (int u = 0; u < ATTEND_INFLIGHT; u++) {
                    int jj = j + u * warps;
                    if (jj < cnt) {
                        float4 b = kv_get4(sk + jj * hd + 4 * d);
                        float v = t[u];
                        v = __fmaf_rn(a.x, b.x, v);
                        v = __fmaf_rn(a.y, b.y, v);
                        v = __fmaf_rn(a.z, b.z, v);
                        v = __fmaf_rn(a.w, b.w, v);
                        t[u] = v;
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < ATTEND_INFLIGHT; u++) {
                int jj = j + u * warps;
                float v = warp_sum(t[u]) * scale;
                if (jj < cnt) {
                    if (lane == 0) sc[jj] = v;
                    m = fmaxf(m, v);
                }
            }
        }
        m = group_max(m, red, group);
        float l = 0.0f;
        for (int j = gt; j < cnt; j += gthreads) {
            float e = expf(sc[j] - m);
            sc[j] = e;
            l += e;
        }
        l = group_sum(l, red, group);
        int chunk = (cnt + warps - 1) / warps;
        int a0 = warp * chunk, a1 = min(cnt, a0 + chunk);
        for (int d = lane; d < hd4; d += 32) {
            float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            const KV* v = sv + 4 * d;
#pragma unroll 8
            for (int j = a0; j < a1; j++) {
                float4 b = kv_get4(v + j * hd);
                float e = sc[j];
                t.x = __fmaf_rn(e, b.x, t.x);
                t.y = __fmaf_rn(e, b.y, t.y);
                t.z = __fmaf_rn(e, b.z, t.z);
                t.w = __fmaf_rn(e, b.w, t.w);
            }
            reinterpret_cast<float4*>(acc + warp * hd)[d] = t;
        }
        group_sync(group);
        if (np == 1) {
            for (int d = gt; d < hd; d += gthreads) {
                float t = 0.0f;
                for (int w = 0; w < warps; w++) t += acc[w * hd + d];
                out[((long long)r * qh + h) * hd + d] = t / l;
            }
            continue;
        }
        float* base = part + ((long long)i * qh + h) * parts * (hd + 2);
        float* o = base + ps * (hd + 2);
        for (int d = gt; d < hd; d += gthreads) {
            float t = 0.0f;
            for (int w = 0; w < warps; w++) t += acc[w * hd + d];
            o[d] = t;
        }
        if (gt == 0) {
            o[hd] = m;
            o[hd + 1] = l;
        }
        __threadfence();
        group_sync(group);
        int* counter = done + i * qh + h;
        if (gt == 0) last[group] = atomicAdd(counter, 1) == np - 1;
        group_sync(group);
        if (!last[group]) continue;
        __threadfence();
        merge_parts<4, 1>(base, np, hd, out + ((long long)r * qh + h) * hd, gt, gthreads);
        if (gt == 0) *counter = 0;
    }
}

// Attention on tensor cores (f16 caches, sm_80 and later): every query row of a launch,
// a decode step's one row as a prefill chunk's many, goes through this kernel when the
// device has it, so a row's output is the same bits however many rows share its launch.
//
// A block takes part blockIdx.z (cache rows s·KEYS .. (s + 1)·KEYS) of KV head blockIdx.y
// for the (row, head) pairs of AMMA_ROWS(G) = 64 / G consecutive rows of the launch
// (blockIdx.x) and the G query heads that share the KV head: pair p is row p / G, head
// p % G, and warp w computes pairs 16 w .. 16 w + 15 as the rows of its `mma` tiles (a
// decode step: one row, G pairs, the other rows of the tile zero and never stored). The
// part's K and V rows come into shared memory AMMA_CHUNK at a time (`cp.async`, the next
// chunk's copy in flight while this one is computed; rows past the block's last key are
// zeros). For each chunk in order, a pair's scores are q · k from `mma.m16n8k16` on f16
// (q split into two halves, q = hi + lo, both multiplied, so the scores keep q's f32
// precision: the keys are f16 as stored), times `scale`; then its running maximum m, the
// sum l of exp(score − m) (its lanes' values in a fixed order, then the quad's), the
// weighted sums of V rescaled by exp(m_old − m), and p · V from `mma` with p split the same
// way. Each output element of an `mma` depends on its own row of A and column of B only,
// and every step runs in the same order for every pair, so a pair's part does not depend
// on the other pairs in its tile. The part's sums, m and l go to `part` and the last part
// to finish for a pair merges them (`merge_parts`; a row whose context fits one part
// writes sums / l directly).
//
// Dynamic shared memory: two buffers each of K and V, AMMA_CHUNK rows of HD + 8 halves (16
// bytes of padding a row, so a quad's and an `ldmatrix`'s rows fall on distinct banks).
//
// SPLIT (a launch of at most 16 / G rows: a decode step, a verify block): the block's pairs
// fit one tile, and its four warps share that tile's work instead of one warp doing it all
// (a chunk's `mma`s and exponentials, in series in one warp, were most of a decode step's
// attention): warp w computes the scores of keys 16 w .. 16 w + 15 of each chunk, their
// exponentials and the `p · V` fragments of k-step w (those same keys), and the weighted
// sums of dimensions HD / 4 · w .. + HD / 4 − 1. The masked scores, the exponentials and
// the fragments meet in shared memory; every warp takes the chunk's maxima and sums from
// there in the order one warp takes them. Each number comes from the same operations in
// the same order as in a warp that computes all of them, so a pair's part is the same bits
// either way. (Measured on an H100, one row at 512 / 4K / 8K keys: 20.0 / 22.8 / 26.6 us
// one warp, 16.8 / 19.7 / 25.1 with the scores split alone, 13.9 / 15.9 / 22.2 so.)
#define AMMA_WARPS 4
#define AMMA_CHUNK 64
// The pairs of one warp's tile, and of a block (16 · AMMA_WARPS).
#define AMMA_TILE 16
#define AMMA_PAIRS 64
// The most parts of KEYS keys one block takes, one after another (the launch's grid says
// how many: `parts_a_block` in device/attention.rs). A source without it is launched a block
// a part.
#define AMMA_SPAN 8
// SPLIT: each warp's score tiles are one k-step's of p · V (two 8-key tiles).
static_assert(AMMA_CHUNK / 8 / AMMA_WARPS == 2, "a warp's score tiles make one PV k-step");

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
// D = A · B + D for a 16 × 16 A (f16, row-major fragments) and a 16 × 8 B (f16, by column).
__device__ __forceinline__ void mma_f16(const unsigned* a, unsigned b0, unsigned b1, float* d) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8 × 8 matrices of halves from shared memory: lanes 8m .. 8m + 7 point at matrix m's
// rows; the lane of quad g, place c gets row g's halves 2c, 2c + 1 of matrix m in b[m].
__device__ __forceinline__ void ldmatrix_x4(unsigned* b, const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(shared_address(row)));
}

// The B fragments (K's rows as columns) of score tiles n and n + 1 of a chunk at ks for
// dimensions 16 k .. 16 k + 15, in one load: b[0], b[1] tile n's, b[2], b[3] tile n + 1's,
// the halves the lane would read itself (row 8 n + its quad, dimensions 16 k + 2 c and
// 16 k + 8 + 2 c), so the same mma operands.
template <int HD>
__device__ __forceinline__ void amma_k_pair(unsigned* b, const unsigned short* ks, int n, int k,
                                            int lane) {
    int m = lane >> 3;
    ldmatrix_x4(b, ks + (8 * (n + (m >> 1)) + (lane & 7)) * (HD + 8) + 16 * k + 8 * (m & 1));
}

// Four 8 × 8 matrices of halves from shared memory, transposed: the rows lanes 8m .. 8m + 7
// point at become matrix m's columns (fragment b[m]).
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* b, const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(shared_address(row)));
}

// 16 bytes from src, or zeros when !in (src must still be a valid address).
__device__ __forceinline__ void copy16_or_zero(void* dst, const void* src, bool in) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(dst)),
                 "l"(src), "r"(in ? 16 : 0));
}

__device__ __forceinline__ unsigned short f16_of(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

// Two floats as two pairs of halves: x ≈ hi + lo (hi the nearest half, lo the nearest half
// of the exact remainder), a in the low 16 bits of each word.
__device__ __forceinline__ void split_pair(float a, float b, unsigned* hi, unsigned* lo) {
    unsigned short ha = f16_of(a), hb = f16_of(b);
    unsigned short la = f16_of(a - half_bits(ha)), lb = f16_of(b - half_bits(hb));
    *hi = (unsigned)ha | ((unsigned)hb << 16);
    *lo = (unsigned)la | ((unsigned)lb << 16);
}

// Rows j .. j + AMMA_CHUNK − 1 of KV head g's K and V into sk and sv (HD + 8 halves a row);
// rows at or past kend are zeros.
template <int HD>
__device__ __forceinline__ void amma_load(unsigned short* sk, unsigned short* sv,
                                          const unsigned short* kc, const unsigned short* vc,
                                          int kvd, int g, int j, int kend) {
    const int per = HD / 8;
    for (int t = threadIdx.x; t < AMMA_CHUNK * per; t += blockDim.x) {
        int r = t / per, p = t - r * per;
        bool in = j + r < kend;
        long long off = (long long)(in ? j + r : j) * kvd + g * HD + 8 * p;
        copy16_or_zero(sk + r * (HD + 8) + 8 * p, kc + off, in);
        copy16_or_zero(sv + r * (HD + 8) + 8 * p, vc + off, in);
    }
}

// Two consecutive output values of a pair: v / l to `direct` when the pair's context is
// one part (`alone`), else v to its part's slot.
__device__ __forceinline__ void amma_store_pair(bool alone, float* direct, float* slot, float v0,
                                                float v1, float l) {
    if (alone) {
        direct[0] = v0 / l;
        direct[1] = v1 / l;
    } else {
        slot[0] = v0;
        slot[1] = v1;
    }
}

// A score tile's two keys of rows a (x, y) and b (z, w) scaled, or −inf past the pair's own
// row (key0: the lane's first key of the tile).
__device__ __forceinline__ void amma_mask(float* s, int key0, int posa, int posb, float scale) {
#pragma unroll
    for (int e = 0; e < 2; e++) {
        s[e] = key0 + e <= posa ? s[e] * scale : NEG_INF;
        s[2 + e] = key0 + e <= posb ? s[2 + e] * scale : NEG_INF;
    }
}

// A chunk's maxima of the lane's keys (xa, xb) made the quad's, and the new running maxima.
__device__ __forceinline__ void amma_maxima(float* xa, float* xb, float ma, float mb, float* na,
                                            float* nb) {
    *xa = fmaxf(*xa, __shfl_xor_sync(FULL_MASK, *xa, 1));
    *xa = fmaxf(*xa, __shfl_xor_sync(FULL_MASK, *xa, 2));
    *xb = fmaxf(*xb, __shfl_xor_sync(FULL_MASK, *xb, 1));
    *xb = fmaxf(*xb, __shfl_xor_sync(FULL_MASK, *xb, 2));
    *na = fmaxf(ma, *xa);
    *nb = fmaxf(mb, *xb);
}

// A score tile's exponentials exp(s − n) (0 for a pair with no key yet: never exp(−inf − −inf)).
__device__ __forceinline__ void amma_exp(float* s, float na, float nb) {
#pragma unroll
    for (int e = 0; e < 2; e++) {
        s[e] = na == NEG_INF ? 0.0f : expf(s[e] - na);
        s[2 + e] = nb == NEG_INF ? 0.0f : expf(s[2 + e] - nb);
    }
}

// The running state after a chunk whose exponentials sum to sa, sb (the lane's, in key
// order) under the new maxima na, nb: l and the output tiles rescaled by exp(m_old − m).
template <int OT>
__device__ __forceinline__ void amma_update(float sa, float sb, float na, float nb, float* ma,
                                            float* mb, float* la, float* lb, float (*o)[4]) {
    float ra = na == NEG_INF ? 1.0f : expf(*ma - na);
    float rb = nb == NEG_INF ? 1.0f : expf(*mb - nb);
    sa += __shfl_xor_sync(FULL_MASK, sa, 1);
    sa += __shfl_xor_sync(FULL_MASK, sa, 2);
    sb += __shfl_xor_sync(FULL_MASK, sb, 1);
    sb += __shfl_xor_sync(FULL_MASK, sb, 2);
    *la = __fmaf_rn(*la, ra, sa);
    *lb = __fmaf_rn(*lb, rb, sb);
    *ma = na;
    *mb = nb;
#pragma unroll
    for (int d = 0; d < OT; d++) {
        o[d][0] *= ra;
        o[d][1] *= ra;
        o[d][2] *= rb;
        o[d][3] *= rb;
    }
}

// p · V for k-step k (keys 16 k .. 16 k + 15 of the chunk at vs) into the lane's OT output
// tiles, which are dimension tiles first, first + 1, ... of the head.
template <int HD, int OT>
__device__ __forceinline__ void amma_pv(const unsigned* phi, const unsigned* plo,
                                        const unsigned short* vs, int k, int first, int lane,
                                        float (*o)[4]) {
    const unsigned short* vrow =
        vs + (16 * k + (lane & 7) + ((lane >> 3) & 1) * 8) * (HD + 8) + (lane >> 4) * 8;
#pragma unroll
    for (int d = 0; d < OT; d += 2) {
        unsigned b[4];
        ldmatrix_x4_trans(b, vrow + 8 * (first + d));
        mma_f16(phi, b[0], b[1], o[d]);
        mma_f16(plo, b[0], b[1], o[d]);
        mma_f16(phi, b[2], b[3], o[d + 1]);
        mma_f16(plo, b[2], b[3], o[d + 1]);
    }
}

template <int HD, bool SPLIT>
__device__ __forceinline__ void attend_mma_body(const float* q, const unsigned long long* kv,
                                                int layer, float* part, int* done, float* out,
                                                int qh, int kvh, const unsigned* meta,
                                                float scale, int r0, int parts, int nrows) {
    typedef unsigned short KV;
    const int STRIDE = HD + 8;
    // SPLIT: a warp's share of a chunk's 8-key score tiles and of the 8-dimension output
    // tiles (its o holds only those).
    const int NPW = AMMA_CHUNK / 8 / AMMA_WARPS, DPW = HD / 8 / AMMA_WARPS;
    const int OT = SPLIT ? DPW : HD / 8;
    extern __shared__ int4 amma_sh[];
    KV* sk = reinterpret_cast<KV*>(amma_sh);
    KV* sv = sk + 2 * AMMA_CHUNK * STRIDE;
    const KV* kc = (const KV*)kv[2 * layer];
    const KV* vc = (const KV*)kv[2 * layer + 1];
    int G = qh / kvh, g = blockIdx.y, kvd = kvh * HD;
    int rows_blk = (SPLIT ? AMMA_TILE : AMMA_PAIRS) / G, npairs = rows_blk * G;
    int i0 = blockIdx.x * rows_blk, i1 = min(nrows, i0 + rows_blk);
    // Launch row i is cache row pos0 + i; the block's last row sees the most keys, kmax.
    int pos0 = (int)meta[0] + r0, kmax = pos0 + i1;
    // The block's parts p0 .. p1 − 1, one after another: the launch's gridDim.z blocks share
    // the `parts` parts evenly (the host gives a long context's parts several a block, so
    // fewer blocks pay the prologue, the publishing and the count). Each part is computed
    // from a fresh state into its own slot, as a block of one part computes it.
    int per = (parts + gridDim.z - 1) / gridDim.z;
    int p0 = blockIdx.z * per, p1 = min(min(parts, p0 + per), (kmax + KEYS - 1) / KEYS);
    if (p0 >= p1) return;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, cq = lane & 3;
    // The lane's two pairs: tile rows gq (a) and gq + 8 (b) of its warp's tile (SPLIT: the
    // one tile, every warp's).
    int pa = (SPLIT ? 0 : warp * AMMA_TILE) + gq, pb = pa + 8;
    int ia = i0 + pa / G, ib = i0 + pb / G;
    bool va = pa < npairs && ia < i1, vb = pb < npairs && ib < i1;
    int posa = pos0 + ia, posb = pos0 + ib;
    // The pairs' parts: straight to out where a row's context is one part, else to `part`,
    // counted, and merged by the last.
    int npa = (posa + KEYS) / KEYS, npb = (posb + KEYS) / KEYS;
    int ha = g * G + pa % G, hb = g * G + pb % G;
    float* ba = part + ((long long)ia * qh + ha) * parts * (HD + 2);
    float* bb = part + ((long long)ib * qh + hb) * parts * (HD + 2);
    float* oa = out + ((long long)(r0 + ia) * qh + ha) * HD;
    float* ob = out + ((long long)(r0 + ib) * qh + hb) * HD;
    // (SPLIT: every warp holds the same m and l; warp 0 writes and counts them.)
    bool counts = cq == 0 && (!SPLIT || warp == 0);
    // q's fragments for each 16 dimensions, as hi and lo halves (zeros for unused rows).
    unsigned qhi[HD / 16][4], qlo[HD / 16][4];
    {
        const float* qa = q + ((long long)(r0 + ia) * qh + g * G + pa % G) * HD + 2 * cq;
        const float* qb = q + ((long long)(r0 + ib) * qh + g * G + pb % G) * HD + 2 * cq;
#pragma unroll
        for (int k = 0; k < HD / 16; k++) {
            float2 z = make_float2(0.0f, 0.0f);
            float2 a0 = va ? *reinterpret_cast<const float2*>(qa + 16 * k) : z;
            float2 a1 = va ? *reinterpret_cast<const float2*>(qa + 16 * k + 8) : z;
            float2 b0 = vb ? *reinterpret_cast<const float2*>(qb + 16 * k) : z;
            float2 b1 = vb ? *reinterpret_cast<const float2*>(qb + 16 * k + 8) : z;
            split_pair(a0.x, a0.y, &qhi[k][0], &qlo[k][0]);
            split_pair(b0.x, b0.y, &qhi[k][1], &qlo[k][1]);
            split_pair(a1.x, a1.y, &qhi[k][2], &qlo[k][2]);
            split_pair(b1.x, b1.y, &qhi[k][3], &qlo[k][3]);
        }
    }
    for (int ps = p0; ps < p1; ps++) {
        int j0 = ps * KEYS, kend = min(j0 + KEYS, kmax);
        int chunks = (kend - j0 + AMMA_CHUNK - 1) / AMMA_CHUNK;
        bool ina = va && j0 <= posa, inb = vb && j0 <= posb;
        bool busy = __any_sync(FULL_MASK, ina || inb);
        float o[OT][4];
#pragma unroll
        for (int d = 0; d < OT; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
        float ma = NEG_INF, mb = NEG_INF, la = 0.0f, lb = 0.0f;
        amma_load<HD>(sk, sv, kc, vc, kvd, g, j0, kend);
        copies_commit();
        for (int c = 0; c < chunks; c++) {
            if (c + 1 < chunks) {
                int nb = (c + 1) & 1;
                amma_load<HD>(sk + nb * AMMA_CHUNK * STRIDE, sv + nb * AMMA_CHUNK * STRIDE, kc, vc,
                              kvd, g, j0 + (c + 1) * AMMA_CHUNK, kend);
            }
            copies_commit();
            copies_wait<1>();
            __syncthreads();
            if (busy) {
                const KV* ks = sk + (c & 1) * AMMA_CHUNK * STRIDE;
                const KV* vs = sv + (c & 1) * AMMA_CHUNK * STRIDE;
                int jc = j0 + c * AMMA_CHUNK;
                // The chunk's scores (SPLIT: this warp's tiles), then the state's update; the PV
                // fragments (hi, lo) of k-step k in phk[k], plk[k] (SPLIT: from shared memory,
                // each k-step's made by the warp that computed its two score tiles).
                float s[AMMA_CHUNK / 8][4];
                float xa = NEG_INF, xb = NEG_INF;
                if (SPLIT) {
                    // Masked, scaled scores of every tile, then the exponentials of every tile,
                    // and the PV fragments of every k-step, each made by one warp.
                    __shared__ float4 amma_s[AMMA_CHUNK / 8][32];
                    __shared__ float4 amma_e[AMMA_CHUNK / 8][32];
                    __shared__ uint4 amma_p[AMMA_CHUNK / 16][2][32];
                    float sw[NPW][4];
#pragma unroll
                    for (int n = 0; n < NPW; n++) sw[n][0] = sw[n][1] = sw[n][2] = sw[n][3] = 0.0f;
#pragma unroll
                    for (int k = 0; k < HD / 16; k++) {
#pragma unroll
                        for (int n = 0; n < NPW; n += 2) {
                            unsigned b[4];
                            amma_k_pair<HD>(b, ks, warp * NPW + n, k, lane);
                            mma_f16(qhi[k], b[0], b[1], sw[n]);
                            mma_f16(qlo[k], b[0], b[1], sw[n]);
                            mma_f16(qhi[k], b[2], b[3], sw[n + 1]);
                            mma_f16(qlo[k], b[2], b[3], sw[n + 1]);
                        }
                    }
#pragma unroll
                    for (int n = 0; n < NPW; n++) {
                        amma_mask(sw[n], jc + 8 * (warp * NPW + n) + 2 * cq, posa, posb, scale);
                        amma_s[warp * NPW + n][lane] = make_float4(sw[n][0], sw[n][1], sw[n][2], sw[n][3]);
                    }
                    __syncthreads();
#pragma unroll
                    for (int n = 0; n < AMMA_CHUNK / 8; n++) {
                        float4 v = amma_s[n][lane];
                        xa = fmaxf(fmaxf(xa, v.x), v.y);
                        xb = fmaxf(fmaxf(xb, v.z), v.w);
                    }
                    float na, nb;
                    amma_maxima(&xa, &xb, ma, mb, &na, &nb);
#pragma unroll
                    for (int n = 0; n < NPW; n++) {
                        amma_exp(sw[n], na, nb);
                        amma_e[warp * NPW + n][lane] = make_float4(sw[n][0], sw[n][1], sw[n][2], sw[n][3]);
                    }
                    // k-step `warp`: its two score tiles are this warp's (NPW = 2).
                    unsigned ph[4], pl[4];
                    split_pair(sw[0][0], sw[0][1], &ph[0], &pl[0]);
                    split_pair(sw[0][2], sw[0][3], &ph[1], &pl[1]);
                    split_pair(sw[1][0], sw[1][1], &ph[2], &pl[2]);
                    split_pair(sw[1][2], sw[1][3], &ph[3], &pl[3]);
                    amma_p[warp][0][lane] = make_uint4(ph[0], ph[1], ph[2], ph[3]);
                    amma_p[warp][1][lane] = make_uint4(pl[0], pl[1], pl[2], pl[3]);
                    __syncthreads();
                    float sa = 0.0f, sb = 0.0f;
#pragma unroll
                    for (int n = 0; n < AMMA_CHUNK / 8; n++) {
                        float4 v = amma_e[n][lane];
                        sa += v.x;
                        sa += v.y;
                        sb += v.z;
                        sb += v.w;
                    }
                    amma_update<OT>(sa, sb, na, nb, &ma, &mb, &la, &lb, o);
#pragma unroll
                    for (int k = 0; k < AMMA_CHUNK / 16; k++) {
                        uint4 h = amma_p[k][0][lane], l = amma_p[k][1][lane];
                        unsigned phi[4] = {h.x, h.y, h.z, h.w}, plo[4] = {l.x, l.y, l.z, l.w};
                        amma_pv<HD, OT>(phi, plo, vs, k, DPW * warp, lane, o);
                    }
                } else {
#pragma unroll
                    for (int n = 0; n < AMMA_CHUNK / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
                    for (int k = 0; k < HD / 16; k++) {
#pragma unroll
                        for (int n = 0; n < AMMA_CHUNK / 8; n += 2) {
                            unsigned b[4];
                            amma_k_pair<HD>(b, ks, n, k, lane);
                            mma_f16(qhi[k], b[0], b[1], s[n]);
                            mma_f16(qlo[k], b[0], b[1], s[n]);
                            mma_f16(qhi[k], b[2], b[3], s[n + 1]);
                            mma_f16(qlo[k], b[2], b[3], s[n + 1]);
                        }
                    }
                    // Scaled, masked (a key past the pair's own row: −inf), the chunk's maxima.
#pragma unroll
                    for (int n = 0; n < AMMA_CHUNK / 8; n++) {
                        amma_mask(s[n], jc + 8 * n + 2 * cq, posa, posb, scale);
                        xa = fmaxf(fmaxf(xa, s[n][0]), s[n][1]);
                        xb = fmaxf(fmaxf(xb, s[n][2]), s[n][3]);
                    }
                    float na, nb;
                    amma_maxima(&xa, &xb, ma, mb, &na, &nb);
                    float sa = 0.0f, sb = 0.0f;
#pragma unroll
                    for (int n = 0; n < AMMA_CHUNK / 8; n++) {
                        amma_exp(s[n], na, nb);
                        sa += s[n][0];
                        sa += s[n][1];
                        sb += s[n][2];
                        sb += s[n][3];
                    }
                    amma_update<OT>(sa, sb, na, nb, &ma, &mb, &la, &lb, o);
                    // p · V, 16 keys at a time: the scores' fragments are the A fragments.
#pragma unroll
                    for (int k = 0; k < AMMA_CHUNK / 16; k++) {
                        unsigned phi[4], plo[4];
                        split_pair(s[2 * k][0], s[2 * k][1], &phi[0], &plo[0]);
                        split_pair(s[2 * k][2], s[2 * k][3], &phi[1], &plo[1]);
                        split_pair(s[2 * k + 1][0], s[2 * k + 1][1], &phi[2], &plo[2]);
                        split_pair(s[2 * k + 1][2], s[2 * k + 1][3], &phi[3], &plo[3]);
                        amma_pv<HD, OT>(phi, plo, vs, k, 0, lane, o);
                    }
                }
            }
            // The buffer just read is refilled by the next chunk's copies.
            __syncthreads();
        }
        if (busy) {
            // A pair's two values of dimension tile d: straight to out (over l) where its
            // context is this one part, else to its part's slot.
#pragma unroll
            for (int d = 0; d < OT; d++) {
                int dim = 8 * ((SPLIT ? DPW * warp : 0) + d) + 2 * cq;
                if (ina) amma_store_pair(npa == 1, oa + dim, ba + ps * (HD + 2) + dim, o[d][0], o[d][1], la);
                if (inb) amma_store_pair(npb == 1, ob + dim, bb + ps * (HD + 2) + dim, o[d][2], o[d][3], lb);
            }
            if (counts) {
                if (ina && npa > 1) {
                    ba[ps * (HD + 2) + HD] = ma;
                    ba[ps * (HD + 2) + HD + 1] = la;
                }
                if (inb && npb > 1) {
                    bb[ps * (HD + 2) + HD] = mb;
                    bb[ps * (HD + 2) + HD + 1] = lb;
                }
            }
        }
    }
    // Which of the block's pairs finished last here: bit 4t of word 0 (1) of a warp's entry,
    // its tile row t's (t + 8's) pair. Every warp takes a share of the merges below.
    __shared__ unsigned amma_last[AMMA_WARPS][2];
    unsigned last_a = 0, last_b = 0;
    // The pairs' parts among p0 .. p1 − 1: those at or below the pair's own row.
    int ca = va ? min(p1, npa) - p0 : 0, cb = vb ? min(p1, npb) - p0 : 0;
    if (__any_sync(FULL_MASK, ca > 0 || cb > 0)) {
        // Publish, then count: a quad's first lane counts its two pairs' parts (SPLIT: once
        // every warp has published its dimensions).
        __threadfence();
        if (SPLIT)
            __syncthreads();
        else
            __syncwarp();
        bool lasta = false, lastb = false;
        if (counts) {
            if (ca > 0 && npa > 1) lasta = atomicAdd(done + ia * qh + ha, ca) + ca == npa;
            if (cb > 0 && npb > 1) lastb = atomicAdd(done + ib * qh + hb, cb) + cb == npb;
        }
        last_a = __ballot_sync(FULL_MASK, lasta);
        last_b = __ballot_sync(FULL_MASK, lastb);
    }
    if (lane == 0) {
        amma_last[warp][0] = last_a;
        amma_last[warp][1] = last_b;
    }
    __syncthreads();
    __threadfence();
    // Pair p merged by warp p mod AMMA_WARPS: a decode step's G pairs (all in warp 0's tile)
    // merge side by side instead of one after another.
    for (int p = warp; p < AMMA_PAIRS; p += AMMA_WARPS) {
        int t = p % 16;
        unsigned mask = amma_last[p / 16][t < 8 ? 0 : 1];
        if (!((mask >> (4 * (t % 8))) & 1)) continue;
        int i = i0 + p / G, h = g * G + p % G;
        int np = (pos0 + i + KEYS) / KEYS;
        const float* base = part + ((long long)i * qh + h) * parts * (HD + 2);
        merge_parts<16, 4, true>(base, np, HD, out + ((long long)(r0 + i) * qh + h) * HD, lane, 32);
        if (lane == 0) done[i * qh + h] = 0;
    }
}

#define ATTEND_MMA(HD)                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * AMMA_WARPS) attend_mma_##HD(            \
        const float* q, const unsigned long long* kv, int layer, float* part, int* done,     \
        float* out, int qh, int kvh, const unsigned* meta, float scale, int r0, int parts,   \
        int nrows) {                                                                         \
        GRID_ORDER();                                                                        \
        attend_mma_body<HD, false>(q, kv, layer, part, done, out, qh, kvh, meta, scale, r0,  \
                                   parts, nrows);                                            \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * AMMA_WARPS) attend_mma_split_##HD(      \
        const float* q, const unsigned long long* kv, int layer, float* part, int* done,     \
        float* out, int qh, int kvh, const unsigned* meta, float scale, int r0, int parts,   \
        int nrows) {                                                                         \
        GRID_ORDER();                                                                        \
        attend_mma_body<HD, true>(q, kv, layer, part, done, out, qh, kvh, meta, scale, r0,   \
                                  parts, nrows);                                             \
    }
ATTEND_MMA(64)
ATTEND_MMA(128)
#endif

#define ATTEND_ARGS                                                                        \
    const float *q, const unsigned long long *kv, int layer, float *part, int *done,        \
        float *out, int qh, int kvh, int hd, const unsigned *meta, float scale, int r0,     \
        int parts
#define ATTEND_CALL q, kv, layer, part, done, out, qh, kvh, hd, meta, scale, r0, parts
extern "C" __global__ void attend(ATTEND_ARGS) {
    GRID_ORDER();
    attend_part<float>(ATTEND_CALL);
}
extern "C" __global__ void attend_h(ATTEND_ARGS) {
    GRID_ORDER();
    attend_part<unsigned short>(ATTEND_CALL);
}

// out[r, i] = silu(gu[r, i]) * gu[r, width + i] for rows of [gate | up].
extern "C" __global__ void silu_mul(const float* gu, float* out, int width, int total) {
    GRID_ORDER();
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    int r = t / width, i = t % width;
    float g = gu[(long long)r * 2 * width + i];
    float u = gu[(long long)r * 2 * width + width + i];
    out[t] = g / (1.0f + expf(-g)) * u;
}
