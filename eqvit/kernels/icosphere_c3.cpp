// The icosphere tokenizer's inference form in the Fourier basis of a patch's 120-degree turns (C3).
//
// A patch's three tokens read (lifting) or write (unpatchify) its taps with one kernel turned by 0, 120
// and 240 degrees, and the taps fall into orbits of three under the turn. On such a cyclic structure the
// turned kernels act, per orbit, through the orbit's mean and its turning component, a complex number
// under the turn: the dense [3 A, 3 K] product becomes one real [A, K] product on the means and one complex
// [A, K] product on the turning parts, which Gauss's trick computes with three real ones. Four real
// [A, K] products in all, 4/9 of the dense product's multiply-adds (eqvit.nn.fused_icosphere computes the
// four weight planes).
//
// Into the turn basis, an orbit (x0, x1, x2) gives the products' four inputs
//     s = x0 + x1 + x2,  a = x0 - (x1 + x2) / 2,  b = sqrt(3) / 2 (x1 - x2),  a - b
// (a + i b is the orbit's turning part), and out of it the four products y0 .. y3 give
//     z = y0 + bias,  u = y1 + y2,  w = sqrt(3) / 2 (y3 - y1 + y2),
//     members (z + u | z - u / 2 + w | z - u / 2 - w).
//
// Each pass runs on tiles of patches, one patch per vector lane: the change into the turn basis, the four
// products and the change out of it happen while the tile is in L1, so that nothing between them goes
// through memory. In SO3ViT (batch 1, width 128, 2 threads, a 2-core EPYC) the lifting took 265 us and the
// unpatchify with the final norm 344 us as three passes around a batched product over [4, 320, 128], of
// which the product took about half; tile by tile they take 158 and 220 us.
//
// Built on first use by eqvit.kernels (c++ -O3 -march=native -fopenmp -shared) and called through ctypes.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr double kHalfRoot3 = 0.86602540378443864676372317075294;

// A vector: 32 bytes, one patch per lane (AVX's width; two halves on a CPU with SSE only).
template <typename T>
struct Lanes {
  typedef T type __attribute__((vector_size(32)));
  static constexpr long kCount = 32 / sizeof(T);
};
template <typename T>
using Vec = typename Lanes<T>::type;

template <typename T>
inline Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
inline void store(T* p, Vec<T> v) {
  std::memcpy(p, &v, sizeof v);
}

// A tile of patches is one vector, a patch per lane. A product takes kRowBlock rows of its weight at once: the
// 12 accumulators, the input and a broadcast weight fill 14 of AVX's 16 registers. Its weights are stored in
// blocks of kRowBlock rows, each block k-major ([K, rows]): the rows' weights for one k sit together, and
// the product reads the block in sequence. (Two or four vectors a tile, with fewer rows, ran slower: the
// tile's inputs and tokens no longer stayed in L1.)
constexpr long kRowBlock = 12;

// out[j] = sum_k w[k NB + j] x[k] for the NB rows of one block of weights w [K, NB] and the tile's inputs
// x [K] (vectors of patches): out [NB].
template <typename T, int NB>
inline void rows_times_tile(const T* __restrict__ w, long K, const T* __restrict__ x, T* __restrict__ out) {
  constexpr long P = Lanes<T>::kCount;
  Vec<T> acc[NB] = {};
  for (long k = 0; k < K; ++k) {
    const Vec<T> xk = load(x + k * P);
    for (int j = 0; j < NB; ++j) acc[j] += w[k * NB + j] * xk;
  }
  for (int j = 0; j < NB; ++j) store(out + j * P, acc[j]);
}

// A block of n <= kRowBlock rows times the tile (n a compile-time count: the accumulators stay in registers).
template <typename T, int NB = kRowBlock>
inline void row_block_times_tile(long n, const T* w, long K, const T* x, T* out) {
  if (n == NB) return rows_times_tile<T, NB>(w, K, x, out);
  if constexpr (NB > 1) row_block_times_tile<T, NB - 1>(n, w, K, x, out);
}

