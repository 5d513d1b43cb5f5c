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

// out[r] = table[meta[2 + r]]; one block per row.
extern "C" __global__ void embed(const unsigned* meta, const float* table, float* out, int h) {
    int r = blockIdx.x;
    const float* src = table + (long long)meta[2 + r] * h;
    for (int j = threadIdx.x; j < h; j += blockDim.x) out[(long long)r * h + j] = src[j];
}

// RMSNorm of rows of `d` values; one block per row.
extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, int d,
                                    float eps) {
    __shared__ float red[32];
    const float* row = x + (long long)blockIdx.x * d;
    float* o = out + (long long)blockIdx.x * d;
    float s = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) s = __fmaf_rn(row[j], row[j], s);
    float inv = 1.0f / sqrtf(block_sum(s, red) / (float)d + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x) o[j] = row[j] * inv * w[j];
}

// y[r, o] = x[r] . W[o] (+ bias[o]) (+ y[r, o] when accumulating), W row-major [out, in],
// `in` a multiple of 4. One warp per output; blockIdx.y picks a group of up to ROWS rows,
// all computed in one pass over W. A row's sum runs in the same order in any group.
extern "C" __global__ void matvec(const float* W, const float* x, const float* bias, float* y,
                                  int n, int in, int out, int has_bias, int accumulate) {
    int o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (o >= out) return;
    int r0 = blockIdx.y * ROWS;
    int nr = min(ROWS, n - r0);
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = 0.0f;
    int in4 = in >> 2;
    const float4* w = reinterpret_cast<const float4*>(W + (long long)o * in);
    const float4* xs = reinterpret_cast<const float4*>(x + (long long)r0 * in);
    for (int j = lane; j < in4; j += 32) {
        float4 a = w[j];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            if (r < nr) {
                float4 b = xs[(long long)r * in4 + j];
                float t = acc[r];
                t = __fmaf_rn(a.x, b.x, t);
                t = __fmaf_rn(a.y, b.y, t);
                t = __fmaf_rn(a.z, b.z, t);
                t = __fmaf_rn(a.w, b.w, t);
                acc[r] = t;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        float t = warp_sum(acc[r]);
        if (lane == 0 && r < nr) {
            if (has_bias) t = t + bias[o];
            float* dst = y + (long long)(r0 + r) * out + o;
            *dst = accumulate ? *dst + t : t;
        }
    }
}

// Splits fused QKV rows ([n, qd + 2 kvd]), rotates Q and K (RoPE at positions pos0 + r),
// writes Q to q_out ([n, qd]) and K, V into the layer's cache rows row0 + r ([cap, kvd]).
// One block per row.
extern "C" __global__ void qkv_post(const float* qkv, float* q_out,
                                    const unsigned long long* kv, int layer,
                                    const float* cos_t, const float* sin_t, int qh, int kvh,
                                    int hd, const unsigned* meta, int interleaved) {
    float* kc = (float*)kv[2 * layer];
    float* vc = (float*)kv[2 * layer + 1];
    int r = blockIdx.x;
    int half = hd / 2, qd = qh * hd, kvd = kvh * hd;
    // The cache row written, and the position rotated for.
    int row = (int)meta[0] + r, p = (int)meta[1] + r;
    const float* src_row = qkv + (long long)r * (qd + 2 * kvd);
    const float* c = cos_t + (long long)p * half;
    const float* s = sin_t + (long long)p * half;
    int pairs_q = qh * half, pairs_k = kvh * half;
    for (int t = threadIdx.x; t < pairs_q + pairs_k + kvd; t += blockDim.x) {
        if (t < pairs_q + pairs_k) {
            bool is_q = t < pairs_q;
            int u = is_q ? t : t - pairs_q;
            int head = u / half, i = u % half;
            const float* src = src_row + (is_q ? 0 : qd) + head * hd;
            float* dst = is_q ? q_out + (long long)r * qd + head * hd : kc + (long long)row * kvd + head * hd;
            int ia = interleaved ? 2 * i : i;
            int ib = interleaved ? 2 * i + 1 : i + half;
            float a = src[ia], b = src[ib];
            dst[ia] = a * c[i] - b * s[i];
            dst[ib] = a * s[i] + b * c[i];
        } else {
            int j = t - pairs_q - pairs_k;
            vc[(long long)row * kvd + j] = src_row[qd + kvd + j];
        }
    }
}

// Causal attention of query rows q ([n, qh, hd], row r at cache row row0 + r) over the
// layer's cache rows 0..=row0 + r. Grid (n, qh); a block of 32·W threads. Dynamic shared
// memory: 32 + hd + W·hd + (the longest context) floats. A block's work depends only on
// its query's position, not on n.
extern "C" __global__ void attend(const float* q, const unsigned long long* kv, int layer,
                                  float* out, int qh, int kvh, int hd, const unsigned* meta,
                                  float scale) {
    extern __shared__ float sh[];
    const float* kc = (const float*)kv[2 * layer];
    const float* vc = (const float*)kv[2 * layer + 1];
    int row0 = (int)meta[0];
    int r = blockIdx.x, h = blockIdx.y;
    int g = h / (qh / kvh);
    int len = row0 + r + 1, kvd = kvh * hd;
    int warps = blockDim.x >> 5, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float* red = sh;
    float* qs = red + 32;
    float* part = qs + hd;
    float* sc = part + warps * hd;
    const float* qrow = q + ((long long)r * qh + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qrow[d];
    __syncthreads();
    float m = NEG_INF;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        const float* k = kc + (long long)j * kvd + g * hd;
        float s = 0.0f;
        for (int d = 0; d < hd; d++) s = __fmaf_rn(qs[d], k[d], s);
        s = s * scale;
        sc[j] = s;
        m = fmaxf(m, s);
    }
    m = block_max(m, red);
    float l = 0.0f;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        float e = expf(sc[j] - m);
        sc[j] = e;
        l += e;
    }
    l = block_sum(l, red);
    int chunk = (len + warps - 1) / warps;
    int j0 = warp * chunk, j1 = min(len, j0 + chunk);
    for (int d = lane; d < hd; d += 32) {
        float acc = 0.0f;
        const float* v = vc + g * hd + d;
        for (int j = j0; j < j1; j++) acc = __fmaf_rn(sc[j], v[(long long)j * kvd], acc);
        part[warp * hd + d] = acc;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float t = 0.0f;
        for (int w = 0; w < warps; w++) t += part[w * hd + d];
        out[((long long)r * qh + h) * hd + d] = t / l;
    }
}

// out[r, i] = silu(gu[r, i]) * gu[r, width + i] for rows of [gate | up].
extern "C" __global__ void silu_mul(const float* gu, float* out, int width, int total) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    int r = t / width, i = t % width;
    float g = gu[(long long)r * 2 * width + i];
    float u = gu[(long long)r * 2 * width + width + i];
    out[t] = g / (1.0f + expf(-g)) * u;
}
