// The icosphere tokenizer's inference form in the Fourier basis of a patch's 120-degree turns (C3).
//
// A patch's three tokens read (lifting) or write (unpatchify) its taps with one kernel turned by 0, 120
// and 240 degrees, and the taps fall into orbits of three under the turn. On such a cyclic structure the
// turned kernels act, per orbit, through the orbit's mean and its turning component, a complex number
// under the turn: the dense [3 A, 3 K] product becomes one real [A, K] product on the means and one complex
// [A, K] product on the turning parts, which Gauss's trick computes with three real ones. Four real
// [A, K] products in all, 4/9 of the dense product's multiply-adds, run by PyTorch as one batched product
// (eqvit.nn.fused_icosphere computes the four weight planes). These loops are the passes around it.
//
// Into the turn basis, an orbit (x0, x1, x2) gives the products' four inputs
//     s = x0 + x1 + x2,  a = x0 - (x1 + x2) / 2,  b = sqrt(3) / 2 (x1 - x2),  a - b
// (a + i b is the orbit's turning part), and out of it the four products y0 .. y3 give
//     z = y0 + bias,  u = y1 + y2,  w = sqrt(3) / 2 (y3 - y1 + y2),
//     members (z + u | z - u / 2 + w | z - u / 2 - w).
//
// Built on first use by eqvit.kernels (c++ -O3 -march=native -fopenmp -shared) and called through ctypes.

#include <cmath>

namespace {

constexpr double kHalfRoot3 = 0.86602540378443864676372317075294;

// One orbit's inputs to the four products, written at out[i], out[i + plane], ...
template <typename T>
inline void turn_inputs(T x0, T x1, T x2, T* __restrict__ out, long i, long plane) {
  const T a = x0 - T(0.5) * (x1 + x2), b = T(kHalfRoot3) * (x1 - x2);
  out[i] = x0 + x1 + x2;
  out[plane + i] = a;
  out[2 * plane + i] = b;
  out[3 * plane + i] = a - b;
}

// x [B, C, V] (element strides sxb, sxc, sxv) -> out [4, B M, O C]: for patch m, orbit o of its taps
// (vertices orbit_vertex[m, o, 0..2]) and channel c, the orbit's inputs to the four products.
template <typename T>
void lift_features(const T* __restrict__ x, long B, long C, long sxb, long sxc, long sxv,
                   const long* __restrict__ orbit_vertex, long M, long O, T* __restrict__ out, int threads) {
  const long OC = O * C, plane = B * M * OC;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (long r = 0; r < B * M; ++r) {
    const T* xb = x + (r / M) * sxb;
    const long* ov = orbit_vertex + (r % M) * O * 3;
    for (long o = 0; o < O; ++o) {
      const long v0 = ov[3 * o] * sxv, v1 = ov[3 * o + 1] * sxv, v2 = ov[3 * o + 2] * sxv;
      for (long c = 0; c < C; ++c) {
        const T* xc = xb + c * sxc;
        turn_inputs(xc[v0], xc[v1], xc[v2], out, r * OC + o * C + c, plane);
      }
    }
  }
}

// A patch's three tokens, rows [R, 3 D] (row stride sr) -> out [4, R, D]: the inputs of the four products.
// Normalize: each token first becomes (t - mean) / sqrt(var + eps) over its D channels (a LayerNorm whose
// affine the caller has folded into the products' weights).
template <typename T, bool Normalize>
void token_features(const T* __restrict__ tokens, long R, long D, long sr, T eps, T* __restrict__ out, int threads) {
  const long plane = R * D;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && R >= 16)
  for (long r = 0; r < R; ++r) {
    const T* __restrict__ t = tokens + r * sr;
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
      turn_inputs(x0, x1, x2, out, r * D + d, plane);
    }
  }
}

// The three members from the four products' values y0 .. y3 and the bias of the mean part.
template <typename T>
struct Members {
  T z, u, w;
  inline Members(T y0, T y1, T y2, T y3, T bias)
      : z(y0 + bias), u(y1 + y2), w(T(kHalfRoot3) * (y3 - y1 + y2)) {}
};

// The tokens out [R, 3, D] from the products y [4, R, D] and the bias [D] of the mean part.
template <typename T>
void tokens_from_turn_basis(const T* __restrict__ y, const T* __restrict__ bias, long R, long D, T* __restrict__ out,
                            int threads) {
  const long plane = R * D;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && R >= 16)
  for (long r = 0; r < R; ++r) {
    const T* __restrict__ y0 = y + r * D;
    T* __restrict__ o = out + r * 3 * D;
    for (long d = 0; d < D; ++d) {
      const Members<T> p(y0[d], y0[plane + d], y0[2 * plane + d], y0[3 * plane + d], bias[d]);
      const T h = p.z - T(0.5) * p.u;
      o[d] = p.z + p.u;
      o[D + d] = h + p.w;
      o[2 * D + d] = h - p.w;
    }
  }
}

// The coefficients of u and w that rebuild orbit member r (branch-free: r comes in no order).
template <typename T>
constexpr T kTurnU[3] = {1, -0.5, -0.5};
template <typename T>
constexpr T kTurnW[3] = {0, 1, -1};