// One orbit's inputs to the four products, written at patch l of the tile's entries in[i], in[i + plane], ...
template <typename T>
inline void turn_inputs(T x0, T x1, T x2, T* in, long i, long plane, long l) {
  constexpr long L = Lanes<T>::kCount;
  const T a = x0 - T(0.5) * (x1 + x2), b = T(kHalfRoot3) * (x1 - x2);
  in[i * L + l] = x0 + x1 + x2;
  in[(plane + i) * L + l] = a;
  in[(2 * plane + i) * L + l] = b;
  in[(3 * plane + i) * L + l] = a - b;
}

// The mean and turning parts z, u, w out of the four products' values y0 .. y3 (a vector of patches at once).
template <typename T>
struct Members {
  Vec<T> z, u, w;
  inline Members(Vec<T> y0, Vec<T> y1, Vec<T> y2, Vec<T> y3, T bias)
      : z(y0 + bias), u(y1 + y2), w(T(kHalfRoot3) * (y3 - y1 + y2)) {}
};

// The four products of the planes [4, J K] (each [J, K] in blocks of rows, see rows_times_tile) for their rows
// j0 .. j0 + rows - 1 (rows <= kRowBlock; the blocks before j0 are full) and the tile's inputs in [4, K, P]:
// y [4, kRowBlock, P]. Always inlined: called out of line, the lifting ran about 2% slower at batch 4.
template <typename T>
inline __attribute__((always_inline)) void four_products(const T* planes, long J, long K, long j0, long rows,
                                                         const T* in, T* y) {
  constexpr long P = Lanes<T>::kCount;
  for (long p = 0; p < 4; ++p) {
    row_block_times_tile(rows, planes + p * J * K + j0 * K, K, in + p * K * P, y + p * kRowBlock * P);
  }
}

// Row j's Members out of the four products' values y [4, kRowBlock, P], with the mean part's bias.
template <typename T>
inline Members<T> row_members(const T* y, long j, T bias) {
  constexpr long P = Lanes<T>::kCount, plane = kRowBlock * P;
  const T* yj = y + j * P;
  return Members<T>(load(yj), load(yj + plane), load(yj + 2 * plane), load(yj + 3 * plane), bias);
}

// The lifting: x [B, C, V] (element strides sxb, sxc, sxv) -> tokens out [B M, 3, D]. For patch m, orbit o
// of its taps (vertices orbit_vertex[m, o, 0..2]) and channel c, the orbit's turn inputs are entry o C + c
// of the products' inputs; planes [4, D O C] are the four [D, O C] weights in blocks of rows (see
// rows_times_tile), bias [D] the tokens'.
template <typename T>
void lift(const T* __restrict__ x, long B, long C, long sxb, long sxc, long sxv, const long* __restrict__ orbit_vertex,
          long M, long O, const T* __restrict__ planes, const T* __restrict__ bias, long D, T* __restrict__ out,
          int threads) {
  constexpr long P = Lanes<T>::kCount;
  const long OC = O * C, R = B * M, tiles = (R + P - 1) / P;
#pragma omp parallel num_threads(threads) if (threads > 1 && tiles > 1)
  {
    std::vector<T> in(4 * OC * P), y(4 * kRowBlock * P);  // the tile's inputs [4, O C, P]; a row block's values
#pragma omp for schedule(static)
    for (long tile = 0; tile < tiles; ++tile) {
      const long r0 = tile * P, n = std::min(P, R - r0);
      if (n < P) std::fill(in.begin(), in.end(), T(0));  // the last tile's empty lanes: zeros, never stored
      for (long l = 0; l < n; ++l) {
        const T* xb = x + (r0 + l) / M * sxb;
        const long* ov = orbit_vertex + (r0 + l) % M * O * 3;
        for (long o = 0; o < O; ++o) {
          const long v0 = ov[3 * o] * sxv, v1 = ov[3 * o + 1] * sxv, v2 = ov[3 * o + 2] * sxv;
          for (long c = 0; c < C; ++c) {
            const T* xc = xb + c * sxc;
            turn_inputs<T>(xc[v0], xc[v1], xc[v2], in.data(), o * C + c, OC, l);
          }
        }
      }
      T* tokens = out + r0 * 3 * D;
      for (long d0 = 0; d0 < D; d0 += kRowBlock) {
        const long rows = std::min(kRowBlock, D - d0);
        four_products(planes, D, OC, d0, rows, in.data(), y.data());
        for (long j = 0; j < rows; ++j) {
          const Members<T> m = row_members(y.data(), j, bias[d0 + j]);
          const Vec<T> half = m.z - T(0.5) * m.u, first = m.z + m.u, second = half + m.w, third = half - m.w;
          for (long l = 0; l < n; ++l) {
            T* t = tokens + l * 3 * D + d0 + j;
            t[0] = first[l];
            t[D] = second[l];
            t[2 * D] = third[l];
          }
        }
      }
    }
  }
}

