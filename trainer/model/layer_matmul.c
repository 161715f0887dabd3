/*
 * The matmuls, where almost all of the model's time goes: a fast version
 * (rows in blocks of 4 that share each weight row, blocks spread over
 * OpenMP threads, SIMD reductions) and the obvious reference beside it.
 *
 * Determinism: each output element is summed by exactly one thread in an
 * order fixed by the code (blocks are cut at absolute row indices), so the
 * fast path gives the same bits for any thread count.
 */
#include "layer.h"

#include <stddef.h>

#define ROWS 4 /* Rows of inp that share one pass over a weight row. */

void layer_matmul_forward_ref(float *out, const float *inp, const float *w, const float *bias,
                              int N, int C, int OC) {
  for (int n = 0; n < N; n++) {
    for (int o = 0; o < OC; o++) {
      float sum = bias ? bias[o] : 0.0f;
      for (int c = 0; c < C; c++) sum += inp[(size_t)n * C + c] * w[(size_t)o * C + c];
      out[(size_t)n * OC + o] = sum;
    }
  }
}

/* One output element: bias + dot(x, wrow). */
static float dot_row(const float *x, const float *wrow, float bias, int C) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int c = 0; c < C; c++) sum += x[c] * wrow[c];
  return sum + bias;
}

/* ROWS output rows at once: each weight row is loaded once for all of them. */
static void block_rows(float *out, const float *inp, const float *w, const float *bias, int C,
                       int OC) {
  const float *x0 = inp, *x1 = inp + C, *x2 = inp + 2 * (size_t)C, *x3 = inp + 3 * (size_t)C;
  for (int o = 0; o < OC; o++) {
    const float *wrow = w + (size_t)o * C;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int c = 0; c < C; c++) {
      s0 += x0[c] * wrow[c];
      s1 += x1[c] * wrow[c];
      s2 += x2[c] * wrow[c];
      s3 += x3[c] * wrow[c];
    }
    float b = bias ? bias[o] : 0.0f;
    out[o] = s0 + b;
    out[(size_t)OC + o] = s1 + b;
    out[2 * (size_t)OC + o] = s2 + b;
    out[3 * (size_t)OC + o] = s3 + b;
  }
}

void layer_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                          int C, int OC) {
  int blocks = N / ROWS;
#pragma omp parallel for schedule(static) if ((long)N * C * OC >= LAYER_PAR_MIN_WORK)
  for (int k = 0; k < blocks; k++) {
    size_t n = (size_t)k * ROWS;
    block_rows(out + n * OC, inp + n * C, w, bias, C, OC);
  }
  /* The tail rows (N not a multiple of ROWS), one at a time. */
  for (int n = blocks * ROWS; n < N; n++) {
    for (int o = 0; o < OC; o++) {
      out[(size_t)n * OC + o] =
          dot_row(inp + (size_t)n * C, w + (size_t)o * C, bias ? bias[o] : 0.0f, C);
    }
  }
}

void layer_matmul_backward_ref(float *dinp, float *dw, float *dbias, const float *dout,
                               const float *inp, const float *w, int N, int C, int OC) {
  for (int n = 0; n < N; n++) {
    for (int o = 0; o < OC; o++) {
      float d = dout[(size_t)n * OC + o];
      for (int c = 0; c < C; c++) {
        dinp[(size_t)n * C + c] += d * w[(size_t)o * C + c];
        dw[(size_t)o * C + c] += d * inp[(size_t)n * C + c];
      }
      if (dbias) dbias[o] += d;
    }
  }
}

/* dinp row n += sum over o of dout[n,o] * w[o,:]; rows are independent. */
static void backward_inputs(float *dinp, const float *dout, const float *w, int N, int C, int OC) {
#pragma omp parallel for schedule(static) if ((long)N * C * OC >= LAYER_PAR_MIN_WORK)
  for (int n = 0; n < N; n++) {
    float *drow = dinp + (size_t)n * C;
    for (int o = 0; o < OC; o++) {
      float d = dout[(size_t)n * OC + o];
      const float *wrow = w + (size_t)o * C;
#pragma omp simd
      for (int c = 0; c < C; c++) drow[c] += d * wrow[c];
    }
  }
}

/* dw row o += sum over n of dout[n,o] * inp[n,:]; output channels are independent. */
static void backward_weights(float *dw, float *dbias, const float *dout, const float *inp, int N,
                             int C, int OC) {
#pragma omp parallel for schedule(static) if ((long)N * C * OC >= LAYER_PAR_MIN_WORK)
  for (int o = 0; o < OC; o++) {
    float *dwrow = dw + (size_t)o * C;
    float db = 0.0f;
    for (int n = 0; n < N; n++) {
      float d = dout[(size_t)n * OC + o];
      const float *x = inp + (size_t)n * C;
#pragma omp simd
      for (int c = 0; c < C; c++) dwrow[c] += d * x[c];
      db += d;
    }
    if (dbias) dbias[o] += db;
  }
}

void layer_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                           const float *inp, const float *w, int N, int C, int OC) {
  backward_inputs(dinp, dout, w, N, C, OC);
  backward_weights(dw, dbias, dout, inp, N, C, OC);
}
