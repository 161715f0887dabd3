/*
 * Causal multi-head self-attention, forward and backward, written the
 * direct way: for every (batch, head, query position) a softmax over the
 * keys at or before it. Parallel over independent rows with OpenMP; every
 * output is written by one thread, so results do not depend on the thread
 * count.
 */
#include "layer.h"

#include <math.h>
#include <stddef.h>

/* One query row: att_row (T) gets the probabilities, out_row (hs) the mix of values. */
static void attend_row(float *out_row, float *att_row, const float *inp_b, int t, int h, int T,
                       int C, int hs) {
  const size_t C3 = 3 * (size_t)C;
  const float *q = inp_b + t * C3 + (size_t)h * hs;
  float scale = 1.0f / sqrtf((float)hs);
  float maxv = -INFINITY;
  for (int t2 = 0; t2 <= t; t2++) {
    const float *k = inp_b + t2 * C3 + C + (size_t)h * hs;
    float s = 0.0f;
    for (int i = 0; i < hs; i++) s += q[i] * k[i];
    s *= scale;
    att_row[t2] = s;
    if (s > maxv) maxv = s;
  }
  float sum = 0.0f;
  for (int t2 = 0; t2 <= t; t2++) {
    att_row[t2] = expf(att_row[t2] - maxv);
    sum += att_row[t2];
  }
  for (int t2 = 0; t2 < T; t2++) att_row[t2] = t2 <= t ? att_row[t2] / sum : 0.0f;
  for (int i = 0; i < hs; i++) out_row[i] = 0.0f;
  for (int t2 = 0; t2 <= t; t2++) {
    const float *v = inp_b + t2 * C3 + 2 * (size_t)C + (size_t)h * hs;
    for (int i = 0; i < hs; i++) out_row[i] += att_row[t2] * v[i];
  }
}

void layer_attention_forward(float *out, float *att, const float *inp, int B, int T, int C,
                             int NH) {
  int hs = C / NH;
#pragma omp parallel for collapse(3) schedule(static) if ((long)B * T * T * C >= LAYER_PAR_MIN_WORK)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      for (int h = 0; h < NH; h++) {
        const float *inp_b = inp + (size_t)b * T * 3 * C;
        float *att_row = att + (((size_t)b * NH + h) * T + t) * T;
        float *out_row = out + ((size_t)b * T + t) * C + (size_t)h * hs;
        attend_row(out_row, att_row, inp_b, t, h, T, C, hs);
      }
    }
  }
}

/*
 * One query row of the backward. Writes datt_row; adds into dq (this row's
 * query) and into dk, dv of every earlier position of the same (b, h), which
 * is why the parallel loop runs over (b, h) and not over rows.
 */
static void attend_row_backward(float *dinp_b, float *datt_row, const float *dout_row,
                                const float *inp_b, const float *att_row, int t, int h, int C,
                                int hs) {
  const size_t C3 = 3 * (size_t)C;
  const float *q = inp_b + t * C3 + (size_t)h * hs;
  float *dq = dinp_b + t * C3 + (size_t)h * hs;
  float scale = 1.0f / sqrtf((float)hs);
  /* out = sum att * v: gradients of att and v. */
  for (int t2 = 0; t2 <= t; t2++) {
    const float *v = inp_b + t2 * C3 + 2 * (size_t)C + (size_t)h * hs;
    float *dv = dinp_b + t2 * C3 + 2 * (size_t)C + (size_t)h * hs;
    float d = 0.0f;
    for (int i = 0; i < hs; i++) {
      d += dout_row[i] * v[i];
      dv[i] += att_row[t2] * dout_row[i];
    }
    datt_row[t2] = d;
  }
  /* Softmax backward: dpre = att * (datt - sum(att * datt)). */
  float dot = 0.0f;
  for (int t2 = 0; t2 <= t; t2++) dot += att_row[t2] * datt_row[t2];
  for (int t2 = 0; t2 <= t; t2++) {
    float dpre = att_row[t2] * (datt_row[t2] - dot) * scale;
    const float *k = inp_b + t2 * C3 + C + (size_t)h * hs;
    float *dk = dinp_b + t2 * C3 + C + (size_t)h * hs;
    for (int i = 0; i < hs; i++) {
      dq[i] += dpre * k[i];
      dk[i] += dpre * q[i];
    }
  }
}

void layer_attention_backward(float *dinp, float *datt, const float *dout, const float *inp,
                              const float *att, int B, int T, int C, int NH) {
  int hs = C / NH;
#pragma omp parallel for collapse(2) schedule(static) if ((long)B * T * T * C >= LAYER_PAR_MIN_WORK)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const float *inp_b = inp + (size_t)b * T * 3 * C;
      float *dinp_b = dinp + (size_t)b * T * 3 * C;
      for (int t = 0; t < T; t++) {
        size_t row = (((size_t)b * NH + h) * T + t) * T;
        const float *dout_row = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
        attend_row_backward(dinp_b, datt + row, dout_row, inp_b, att + row, t, h, C, hs);
      }
    }
  }
}