// The coefficients of u and w that rebuild orbit member r (branch-free: r comes in no order).
template <typename T>
constexpr T kTurnU[3] = {1, -0.5, -0.5};
template <typename T>
constexpr T kTurnW[3] = {0, 1, -1};

// The unpatchify: tokens [B M, 3 D] (rows of a patch's three tokens, row stride sr) -> out [B, C, V], every
// vertex the average of what the patches write on it. planes [4, O C D] are the four [O C, D] weights in blocks
// of rows (see rows_times_tile) and bias [O C] the mean part's. Normalize: each token is first normalised over
// its D channels (a LayerNorm whose affine the caller has folded into the planes and the bias).
//
// First, per tile of patches, the tokens go into the turn basis, through the products and out as the mean and
// turning parts z, u, w of every orbit value, kept as zuw [B M, 3, O C]. Then vertices are visited in the order
// vertex[0 .. V) (by the first patch that writes them, so that zuw is read nearly in sequence); the i-th
// receives entries ptr[i] .. ptr[i+1] - 1, entry e being member turn[e] of orbit row[e] / C of patch patch[e].
// Its sum is scaled by inv_count. NC > 0: the channel count as a compile-time constant (the loops over
// channels unroll); 0: C at run time.
template <typename T, bool Normalize, int NC>
void unpatchify(const T* __restrict__ tokens, long B, long M, long D, long sr, T eps, const T* __restrict__ planes,
                const T* __restrict__ bias, long OC, long C, const int* vertex, const int* ptr, const int* patch,
                const int* row, const unsigned char* turn, const T* inv_count, long V, T* out, int threads) {
  constexpr long P = Lanes<T>::kCount;
  const long nc = NC > 0 ? NC : C, R = B * M, tiles = (R + P - 1) / P;
  std::vector<T> zuw(R * 3 * OC);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    std::vector<T> in(4 * D * P), y(4 * kRowBlock * P);  // the tile's inputs [4, D, P]; a row block's values
#pragma omp for schedule(static)
    for (long tile = 0; tile < tiles; ++tile) {
      const long r0 = tile * P, n = std::min(P, R - r0);
      if (n < P) std::fill(in.begin(), in.end(), T(0));
      for (long l = 0; l < n; ++l) {
        const T* __restrict__ t = tokens + (r0 + l) * sr;
        T shift[3] = {0, 0, 0}, scale[3] = {1, 1, 1};
        if (Normalize) {
          for (int k = 0; k < 3; ++k) {
            const T* __restrict__ tk = t + k * D;
            // (simd reductions: the sums may be reassociated into vector lanes, else they run one add at a time)
            T sum = 0;
#pragma omp simd reduction(+ : sum)
            for (long d = 0; d < D; ++d) sum += tk[d];
            const T mean = sum / T(D);
            T squares = 0;
#pragma omp simd reduction(+ : squares)
            for (long d = 0; d < D; ++d) squares += (tk[d] - mean) * (tk[d] - mean);
            shift[k] = mean;
            scale[k] = T(1) / std::sqrt(squares / T(D) + eps);
          }
        }
        for (long d = 0; d < D; ++d) {
          const T x0 = (t[d] - shift[0]) * scale[0], x1 = (t[D + d] - shift[1]) * scale[1];
          const T x2 = (t[2 * D + d] - shift[2]) * scale[2];
          turn_inputs<T>(x0, x1, x2, in.data(), d, D, l);
        }
      }
      T* z = zuw.data() + r0 * 3 * OC;
      for (long k0 = 0; k0 < OC; k0 += kRowBlock) {
        const long rows = std::min(kRowBlock, OC - k0);
        four_products(planes, OC, D, k0, rows, in.data(), y.data());
        for (long j = 0; j < rows; ++j) {
          const Members<T> m = row_members(y.data(), j, bias[k0 + j]);
          for (long l = 0; l < n; ++l) {
            T* zl = z + l * 3 * OC + k0 + j;
            zl[0] = m.z[l];
            zl[OC] = m.u[l];
            zl[2 * OC] = m.w[l];
          }
        }
      }
    }  // (the loop's barrier: every orbit value is in zuw before any is read)
    for (long b = 0; b < B; ++b) {
      T* ob = out + b * nc * V;
#pragma omp for schedule(static)
      for (long i = 0; i < V; ++i) {
        T acc[NC > 0 ? NC : 64] = {};
        for (int e = ptr[i]; e < ptr[i + 1]; ++e) {
          const T cu = kTurnU<T>[turn[e]], cw = kTurnW<T>[turn[e]];
          const T* ye = zuw.data() + (b * M + patch[e]) * 3 * OC + row[e];
          for (long c = 0; c < nc; ++c) acc[c] += ye[c] + cu * ye[OC + c] + cw * ye[2 * OC + c];
        }
        const long w = vertex[i];
        const T scale = inv_count[w];
        for (long c = 0; c < nc; ++c) ob[c * V + w] = acc[c] * scale;
      }
    }
  }
}

