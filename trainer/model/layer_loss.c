/*
 * Softmax over the vocabulary and the cross-entropy loss against the target
 * token, fused because the backward of the pair is simply probs - onehot.
 */
#include "layer.h"

#include <math.h>
#include <stddef.h>

void layer_softmax_xent_forward(float *probs, float *losses, const float *logits,
                                const int32_t *targets, int N, int V) {
#pragma omp parallel for schedule(static) if ((long)N * V >= LAYER_PAR_MIN_WORK / 8)
  for (int n = 0; n < N; n++) {
    const float *z = logits + (size_t)n * V;
    float *p = probs + (size_t)n * V;
    float maxv = -INFINITY;
    for (int v = 0; v < V; v++) maxv = z[v] > maxv ? z[v] : maxv;
    float sum = 0.0f;
    for (int v = 0; v < V; v++) {
      p[v] = expf(z[v] - maxv);
      sum += p[v];
    }
    for (int v = 0; v < V; v++) p[v] /= sum;
    /* -log p[target], from the logits so that a tiny probability stays finite. */
    if (losses) losses[n] = logf(sum) - (z[targets[n]] - maxv);
  }
}

void layer_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *targets,
                                 float dloss, int N, int V) {
#pragma omp parallel for schedule(static) if ((long)N * V >= LAYER_PAR_MIN_WORK / 8)
  for (int n = 0; n < N; n++) {
    const float *p = probs + (size_t)n * V;
    float *dz = dlogits + (size_t)n * V;
    for (int v = 0; v < V; v++) {
      float onehot = v == targets[n] ? 1.0f : 0.0f;
      dz[v] += (p[v] - onehot) * dloss;
    }
  }
}
