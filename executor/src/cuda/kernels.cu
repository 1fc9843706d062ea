// The memory-bound kernels of the CUDA backend, compiled at run time by NVRTC (no headers:
// NVRTC provides the built-ins used here). Each storage type gets its own entry points,
// suffixed _f32 or _bf16; bf16 is converted by hand, so cuda_bf16.h is not needed.
//
// Element-wise kernels use grid-stride loops over 16-byte packs (8 bf16 or 4 f32 elements, one
// vector load or store each; buffers are 256-byte aligned), then over the few elements past
// the last whole pack; row kernels use one block a row, with a block size that is a multiple
// of 32, and packs when the width is a multiple of a pack. Scalar 2-byte accesses reached
// about half of a copy's bandwidth on an H200 (session 18).

typedef unsigned short bf16;
typedef long long i64;

__device__ __forceinline__ float load(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ float load(const bf16* p, i64 i) { return __uint_as_float(((unsigned int)p[i]) << 16); }
__device__ __forceinline__ void store(float* p, i64 i, float v) { p[i] = v; }
__device__ __forceinline__ void store(bf16* p, i64 i, float v) {
    unsigned int u = __float_as_uint(v);
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    p[i] = (bf16)(u >> 16);
}

// A counter-based hash: the same (seed, i) always gives the same bits.
__device__ __forceinline__ unsigned int hash(unsigned int seed, i64 i) {
    unsigned int x = (unsigned int)i ^ ((unsigned int)(i >> 32) * 0x9e3779b9u) ^ (seed * 0x85ebca6bu);
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

// Uniform in [0, 1).
__device__ __forceinline__ float uniform(unsigned int seed, i64 i) {
    return (float)(hash(seed, i) >> 8) * (1.0f / 16777216.0f);
}

// 16 bytes of elements, loaded and stored as one vector.
template <typename T>
struct alignas(16) Pack {
    T v[16 / sizeof(T)];
};
#define PACK(T) ((i64)(16 / sizeof(T)))
template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p, i64 c) {
    return reinterpret_cast<const Pack<T>*>(p)[c];
}
template <typename T>
__device__ __forceinline__ void store_pack(T* p, i64 c, const Pack<T>& v) {
    reinterpret_cast<Pack<T>*>(p)[c] = v;
}

#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum (or max) over the block, returned to every thread. `shared` holds 32 floats.
__device__ float block_reduce(float v, float* shared, bool is_max) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();  // `shared` may still be read from a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float identity = is_max ? __int_as_float(0xff800000) : 0.0f;
        float w = lane < warps ? shared[lane] : identity;
        w = is_max ? warp_max(w) : warp_sum(w);
        if (lane == 0) shared[0] = w;
    }
    __syncthreads();
    return shared[0];
}

// Fills 2-byte words with bf16 values of magnitude in [0.5, 1): finite and normal read as bf16,
// and read in pairs as f32 (the high word sets sign and exponent).
extern "C" __global__ void fill_u16(bf16* p, i64 n, unsigned int seed) {
    GRID_STRIDE(i, n) {
        unsigned int h = hash(seed, i);
        float v = 0.5f + 0.5f * (float)(h >> 8) * (1.0f / 16777216.0f);
        store(p, i, (h & 1u) ? -v : v);
    }
}

__device__ __forceinline__ void adam_one(float& p, float g, float& m, float& v, float lr, float c1, float c2) {
    m = 0.9f * m + 0.1f * g;
    v = 0.999f * fabsf(v) + 0.001f * g * g;
    p -= lr * ((m * c1) / (sqrtf(v * c2) + 1e-8f) + 0.01f * p);
}

// AdamW on f32 parameters, gradients and moments (bias correction folded into the rate).
extern "C" __global__ void adam(float* p, const float* g, float* m, float* v, i64 n, float lr, float c1, float c2) {
    const i64 N = PACK(float), packs = n / N;
    GRID_STRIDE(c, packs) {
        Pack<float> pp = load_pack(p, c), gg = load_pack(g, c), mm = load_pack(m, c), vv = load_pack(v, c);
        for (int k = 0; k < N; ++k) adam_one(pp.v[k], gg.v[k], mm.v[k], vv.v[k], lr, c1, c2);
        store_pack(p, c, pp);
        store_pack(m, c, mm);
        store_pack(v, c, vv);
    }
    GRID_STRIDE(t, n - packs * N) {
        i64 i = packs * N + t;
        adam_one(p[i], g[i], m[i], v[i], lr, c1, c2);
    }
}

