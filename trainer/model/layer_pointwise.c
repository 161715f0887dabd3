/*
 * The small layers that touch each value once: token + position embedding,
 * GELU and the residual add.
 */
#include "layer.h"

#include <math.h>
#include <stddef.h>

void layer_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe,
                           int B, int T, int C) {
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      float *y = out + ((size_t)b * T + t) * C;
      const float *te = wte + (size_t)inp[(size_t)b * T + t] * C;
      const float *pe = wpe + (size_t)t * C;
      for (int c = 0; c < C; c++) y[c] = te[c] + pe[c];
    }
  }
}

void layer_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                            int T, int C) {
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      const float *dy = dout + ((size_t)b * T + t) * C;
      float *dte = dwte + (size_t)inp[(size_t)b * T + t] * C;
      float *dpe = dwpe + (size_t)t * C;
      for (int c = 0; c < C; c++) {
        dte[c] += dy[c];
        dpe[c] += dy[c];
      }
    }
  }
}

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

/* gelu(x) = x/2 * (1 + tanh(k * (x + a x^3))). */
void layer_gelu_forward(float *out, const float *inp, int n) {
  for (int i = 0; i < n; i++) {
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_A * x * x * x)));
  }
}

void layer_gelu_backward(float *dinp, const float *inp, const float *dout, int n) {
  for (int i = 0; i < n; i++) {
    float x = inp[i];
    float u = GELU_K * (x + GELU_A * x * x * x);
    float th = tanhf(u);
    float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
    dinp[i] += grad * dout[i];
  }
}

void layer_residual_forward(float *out, const float *a, const float *b, int n) {
  for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void layer_residual_backward(float *da, float *db, const float *dout, int n) {
  for (int i = 0; i < n; i++) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}
