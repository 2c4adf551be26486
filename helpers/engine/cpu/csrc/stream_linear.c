/* y[r, n] = sum_k x[r, k] * W[n, k] for a few rows r, W stored in blocks of 16 output columns:
 * wp[n / 16][k][16] (helpers.engine.stream_kernel.stream_layout). Each block is read from memory once for all rows
 * (up to six rows per pass over a block, which then stays in L1/L2), with a software prefetch 4 KB ahead so
 * that reading the next block overlaps the arithmetic on this one: a step over 8 rows then costs little more
 * than a step over one. Threads split the blocks (OpenMP: the runtime torch has loaded). With AVX-512, up to 16
 * rows share a pass (rows_block512), with the same sums in the same order. Built at run time
 * by helpers/engine/stream_kernel.py with the system C compiler; without one, or without AVX2 + FMA, the engine
 * uses its other kernels. */
#include <immintrin.h>
#include <stdint.h>

#define PREFETCH_FLOATS 1024

int stream_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* ROWS rows (a compile-time constant, so the 2 x ROWS accumulators stay in registers) times one 16-column block. */
__attribute__((target("avx2,fma"), always_inline))
static inline void rows_block(const int ROWS, const float* x, int k_dim, const float* wb, float* y, int n_dim) {
    __m256 a[6][2];
    for (int r = 0; r < ROWS; r++)
        a[r][0] = a[r][1] = _mm256_setzero_ps();
    for (int k = 0; k < k_dim; k++) {
        const float* w = wb + (int64_t)k * 16;
        _mm_prefetch((const char*)(w + PREFETCH_FLOATS), _MM_HINT_T0);
        __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);
        for (int r = 0; r < ROWS; r++) {
            __m256 b = _mm256_broadcast_ss(x + (int64_t)r * k_dim + k);
            a[r][0] = _mm256_fmadd_ps(b, w0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(b, w1, a[r][1]);
        }
    }
    for (int r = 0; r < ROWS; r++) {
        _mm256_storeu_ps(y + (int64_t)r * n_dim, a[r][0]);
        _mm256_storeu_ps(y + (int64_t)r * n_dim + 8, a[r][1]);
    }
}

__attribute__((target("avx2,fma")))
static void block(const float* x, int rows, int k_dim, const float* wb, float* y, int n_dim) {
    int r = 0;
    for (; r + 6 <= rows; r += 6)
        rows_block(6, x + (int64_t)r * k_dim, k_dim, wb, y + (int64_t)r * n_dim, n_dim);
    switch (rows - r) {
        case 5: rows_block(5, x + (int64_t)r * k_dim, k_dim, wb, y + (int64_t)r * n_dim, n_dim); break;
        case 4: rows_block(4, x + (int64_t)r * k_dim, k_dim, wb, y + (int64_t)r * n_dim, n_dim); break;
        case 3: rows_block(3, x + (int64_t)r * k_dim, k_dim, wb, y + (int64_t)r * n_dim, n_dim); break;
        case 2: rows_block(2, x + (int64_t)r * k_dim, k_dim, wb, y + (int64_t)r * n_dim, n_dim); break;
        case 1: rows_block(1, x + (int64_t)r * k_dim, k_dim, wb, y + (int64_t)r * n_dim, n_dim); break;
    }
}

/* The same sums with AVX-512, where the CPU has it, for more than 6 rows: a 16-column block is one register, so up to
 * 16 rows share one pass over a block (AVX2: 6, then the block is read again from cache for the next rows). Each output still
 * accumulates k = 0, 1, ... with one FMA per k, as the AVX2 code does: both give bitwise the same results. */
__attribute__((target("avx512f"), always_inline))
static inline void rows_block512(const int ROWS, const float* x, int k_dim, const float* wb, float* y, int n_dim) {
    __m512 a[16];
    for (int r = 0; r < ROWS; r++)
        a[r] = _mm512_setzero_ps();
    for (int k = 0; k < k_dim; k++) {
        const float* w = wb + (int64_t)k * 16;
        _mm_prefetch((const char*)(w + PREFETCH_FLOATS), _MM_HINT_T0);
        __m512 w0 = _mm512_loadu_ps(w);
        for (int r = 0; r < ROWS; r++)
            a[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[(int64_t)r * k_dim + k]), w0, a[r]);
    }
    for (int r = 0; r < ROWS; r++)
        _mm512_storeu_ps(y + (int64_t)r * n_dim, a[r]);
}

#define ROWS512(n) case n: rows_block512(n, x + (int64_t)r * k_dim, k_dim, wb, y + (int64_t)r * n_dim, n_dim); break;

__attribute__((target("avx512f")))
static void block512(const float* x, int rows, int k_dim, const float* wb, float* y, int n_dim) {
    int r = 0;
    for (; r + 16 <= rows; r += 16)
        rows_block512(16, x + (int64_t)r * k_dim, k_dim, wb, y + (int64_t)r * n_dim, n_dim);
    switch (rows - r) {
        ROWS512(1) ROWS512(2) ROWS512(3) ROWS512(4) ROWS512(5) ROWS512(6) ROWS512(7) ROWS512(8)
        ROWS512(9) ROWS512(10) ROWS512(11) ROWS512(12) ROWS512(13) ROWS512(14) ROWS512(15)
    }
}

static int wide = -1;

/* Which path runs: on = 1 the AVX-512 one where the CPU has it, 0 the AVX2 one (the tests compare them); returns
 * 1 if the AVX-512 path now runs. */
int stream_use_avx512(int on) {
    __builtin_cpu_init();
    wide = on && __builtin_cpu_supports("avx512f");
    return wide;
}

/* x [rows, k_dim] and y [rows, n_dim] contiguous; n_dim a multiple of 16. */
void stream_linear(const float* x, int rows, int k_dim, const float* wp, int n_dim, float* y, int threads) {
    int blocks = n_dim / 16;
    if (wide < 0)
        stream_use_avx512(1);
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int b = 0; b < blocks; b++) {
        if (wide && rows > 6)  /* up to 6 rows the AVX2 path already makes one pass */
            block512(x, rows, k_dim, wp + (int64_t)b * k_dim * 16, y + b * 16, n_dim);
        else
            block(x, rows, k_dim, wp + (int64_t)b * k_dim * 16, y + b * 16, n_dim);
    }
}
