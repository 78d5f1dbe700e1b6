// SO(3)-RoPE's rotation of queries and keys, in place, for the inference form (eqvit.fuse).
//
// Every row x (one query or key head of one token) is multiplied by the token's block-diagonal
// Wigner-D matrix pi = D^0 + D^1 + ... + D^L on its first (L+1)^2 channels. D^0 = 1, so orders 1..L
// move: x[l^2 .. l^2 + 2l] <- D^l x[l^2 .. l^2 + 2l]. A batched matmul over tokens pays for the
// zero blocks of pi and for a write back; here each order is its own small product, computed for
// W rows at once with the rows in the vector lanes (the heads of a token share its matrix): a tile
// of W rows is loaded as vectors and transposed in registers, rotated, transposed back and stored.
//
// Turned form: where tokens come in groups that share a pose up to a turn about its z-axis (the
// icosphere's three tokens per patch), pi = pi_group Z(turn), and Z only mixes the channels m and -m of
// each order with the cosine and sine of m times the turn. The kernel then reads one set of blocks per
// group and 2L numbers per token: a third of the blocks' memory traffic, which inside a model (where the
// blocks are not in cache) is much of the rotation's time.
//
// For L <= kMaxFixedOrder the orders are compile-time constants (every loop unrolls, the tiles stay in
// registers), and a group's tokens go three at a time, each entry of its blocks read once for all three.
// Inside SO3ViT's blocks (batch 1, L = 4) a rotation took 148 us against 167 us for the per-token kernel
// with the orders looped at run time (median per call, measured inside the model on a 2-core EPYC).
//
// Built on first use by eqvit.kernels (c++ -O3 -march=native -fopenmp -shared) and called through
// ctypes. Tokens are split over OpenMP threads (the libgomp that torch has loaded, when it has).

#include <cstring>

