// The icosphere tokenizer's inference form in the Fourier basis of a patch's 120-degree turns (C3).
//
// A patch's three tokens read (lifting) or write (unpatchify) its taps with one kernel turned by 0, 120
// and 240 degrees, and the taps fall into orbits of three under the turn. On such a cyclic structure the
// turned kernels act, per orbit, through the orbit's mean and two "turning" components (the real form of
// the DFT over C3): the dense [3 D, 3 K] product becomes one [D, K] and one [2 D, 2 K] product, 5/9 of the
// multiply-adds (eqvit.nn.fused_icosphere computes the factors). The matrix products stay with PyTorch;
// these loops are the passes around them: the change into the turn basis, and back out of it.
//
// In the turn basis an orbit (x0, x1, x2) is (x0 + x1 + x2 | x0 - (x1 + x2) / 2 | x1 - x2), and the three
// members are rebuilt from a mean part z and turning parts (u, v) as (z + u | z + v | z - u - v).
//
// Built on first use by eqvit.kernels (c++ -O3 -march=native -fopenmp -shared) and called through ctypes.

#include <cstring>

namespace {

// x [B, C, V] (element strides sxb, sxc, sxv) -> out [B, M, 3, O, C]: for patch m, orbit o of its taps
// (vertices orbit_vertex[m, o, 0..2]) and channel c, the orbit in the turn basis.
template <typename T>
void lift_features(const T* __restrict__ x, long B, long C, long sxb, long sxc, long sxv,
                   const long* __restrict__ orbit_vertex, long M, long O, T* __restrict__ out, int threads) {
  const long OC = O * C;
  for (long b = 0; b < B; ++b) {
    const T* xb = x + b * sxb;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (long m = 0; m < M; ++m) {
      const long* ov = orbit_vertex + m * O * 3;
      T* f = out + (b * M + m) * 3 * OC;
      for (long o = 0; o < O; ++o) {
        const long v0 = ov[3 * o] * sxv, v1 = ov[3 * o + 1] * sxv, v2 = ov[3 * o + 2] * sxv;
        for (long c = 0; c < C; ++c) {
          const T* xc = xb + c * sxc;
          const T x0 = xc[v0], x1 = xc[v1], x2 = xc[v2];
          f[o * C + c] = x0 + x1 + x2;
          f[OC + o * C + c] = x0 - T(0.5) * (x1 + x2);
          f[2 * OC + o * C + c] = x1 - x2;
        }
      }
    }
  }
}

// Rows of a patch's three tokens [R, 3, D] (row stride sr) -> out [R, 3, D], the tokens in the turn basis.
template <typename T>
void token_features(const T* __restrict__ tokens, long R, long D, long sr, T* __restrict__ out, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && R >= 16)
  for (long r = 0; r < R; ++r) {
    const T* __restrict__ t0 = tokens + r * sr;
    const T* __restrict__ t1 = t0 + D;
    const T* __restrict__ t2 = t1 + D;
    T* __restrict__ o = out + r * 3 * D;
    for (long d = 0; d < D; ++d) {
      o[d] = t0[d] + t1[d] + t2[d];
      o[D + d] = t0[d] - T(0.5) * (t1[d] + t2[d]);
      o[2 * D + d] = t1[d] - t2[d];
    }
  }
}

// A patch's three tokens out [R, 3, D] from the mean part z [R, D] and the turning parts uv [R, 2, D].
template <typename T>
void tokens_from_turn_basis(const T* __restrict__ z, const T* __restrict__ uv, long R, long D, T* __restrict__ out,
                            int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && R >= 16)
  for (long r = 0; r < R; ++r) {
    const T* __restrict__ zr = z + r * D;
    const T* __restrict__ u = uv + r * 2 * D;
    const T* __restrict__ v = u + D;
    T* __restrict__ o = out + r * 3 * D;
    for (long d = 0; d < D; ++d) {
      o[d] = zr[d] + u[d];
      o[D + d] = zr[d] + v[d];
      o[2 * D + d] = zr[d] - u[d] - v[d];
    }
  }
}

