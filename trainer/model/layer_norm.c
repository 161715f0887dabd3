/*
 * Layer normalisation over the channels of each row, with learned scale and
 * shift. The saved mean and reciprocal standard deviation make the backward
 * a single pass per row.
 */
#include "layer.h"

#include <math.h>
#include <stddef.h>

#define LN_EPS 1e-5f

void layer_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                             const float *b, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    float m = 0.0f;
    for (int c = 0; c < C; c++) m += x[c];
    m /= (float)C;
    float var = 0.0f;
    for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    var /= (float)C;
    float s = 1.0f / sqrtf(var + LN_EPS);
    float *y = out + (size_t)n * C;
    for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

/*
 * With xhat = (x - mean) * rstd and g = dout * w:
 * dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
 */
void layer_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                              const float *inp, const float *w, const float *mean,
                              const float *rstd, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    const float *dy = dout + (size_t)n * C;
    float *dx = dinp + (size_t)n * C;
    float g_mean = 0.0f, gx_mean = 0.0f;
    for (int c = 0; c < C; c++) {
      float xhat = (x[c] - mean[n]) * rstd[n];
      float g = dy[c] * w[c];
      g_mean += g;
      gx_mean += g * xhat;
    }
    g_mean /= (float)C;
    gx_mean /= (float)C;
    for (int c = 0; c < C; c++) {
      float xhat = (x[c] - mean[n]) * rstd[n];
      float g = dy[c] * w[c];
      db[c] += dy[c];
      dw[c] += dy[c] * xhat;
      dx[c] += rstd[n] * (g - g_mean - xhat * gx_mean);
    }
  }
}