template <typename T>
__device__ void copy_impl(const T* x, T* y, i64 n) {
    const i64 N = PACK(T), packs = n / N;
    GRID_STRIDE(c, packs) store_pack(y, c, load_pack(x, c));
    GRID_STRIDE(t, n - packs * N) y[packs * N + t] = x[packs * N + t];
}

__device__ __forceinline__ float gelu(float v) {
    return 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
}

template <typename T>
__device__ void gelu_impl(const T* x, T* y, i64 n) {
    const i64 N = PACK(T), packs = n / N;
    GRID_STRIDE(c, packs) {
        Pack<T> a = load_pack(x, c), b;
        for (int k = 0; k < N; ++k) store(b.v, k, gelu(load(a.v, k)));
        store_pack(y, c, b);
    }
    GRID_STRIDE(t, n - packs * N) {
        i64 i = packs * N + t;
        store(y, i, gelu(load(x, i)));
    }
}

template <typename T>
__device__ void dropout_impl(const T* x, T* y, unsigned char* mask, i64 n, float p, unsigned int seed) {
    float scale = 1.0f / (1.0f - p);
    const i64 N = PACK(T), packs = n / N;
    GRID_STRIDE(c, packs) {
        Pack<T> a = load_pack(x, c), b;
        for (int k = 0; k < N; ++k) {
            i64 i = c * N + k;
            bool keep = uniform(seed, i) >= p;
            mask[i] = keep;
            store(b.v, k, keep ? load(a.v, k) * scale : 0.0f);
        }
        store_pack(y, c, b);
    }
    GRID_STRIDE(t, n - packs * N) {
        i64 i = packs * N + t;
        bool keep = uniform(seed, i) >= p;
        mask[i] = keep;
        store(y, i, keep ? load(x, i) * scale : 0.0f);
    }
}

// out = residual + dropout(x), fused.
template <typename T>
__device__ void dropout_add_impl(const T* x, const T* r, T* out, unsigned char* mask, i64 n, float p, unsigned int seed) {
    float scale = 1.0f / (1.0f - p);
    const i64 N = PACK(T), packs = n / N;
    GRID_STRIDE(c, packs) {
        Pack<T> a = load_pack(x, c), res = load_pack(r, c), b;
        for (int k = 0; k < N; ++k) {
            i64 i = c * N + k;
            bool keep = uniform(seed, i) >= p;
            mask[i] = keep;
            store(b.v, k, load(res.v, k) + (keep ? load(a.v, k) * scale : 0.0f));
        }
        store_pack(out, c, b);
    }
    GRID_STRIDE(t, n - packs * N) {
        i64 i = packs * N + t;
        bool keep = uniform(seed, i) >= p;
        mask[i] = keep;
        store(out, i, load(r, i) + (keep ? load(x, i) * scale : 0.0f));
    }
}