template <typename T, bool Normalize>
void unpatchify_channels(const T* tokens, long B, long M, long D, long sr, T eps, const T* planes, const T* bias,
                         long OC, long C, const int* vertex, const int* ptr, const int* patch, const int* row,
                         const unsigned char* turn, const T* inv_count, long V, T* out, int threads) {
  switch (C) {
#define EQVIT_CHANNELS(n)                                                                                    \
  case n:                                                                                                    \
    return unpatchify<T, Normalize, n>(tokens, B, M, D, sr, eps, planes, bias, OC, C, vertex, ptr, patch, row, \
                                       turn, inv_count, V, out, threads);
    EQVIT_CHANNELS(1) EQVIT_CHANNELS(2) EQVIT_CHANNELS(3) EQVIT_CHANNELS(4)
#undef EQVIT_CHANNELS
    default:
      return unpatchify<T, Normalize, 0>(tokens, B, M, D, sr, eps, planes, bias, OC, C, vertex, ptr, patch, row,
                                         turn, inv_count, V, out, threads);
  }
}

}  // namespace

extern "C" {

// The most output channels the unpatchify's scatter accumulates per vertex.
long eqvit_c3_max_channels() { return 64; }

// The rows per block of the weight planes' storage (see rows_times_tile).
long eqvit_c3_row_block() { return kRowBlock; }

// normalize: each token is first normalised over its channels, with eps; else the tokens are read as they are.
#define EQVIT_DTYPE(T, S)                                                                                        \
  void eqvit_c3_lift_##S(const T* x, long B, long C, long sxb, long sxc, long sxv, const long* orbit_vertex,     \
                         long M, long O, const T* planes, const T* bias, long D, T* out, int threads) {          \
    lift<T>(x, B, C, sxb, sxc, sxv, orbit_vertex, M, O, planes, bias, D, out, threads);                          \
  }                                                                                                              \
  void eqvit_c3_unpatchify_##S(const T* tokens, long B, long M, long D, long sr, int normalize, double eps,      \
                               const T* planes, const T* bias, long OC, long C, const int* vertex,               \
                               const int* ptr, const int* patch, const int* row, const unsigned char* turn,      \
                               const T* inv_count, long V, T* out, int threads) {                                \
    if (!normalize)                                                                                              \
      return unpatchify_channels<T, false>(tokens, B, M, D, sr, T(0), planes, bias, OC, C, vertex, ptr, patch,   \
                                           row, turn, inv_count, V, out, threads);                               \
    unpatchify_channels<T, true>(tokens, B, M, D, sr, T(eps), planes, bias, OC, C, vertex, ptr, patch, row,      \
                                 turn, inv_count, V, out, threads);                                              \
  }

EQVIT_DTYPE(float, f32)
EQVIT_DTYPE(double, f64)
#undef EQVIT_DTYPE
}
