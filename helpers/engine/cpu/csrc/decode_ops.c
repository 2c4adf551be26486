/* The small ops between a decode step's matmuls, one call each instead of a dozen ATen ops: RMSNorm, RoPE on
 * q and k, attention of a few query rows over the KV cache, and SwiGLU (silu(g) * u). In f32, with AVX2 + FMA.
 * helpers/engine/fused_ops.py calls them (through ctypes) where a step's shapes allow, and says when.
 *
 * Every output element is computed by one thread in a fixed order (no sum is split across threads), so the
 * results are bitwise the same for any thread count and any batch composition. exp is one polynomial (Cephes'
 * expf: range reduction by ln 2, degree-6 polynomial, about 1 ulp) in every lane. All lengths here are multiples
 * of 8 (fused_ops checks before calling): no scalar tails. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define V8 __attribute__((target("avx2,fma")))

V8 static inline float hsum(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

V8 static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3365447505f)), _mm256_set1_ps(88.3762626647f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* out[r] = w * (x[r] * rsqrt(mean(x[r]^2) + eps)) for rows of n (transformers' LlamaRMSNorm in f32). */
V8 void ops_rms_norm(const float* x, const float* w, float eps, int rows, int n, float* out, int threads) {
    #pragma omp parallel for num_threads(threads) if (rows >= 8)
    for (int r = 0; r < rows; r++) {
        const float* xr = x + (int64_t)r * n;
        float* o = out + (int64_t)r * n;
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < n; i += 8) {
            __m256 v = _mm256_loadu_ps(xr + i);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        __m256 s = _mm256_set1_ps(1.0f / sqrtf(hsum(acc) / (float)n + eps));
        for (int i = 0; i < n; i += 8)
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(xr + i), s)));
    }
}

/* RoPE in place on the first `heads` heads of each row of qkv (row r at qkv + r * row_stride, head h at h * d):
 * x * cos + rotate_half(x) * sin, with sin_signed = cat(-sin[:d/2], sin[d/2:]) (helpers.engine.model).
 * cos / sin_signed: one [d] row per qkv row. */
V8 void ops_rope(float* qkv, int rows, int64_t row_stride, int heads, int d, const float* cos, const float* sin_signed) {
    int half = d / 2;
    for (int r = 0; r < rows; r++) {
        const float* c = cos + (int64_t)r * d;
        const float* s = sin_signed + (int64_t)r * d;
        for (int h = 0; h < heads; h++) {
            float* x = qkv + (int64_t)r * row_stride + (int64_t)h * d;
            for (int i = 0; i < half; i += 8) {
                __m256 x1 = _mm256_loadu_ps(x + i), x2 = _mm256_loadu_ps(x + half + i);
                __m256 a = _mm256_add_ps(_mm256_mul_ps(x1, _mm256_loadu_ps(c + i)),
                                         _mm256_mul_ps(x2, _mm256_loadu_ps(s + i)));
                __m256 b = _mm256_add_ps(_mm256_mul_ps(x2, _mm256_loadu_ps(c + half + i)),
                                         _mm256_mul_ps(x1, _mm256_loadu_ps(s + half + i)));
                _mm256_storeu_ps(x + i, a);
                _mm256_storeu_ps(x + half + i, b);
            }
        }
    }
}

/* Scores of one query against keys [0, n): p[j] = (q . k_j) * scale. Four keys per pass, each its own chain of FMAs
 * (as many in flight as the core can issue), each key's sum in the same order as alone. */
V8 static void scores(const float* qv, const float* kb, int64_t k_sj, int n, int d, float scale, float* p) {
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = kb + j * k_sj, *k1 = k0 + k_sj, *k2 = k1 + k_sj, *k3 = k2 + k_sj;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < d; i += 8) {
            __m256 x = _mm256_loadu_ps(qv + i);
            a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k0 + i), a0);
            a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k1 + i), a1);
            a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k2 + i), a2);
            a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k3 + i), a3);
        }
        p[j] = hsum(a0) * scale, p[j + 1] = hsum(a1) * scale, p[j + 2] = hsum(a2) * scale, p[j + 3] = hsum(a3) * scale;
    }
    for (; j < n; j++) {
        const float* kj = kb + j * k_sj;
        __m256 a = _mm256_setzero_ps();
        for (int i = 0; i < d; i += 8)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(qv + i), _mm256_loadu_ps(kj + i), a);
        p[j] = hsum(a) * scale;
    }
}

/* acc[c] += p[j] * v_j[8c:8c+8] for c < C8 over the nonzero p, j = 0, 1, ... in order: one accumulator per 8
 * columns, in registers when C8 is a constant (always_inline). */