// out [B, C, V]: every vertex averages what the patches write on it. y [4, O C, B M] holds the products'
// values for the patches' tap orbits (column b M + m, row o C + c) and bias [O C] the mean part's bias;
// they are first turned, in place, into the mean and turning parts z, u, w (planes 0, 1, 2 of y). Then
// vertices are visited in the order vertex[0 .. V) (by the first patch that writes them, so that y is read
// nearly in sequence); the i-th receives entries ptr[i] .. ptr[i+1] - 1, entry e being member turn[e] of
// orbit row[e] / C of patch patch[e]. Its sum is scaled by inv_count.
// NC > 0: the channel count as a compile-time constant (the loops over channels unroll); 0: C at run time.
template <typename T, int NC>
void scatter_channels(T* __restrict__ y, const T* __restrict__ bias, long B, long M, long OC, long C,
                      const int* vertex, const int* ptr, const int* patch, const int* row, const unsigned char* turn,
                      const T* inv_count, long V, T* out, int threads) {
  const long nc = NC > 0 ? NC : C, R = B * M, plane = OC * R;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
#pragma omp for schedule(static)
    for (long k = 0; k < OC; ++k) {
      T* __restrict__ y0 = y + k * R;
      for (long r = 0; r < R; ++r) {
        const Members<T> p(y0[r], y0[plane + r], y0[2 * plane + r], y0[3 * plane + r], bias[k]);
        y0[r] = p.z;
        y0[plane + r] = p.u;
        y0[2 * plane + r] = p.w;
      }
    }  // (the loop's barrier: every value is turned before any is read)
    for (long b = 0; b < B; ++b) {
      T* ob = out + b * nc * V;
#pragma omp for schedule(static)
      for (long i = 0; i < V; ++i) {
        T acc[NC > 0 ? NC : 64] = {};
        for (int e = ptr[i]; e < ptr[i + 1]; ++e) {
          const T cu = kTurnU<T>[turn[e]], cw = kTurnW<T>[turn[e]];
          const T* ye = y + row[e] * R + b * M + patch[e];
          for (long c = 0; c < nc; ++c) {
            const T* yc = ye + c * R;
            acc[c] += yc[0] + cu * yc[plane] + cw * yc[2 * plane];
          }
        }
        const long w = vertex[i];
        const T scale = inv_count[w];
        for (long c = 0; c < nc; ++c) ob[c * V + w] = acc[c] * scale;
      }
    }
  }
}

template <typename T>
void scatter(T* y, const T* bias, long B, long M, long OC, long C, const int* vertex, const int* ptr,
             const int* patch, const int* row, const unsigned char* turn, const T* inv_count, long V, T* out,
             int threads) {
  switch (C) {
#define EQVIT_CHANNELS(n)                                                                                        \
  case n:                                                                                                        \
    return scatter_channels<T, n>(y, bias, B, M, OC, C, vertex, ptr, patch, row, turn, inv_count, V, out, threads);
    EQVIT_CHANNELS(1) EQVIT_CHANNELS(2) EQVIT_CHANNELS(3) EQVIT_CHANNELS(4)
#undef EQVIT_CHANNELS
    default:
      return scatter_channels<T, 0>(y, bias, B, M, OC, C, vertex, ptr, patch, row, turn, inv_count, V, out, threads);
  }
}

}  // namespace

extern "C" {

// The most output channels the unpatchify's scatter accumulates per vertex.
long eqvit_c3_max_channels() { return 64; }

#define EQVIT_DTYPE(T, S)                                                                                        \
  void eqvit_c3_lift_features_##S(const T* x, long B, long C, long sxb, long sxc, long sxv,                      \
                                  const long* orbit_vertex, long M, long O, T* out, int threads) {               \
    lift_features<T>(x, B, C, sxb, sxc, sxv, orbit_vertex, M, O, out, threads);                                  \
  }                                                                                                              \
  void eqvit_c3_token_features_##S(const T* tokens, long R, long D, long sr, T* out, int threads) {              \
    token_features<T, false>(tokens, R, D, sr, T(0), out, threads);                                              \
  }                                                                                                              \
  void eqvit_c3_normed_token_features_##S(const T* tokens, long R, long D, long sr, double eps, T* out,          \
                                          int threads) {                                                         \
    token_features<T, true>(tokens, R, D, sr, T(eps), out, threads);                                             \
  }                                                                                                              \
  void eqvit_c3_tokens_##S(const T* y, const T* bias, long R, long D, T* out, int threads) {                     \
    tokens_from_turn_basis<T>(y, bias, R, D, out, threads);                                                      \
  }                                                                                                              \
  void eqvit_c3_scatter_##S(T* y, const T* bias, long B, long M, long OC, long C, const int* vertex,       \
                            const int* ptr, const int* patch, const int* row, const unsigned char* turn,          \
                            const T* inv_count, long V, T* out, int threads) {                                   \
    scatter<T>(y, bias, B, M, OC, C, vertex, ptr, patch, row, turn, inv_count, V, out, threads);                 \
  }

EQVIT_DTYPE(float, f32)
EQVIT_DTYPE(double, f64)
#undef EQVIT_DTYPE
}