// The coefficients of u and v that rebuild orbit member r (branch-free: r comes in no order).
template <typename T>
constexpr T kTurnU[3] = {1, 0, -1};
template <typename T>
constexpr T kTurnV[3] = {0, 1, -1};

// out [B, C, V]: every vertex averages what the patches write on it. z [B, M, O C] and uv [B, M, 2 O C]
// hold the values of the patches' tap orbits in the turn basis. Vertices are visited in the order
// vertex[0 .. V) (by the first patch that writes them, so that z and uv are read nearly in sequence); the
// i-th receives entries ptr[i] .. ptr[i+1] - 1, entry e being member turn[e] of the orbit whose z starts
// at zoff[e] (m O C + o C) and whose u starts at uoff[e] (2 m O C + o C). Its sum is scaled by inv_count.
// NC > 0: the channel count as a compile-time constant (the loops over channels unroll); 0: C at run time.
template <typename T, int NC>
void scatter_channels(const T* z, const T* uv, long B, long M, long OC, long C, const int* vertex, const int* ptr,
                      const int* zoff, const int* uoff, const unsigned char* turn, const T* inv_count, long V,
                      T* out, int threads) {
  const long nc = NC > 0 ? NC : C;
  for (long b = 0; b < B; ++b) {
    const T* zb = z + b * M * OC;
    const T* ub = uv + b * M * 2 * OC;
    T* ob = out + b * nc * V;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (long i = 0; i < V; ++i) {
      T acc[NC > 0 ? NC : 64] = {};
      for (int e = ptr[i]; e < ptr[i + 1]; ++e) {
        const T* ze = zb + zoff[e];
        const T* u = ub + uoff[e];
        const T* v = u + OC;
        const T cu = kTurnU<T>[turn[e]], cv = kTurnV<T>[turn[e]];
        for (long c = 0; c < nc; ++c) acc[c] += ze[c] + cu * u[c] + cv * v[c];
      }
      const long w = vertex[i];
      const T scale = inv_count[w];
      for (long c = 0; c < nc; ++c) ob[c * V + w] = acc[c] * scale;
    }
  }
}

template <typename T>
void scatter(const T* z, const T* uv, long B, long M, long OC, long C, const int* vertex, const int* ptr,
             const int* zoff, const int* uoff, const unsigned char* turn, const T* inv_count, long V, T* out,
             int threads) {
  switch (C) {
#define EQVIT_CHANNELS(n)                                                                                   \
  case n:                                                                                                   \
    return scatter_channels<T, n>(z, uv, B, M, OC, C, vertex, ptr, zoff, uoff, turn, inv_count, V, out, \
                                  threads);
    EQVIT_CHANNELS(1) EQVIT_CHANNELS(2) EQVIT_CHANNELS(3) EQVIT_CHANNELS(4)
#undef EQVIT_CHANNELS
    default:
      return scatter_channels<T, 0>(z, uv, B, M, OC, C, vertex, ptr, zoff, uoff, turn, inv_count, V, out, threads);
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
    token_features<T>(tokens, R, D, sr, out, threads);                                                           \
  }                                                                                                              \
  void eqvit_c3_tokens_##S(const T* z, const T* uv, long R, long D, T* out, int threads) {                       \
    tokens_from_turn_basis<T>(z, uv, R, D, out, threads);                                                        \
  }                                                                                                              \
  void eqvit_c3_scatter_##S(const T* z, const T* uv, long B, long M, long OC, long C, const int* vertex,          \
                            const int* ptr, const int* zoff, const int* uoff, const unsigned char* turn,          \
                            const T* inv_count, long V, T* out, int threads) {                                   \
    scatter<T>(z, uv, B, M, OC, C, vertex, ptr, zoff, uoff, turn, inv_count, V, out, threads);                   \
  }

EQVIT_DTYPE(float, f32)
EQVIT_DTYPE(double, f64)
#undef EQVIT_DTYPE
}