__attribute__((target("avx2,fma"), always_inline))
static inline void accumulate(const int C8, const float* p, const float* vb, int64_t v_sj, int n, __m256* acc) {
    for (int j = 0; j < n; j++) {
        if (p[j] == 0.0f) continue;
        __m256 pj = _mm256_set1_ps(p[j]);
        const float* vj = vb + j * v_sj;
        for (int c = 0; c < C8; c++)
            acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * c), acc[c]);
    }
}

/* o[0:w] = inv * sum_j p[j] v_j[0:w] (w <= 64). */
V8 static void weighted_sum(const float* p, const float* vb, int64_t v_sj, int n, int w, __m256 inv, float* o) {
    __m256 acc[8];
    int c8 = w / 8;
    for (int c = 0; c < 8; c++)
        acc[c] = _mm256_setzero_ps();
    if (c8 == 8)  /* the common head block */
        accumulate(8, p, vb, v_sj, n, acc);
    else
        accumulate(c8, p, vb, v_sj, n, acc);
    for (int c = 0; c < c8; c++)
        _mm256_storeu_ps(o + 8 * c, _mm256_mul_ps(acc[c], inv));
}

/* out[b, t, h*d:(h+1)*d] = softmax(q . k_j * scale over visible j) . v_j for query head h over kv head
 * head_kv[h]. q[b, t, h] at q + b*q_sb + t*q_st + h*d; k[b, g, j] at k + b*k_sb + g*k_sg + j*k_sj (v alike);
 * mask[b, t, j] (nonzero = visible) at mask + b*m_sb + t*m_st + j. A query that sees nothing gets zeros. */
V8 void ops_attention(const float* q, int64_t q_sb, int64_t q_st,
                      const float* k, int64_t k_sb, int64_t k_sg, int64_t k_sj,
                      const float* v, int64_t v_sb, int64_t v_sg, int64_t v_sj,
                      const uint8_t* mask, int64_t m_sb, int64_t m_st, const int32_t* head_kv,
                      int batch, int t_len, int heads, int d, int kv_len, float scale, float* out, int threads) {
    int padded = (kv_len + 7) & ~7;
    int64_t work = (int64_t)batch * t_len * heads * kv_len * d;
    #pragma omp parallel for collapse(3) num_threads(threads) if (work >= 262144)
    for (int b = 0; b < batch; b++)
        for (int t = 0; t < t_len; t++)
            for (int h = 0; h < heads; h++) {
                const float* qv = q + b * q_sb + t * q_st + (int64_t)h * d;
                const float* kb = k + b * k_sb + head_kv[h] * k_sg;
                const float* vb = v + b * v_sb + head_kv[h] * v_sg;
                const uint8_t* m = mask + b * m_sb + t * m_st;
                float* o = out + (((int64_t)b * t_len + t) * heads + h) * d;
                float p[padded];
                scores(qv, kb, k_sj, kv_len, d, scale, p);
                float mx = -INFINITY;
                for (int j = 0; j < padded; j++) {
                    if (j >= kv_len || !m[j]) p[j] = -INFINITY;
                    else if (p[j] > mx) mx = p[j];
                }
                if (mx == -INFINITY) {
                    for (int i = 0; i < d; i += 8)
                        _mm256_storeu_ps(o + i, _mm256_setzero_ps());
                    continue;
                }
                __m256 sum = _mm256_setzero_ps(), vmx = _mm256_set1_ps(mx);
                for (int j = 0; j < padded; j += 8) {
                    __m256 s = _mm256_loadu_ps(p + j);
                    __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(s, vmx)),  /* exactly 0 where masked */
                                             _mm256_cmp_ps(s, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ));
                    _mm256_storeu_ps(p + j, e);
                    sum = _mm256_add_ps(sum, e);
                }
                __m256 inv = _mm256_set1_ps(1.0f / hsum(sum));
                for (int i = 0; i < d; i += 64)
                    weighted_sum(p, vb + i, v_sj, kv_len, d - i < 64 ? d - i : 64, inv, o + i);
            }
}

/* out[r] = silu(gu[r, :n]) * gu[r, n:2n], silu(g) = g / (1 + exp(-g)) (torch's silu). */
V8 void ops_swiglu(const float* gu, int rows, int n, float* out, int threads) {
    #pragma omp parallel for num_threads(threads) if (rows >= 8)
    for (int r = 0; r < rows; r++) {
        const float* g = gu + (int64_t)r * 2 * n;
        const float* u = g + n;
        float* o = out + (int64_t)r * n;
        for (int i = 0; i < n; i += 8) {
            __m256 x = _mm256_loadu_ps(g + i);
            __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
            __m256 sg = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(sg, _mm256_loadu_ps(u + i)));
        }
    }
}