// One block a row of `width`: mean and variance in one pass, then normalise (in packs when
// the width is a multiple of one).
template <typename T>
__device__ void layernorm_impl(const T* x, T* y, const float* gamma, const float* beta, i64 width) {
    __shared__ float shared[32];
    const T* xr = x + (i64)blockIdx.x * width;
    T* yr = y + (i64)blockIdx.x * width;
    const i64 N = PACK(T);
    const bool packed = width % N == 0;
    float sum = 0.0f, sumsq = 0.0f;
    if (packed) {
        for (i64 c = threadIdx.x; c < width / N; c += blockDim.x) {
            Pack<T> a = load_pack(xr, c);
            for (int k = 0; k < N; ++k) {
                float v = load(a.v, k);
                sum += v;
                sumsq += v * v;
            }
        }
    } else {
        for (i64 j = threadIdx.x; j < width; j += blockDim.x) {
            float v = load(xr, j);
            sum += v;
            sumsq += v * v;
        }
    }
    float mean = block_reduce(sum, shared, false) / (float)width;
    float var = block_reduce(sumsq, shared, false) / (float)width - mean * mean;
    float rstd = rsqrtf(fmaxf(var, 0.0f) + 1e-5f);
    if (packed) {
        for (i64 c = threadIdx.x; c < width / N; c += blockDim.x) {
            Pack<T> a = load_pack(xr, c), b;
            for (int k = 0; k < N; ++k) {
                i64 j = c * N + k;
                store(b.v, k, (load(a.v, k) - mean) * rstd * gamma[j] + beta[j]);
            }
            store_pack(yr, c, b);
        }
    } else {
        for (i64 j = threadIdx.x; j < width; j += blockDim.x) {
            store(yr, j, (load(xr, j) - mean) * rstd * gamma[j] + beta[j]);
        }
    }
}

// One block a row of `width`: max, sum of exponentials, then normalise (in packs when the
// width is a multiple of one).
template <typename T>
__device__ void softmax_impl(const T* x, T* y, i64 width) {
    __shared__ float shared[32];
    const T* xr = x + (i64)blockIdx.x * width;
    T* yr = y + (i64)blockIdx.x * width;
    const i64 N = PACK(T);
    const bool packed = width % N == 0;
    float mx = __int_as_float(0xff800000);
    if (packed) {
        for (i64 c = threadIdx.x; c < width / N; c += blockDim.x) {
            Pack<T> a = load_pack(xr, c);
            for (int k = 0; k < N; ++k) mx = fmaxf(mx, load(a.v, k));
        }
    } else {
        for (i64 j = threadIdx.x; j < width; j += blockDim.x) mx = fmaxf(mx, load(xr, j));
    }
    mx = block_reduce(mx, shared, true);
    float sum = 0.0f;
    if (packed) {
        for (i64 c = threadIdx.x; c < width / N; c += blockDim.x) {
            Pack<T> a = load_pack(xr, c);
            for (int k = 0; k < N; ++k) sum += __expf(load(a.v, k) - mx);
        }
    } else {
        for (i64 j = threadIdx.x; j < width; j += blockDim.x) sum += __expf(load(xr, j) - mx);
    }
    float inv = 1.0f / block_reduce(sum, shared, false);
    if (packed) {
        for (i64 c = threadIdx.x; c < width / N; c += blockDim.x) {
            Pack<T> a = load_pack(xr, c), b;
            for (int k = 0; k < N; ++k) store(b.v, k, __expf(load(a.v, k) - mx) * inv);
            store_pack(yr, c, b);
        }
    } else {
        for (i64 j = threadIdx.x; j < width; j += blockDim.x) store(yr, j, __expf(load(xr, j) - mx) * inv);
    }
}

#define ENTRY_POINTS(T, S)                                                                                   \
    extern "C" __global__ void copy_##S(const T* x, T* y, i64 n) { copy_impl(x, y, n); }                     \
    extern "C" __global__ void gelu_##S(const T* x, T* y, i64 n) { gelu_impl(x, y, n); }                     \
    extern "C" __global__ void dropout_##S(const T* x, T* y, unsigned char* mask, i64 n, float p,            \
                                           unsigned int seed) {                                              \
        dropout_impl(x, y, mask, n, p, seed);                                                                \
    }                                                                                                        \
    extern "C" __global__ void dropout_add_##S(const T* x, const T* r, T* out, unsigned char* mask, i64 n,   \
                                               float p, unsigned int seed) {                                 \
        dropout_add_impl(x, r, out, mask, n, p, seed);                                                       \
    }                                                                                                        \
    extern "C" __global__ void layernorm_##S(const T* x, T* y, const float* gamma, const float* beta,        \
                                             i64 width) {                                                    \
        layernorm_impl(x, y, gamma, beta, width);                                                            \
    }                                                                                                        \
    extern "C" __global__ void softmax_##S(const T* x, T* y, i64 width) { softmax_impl(x, y, width); }

ENTRY_POINTS(float, f32)
ENTRY_POINTS(bf16, bf16)