namespace {

constexpr long kMaxOrder = 15;
constexpr long kMaxMoving = (kMaxOrder + 1) * (kMaxOrder + 1) - 1;  // channels 1..(L+1)^2-1

template <typename T, int W>
struct Lanes {
  typedef T type __attribute__((vector_size(W * sizeof(T))));
};

template <typename V>
inline V load(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

template <typename V>
inline void store(void* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

// W x W transpose in registers: v[r][c] <- v[c][r].
inline void transpose(Lanes<float, 8>::type* v) {
  typedef Lanes<float, 8>::type V;
  V t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shufflevector(v[i], v[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(v[i], v[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = __builtin_shufflevector(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[i + 1] = __builtin_shufflevector(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[i + 2] = __builtin_shufflevector(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[i + 3] = __builtin_shufflevector(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = __builtin_shufflevector(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    v[i + 4] = __builtin_shufflevector(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

inline void transpose(Lanes<double, 4>::type* v) {
  typedef Lanes<double, 4>::type V;
  V t0 = __builtin_shufflevector(v[0], v[1], 0, 4, 2, 6), t1 = __builtin_shufflevector(v[0], v[1], 1, 5, 3, 7);
  V t2 = __builtin_shufflevector(v[2], v[3], 0, 4, 2, 6), t3 = __builtin_shufflevector(v[2], v[3], 1, 5, 3, 7);
  v[0] = __builtin_shufflevector(t0, t2, 0, 1, 4, 5);
  v[1] = __builtin_shufflevector(t1, t3, 0, 1, 4, 5);
  v[2] = __builtin_shufflevector(t0, t2, 2, 3, 6, 7);
  v[3] = __builtin_shufflevector(t1, t3, 2, 3, 6, 7);
}

// One order for K tiles that share P: out[k][c + i] = sum_j P[i][j] in[k][c + j], i, j < D, every lane (row)
// at once; each entry of P is read once for the K tiles. Moving: the tiles' capacity in channels.
template <typename T, int W, int D, int K, int Moving>
inline __attribute__((always_inline)) void rotate_order(typename Lanes<T, W>::type (*__restrict__ in)[Moving],
                                                        typename Lanes<T, W>::type (*__restrict__ out)[Moving],
                                                        long c, const T* __restrict__ P) {
  typedef typename Lanes<T, W>::type V;
  for (int i = 0; i < D; ++i) {
    V acc[K];
    for (int k = 0; k < K; ++k) acc[k] = in[k][c] * P[i * D];
    for (int j = 1; j < D; ++j) {
      const T p = P[i * D + j];
      for (int k = 0; k < K; ++k) acc[k] += in[k][c + j] * p;
    }
    for (int k = 0; k < K; ++k) out[k][c + i] = acc[k];
  }
}

constexpr long order_offset(long l) {  // where D^l starts among the blocks D^1 .. D^L
  long offset = 0;
  for (long i = 1; i < l; ++i) offset += (2 * i + 1) * (2 * i + 1);
  return offset;
}

// Orders 1..L on the moving channels (index c = channel - 1; order l holds c = l^2 - 1 .. l^2 + 2l - 1),
// L at run time: each order's width is still a compile-time constant, so its product unrolls fully.
template <typename T, int W, int K, int Moving>
inline void rotate_orders(typename Lanes<T, W>::type (*in)[Moving], typename Lanes<T, W>::type (*out)[Moving],
                          const T* P, long L) {
  for (long l = 1; l <= L; ++l) {
    switch (l) {
#define EQVIT_ORDER(n)                                                             \
  case n:                                                                          \
    rotate_order<T, W, 2 * n + 1, K, Moving>(in, out, n * n - 1, P + order_offset(n)); \
    break;
      EQVIT_ORDER(1) EQVIT_ORDER(2) EQVIT_ORDER(3) EQVIT_ORDER(4) EQVIT_ORDER(5)
      EQVIT_ORDER(6) EQVIT_ORDER(7) EQVIT_ORDER(8) EQVIT_ORDER(9) EQVIT_ORDER(10)
      EQVIT_ORDER(11) EQVIT_ORDER(12) EQVIT_ORDER(13) EQVIT_ORDER(14) EQVIT_ORDER(15)
#undef EQVIT_ORDER
    }
  }
}

// Orders 1..l with l a compile-time constant (L <= kMaxFixedOrder; SO3ViT's heads have L = 4 or 7): the
// loop over orders unrolls too, and the tiles stay in registers.
constexpr int kMaxFixedOrder = 8;

template <typename T, int W, int K, int Moving, int l>
inline __attribute__((always_inline)) void fixed_orders(typename Lanes<T, W>::type (*in)[Moving],
                                                        typename Lanes<T, W>::type (*out)[Moving], const T* P) {
  if constexpr (l >= 1) {
    fixed_orders<T, W, K, Moving, l - 1>(in, out, P);
    rotate_order<T, W, 2 * l + 1, K, Moving>(in, out, l * l - 1, P + order_offset(l));
  }
}

// A turn about the z-axis, every lane at once: for each order l and 1 <= m <= l, channels (-m, +m) become
// (c x_{-m} - s x_{+m}, s x_{-m} + c x_{+m}) with c, s = turn[2 (m - 1)], turn[2 m - 1].
template <typename T, int W>
inline void turn_orders(typename Lanes<T, W>::type* in, const T* turn, long L) {
  typedef typename Lanes<T, W>::type V;
  for (long l = 1; l <= L; ++l) {
    V* centre = in + l * l + l - 1;  // channel l^2 + l (m = 0), as a moving index
    for (long m = 1; m <= l; ++m) {
      const T c = turn[2 * (m - 1)], s = turn[2 * m - 1];
      const V minus = centre[-m], plus = centre[m];
      centre[-m] = minus * c - plus * s;
      centre[m] = minus * s + plus * c;
    }
  }
}

// K tiles of W full rows that share the blocks P: tile k's rows at first[k * step + r * sr + channel], each
// turned first by turn[2 L k ..] where turn is not null. Whole groups of W moving channels go through
// transposes, the remaining (< W) channels are gathered lane by lane. FixedL > 0: L = FixedL, known at
// compile time; 0: L at run time (then the tiles have room for kMaxOrder).
template <typename T, int W, int K, int FixedL>
void rotate_tiles(T* first, long step, long sr, const T* turn, const T* P, long L) {
  typedef typename Lanes<T, W>::type V;
  constexpr int capacity = FixedL > 0 ? (FixedL + 1) * (FixedL + 1) - 1 : kMaxMoving;
  if constexpr (FixedL > 0) L = FixedL;
  const long moving = (L + 1) * (L + 1) - 1, grouped = moving / W * W;
  V in[K][capacity], out[K][capacity];
  for (int k = 0; k < K; ++k) {
    const T* x1 = first + k * step + 1;  // channel 0 (order 0) stays
    for (long g = 0; g < grouped; g += W) {
      for (int r = 0; r < W; ++r) in[k][g + r] = load<V>(x1 + r * sr + g);
      transpose(in[k] + g);
    }
    for (long c = grouped; c < moving; ++c) {
      V lanes{};
      for (int r = 0; r < W; ++r) lanes[r] = x1[r * sr + c];
      in[k][c] = lanes;
    }
    if (turn != nullptr) turn_orders<T, W>(in[k], turn + k * 2 * L, L);
  }
  if constexpr (FixedL > 0) {
    fixed_orders<T, W, K, capacity, FixedL>(in, out, P);
  } else {
    rotate_orders<T, W, K, capacity>(in, out, P, L);
  }
  for (int k = 0; k < K; ++k) {
    T* x1 = first + k * step + 1;
    for (long g = 0; g < grouped; g += W) {
      transpose(out[k] + g);
      for (int r = 0; r < W; ++r) store<V>(x1 + r * sr + g, out[k][g + r]);
    }
    for (long c = grouped; c < moving; ++c) {
      for (int r = 0; r < W; ++r) x1[r * sr + c] = out[k][c][r];
    }
  }
}

// x: [batch, tokens, rows, >= (L+1)^2] with element strides (sb, sn, sr, 1);
// blocks: [tokens / group, sum_{l=1..L} (2l+1)^2], the blocks D^1 .. D^L of token n's group n / group,
// row-major, contiguous; turns: null (group 1), or [tokens, 2 L], token n's (cos m t, sin m t), m = 1..L.
// Groups are split over the threads. Where a token's rows make one tile and L is fixed, a group's tokens
// go kShare at a time, each entry of the blocks read once for them all.
constexpr int kShare = 3;

template <typename T, int W, int FixedL>
void rotate_groups(T* x, long batch, long tokens, long rows, long sb, long sn, long sr, const T* blocks,
                   const T* turns, long group, long L, int threads) {
  const long per_token = order_offset(L + 1), turn_step = turns == nullptr ? 0 : 2 * L;
  const long width = (L + 1) * (L + 1), groups = tokens / group, full = rows / W * W;
  const bool shared = FixedL > 0 && rows == W;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && batch * tokens >= 64)
  for (long t = 0; t < batch * groups; ++t) {
    const long b = t / groups, g = t % groups;
    const T* P = blocks + g * per_token;
    T* first = x + b * sb + g * group * sn;
    const T* turn = turns == nullptr ? nullptr : turns + g * group * turn_step;
    long s = 0;
    if constexpr (FixedL > 0) {
      if (shared) {
        for (; s + kShare <= group; s += kShare) {
          rotate_tiles<T, W, kShare, FixedL>(first + s * sn, sn, sr, turn ? turn + s * turn_step : nullptr, P, L);
        }
      }
    }
    for (; s < group; ++s) {
      T* token = first + s * sn;
      const T* token_turn = turn ? turn + s * turn_step : nullptr;
      for (long r0 = 0; r0 < full; r0 += W) rotate_tiles<T, W, 1, FixedL>(token + r0 * sr, 0, sr, token_turn, P, L);
      if (full < rows) {  // fewer than W rows left: through a zero-padded tile
        T tile[W * (kMaxMoving + 1)] = {};
        for (long r = full; r < rows; ++r) std::memcpy(tile + (r - full) * width, token + r * sr, width * sizeof(T));
        rotate_tiles<T, W, 1, 0>(tile, 0, width, token_turn, P, L);
        for (long r = full; r < rows; ++r) std::memcpy(token + r * sr, tile + (r - full) * width, width * sizeof(T));
      }
    }
  }
}

template <typename T, int W>
void rotate(T* x, long batch, long tokens, long rows, long sb, long sn, long sr, const T* blocks, const T* turns,
            long group, long L, int threads) {
  switch (L) {
    case 0:
      return;  // nothing moves
#define EQVIT_FIXED(n) \
  case n:              \
    return rotate_groups<T, W, n>(x, batch, tokens, rows, sb, sn, sr, blocks, turns, group, L, threads);
      EQVIT_FIXED(1) EQVIT_FIXED(2) EQVIT_FIXED(3) EQVIT_FIXED(4) EQVIT_FIXED(5) EQVIT_FIXED(6) EQVIT_FIXED(7)
      EQVIT_FIXED(8)
#undef EQVIT_FIXED
      static_assert(kMaxFixedOrder == 8, "the cases above instantiate orders 1 .. kMaxFixedOrder");
    default:
      return rotate_groups<T, W, 0>(x, batch, tokens, rows, sb, sn, sr, blocks, turns, group, L, threads);
  }
}

}  // namespace

extern "C" {

// The largest order L the kernels unroll; eqvit.fuse keeps the matmul form above it.
long eqvit_so3_rotate_max_order() { return kMaxOrder; }

// x rotated in place (see rotate): blocks per group of `group` consecutive tokens; turns null (and group 1,
// the per-token form) or per token.
void eqvit_so3_rotate_f32(float* x, long batch, long tokens, long rows, long sb, long sn, long sr,
                          const float* blocks, const float* turns, long group, long L, int threads) {
  rotate<float, 8>(x, batch, tokens, rows, sb, sn, sr, blocks, turns, group, L, threads);
}

void eqvit_so3_rotate_f64(double* x, long batch, long tokens, long rows, long sb, long sn, long sr,
                          const double* blocks, const double* turns, long group, long L, int threads) {
  rotate<double, 4>(x, batch, tokens, rows, sb, sn, sr, blocks, turns, group, L, threads);
}
}
