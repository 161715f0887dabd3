/*
 * layer: the GPT's layers as plain f32 kernels, each a forward and a
 * backward over row-major buffers. The model (model_forward.c and
 * model_backward.c) strings them together; the tests check every backward
 * against finite differences.
 *
 * Dimension legend (used in every shape comment below and in the model):
 *   B  batch size (sequences)         T  sequence length (positions)
 *   C  channels (embedding width)     L  number of transformer blocks
 *   NH attention heads (C % NH == 0)  hs head size, C / NH
 *   V  vocabulary size                N  rows, B * T
 *   OC output channels of a matmul
 *
 * Conventions: forwards overwrite their outputs; backwards ADD into every
 * gradient they produce (inputs' and parameters'), so the caller zeroes
 * gradient buffers once and tied or shared tensors accumulate naturally.
 * Kernels do not allocate and do not fail; the model validates shapes.
 *
 * Threading: the matmuls and attention use OpenMP parallel loops (when built
 * with OpenMP). Every output element is computed by one thread in a fixed
 * order, so results are bit-identical whatever the thread count. Loops of
 * less than LAYER_PAR_MIN_WORK multiply-adds stay on the calling thread:
 * waking threads costs more than it saves there.
 */
#ifndef STK_MODEL_LAYER_H
#define STK_MODEL_LAYER_H

#include <stdint.h>

#define LAYER_PAR_MIN_WORK (1L << 18)

/* out (B,T,C) = wte[inp[b,t]] (V,C) + wpe[t] (maxT,C). Tokens must be in [0,V). */
void layer_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe,
                           int B, int T, int C);
/* dwte (V,C) and dwpe (maxT,C) += the gradient of dout (B,T,C). */
void layer_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                            int T, int C);

/* out (N,C) = (inp - mean) * rstd * w (C) + b (C); mean, rstd (N) are saved for backward. */
void layer_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                             const float *b, int N, int C);
void layer_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                              const float *inp, const float *w, const float *mean,
                              const float *rstd, int N, int C);

/*
 * out (N,OC) = inp (N,C) @ w (OC,C)^T + bias (OC); bias may be NULL.
 * The fast version blocks rows and runs them in parallel; the _ref version
 * is the three obvious loops, kept to test the fast one against.
 */
void layer_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                          int C, int OC);
void layer_matmul_forward_ref(float *out, const float *inp, const float *w, const float *bias,
                              int N, int C, int OC);
/* dinp (N,C), dw (OC,C), dbias (OC) += gradients of dout (N,OC); dbias may be NULL. */
void layer_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                           const float *inp, const float *w, int N, int C, int OC);
void layer_matmul_backward_ref(float *dinp, float *dw, float *dbias, const float *dout,
                               const float *inp, const float *w, int N, int C, int OC);

/*
 * Causal multi-head self-attention.
 * inp (B,T,3C) holds q, k, v side by side for every position; out (B,T,C);
 * att (B,NH,T,T) keeps the softmax probabilities (zero above the diagonal).
 */
void layer_attention_forward(float *out, float *att, const float *inp, int B, int T, int C, int NH);
/* dinp (B,T,3C) += gradient; datt (B,NH,T,T) is scratch, overwritten. */
void layer_attention_backward(float *dinp, float *datt, const float *dout, const float *inp,
                              const float *att, int B, int T, int C, int NH);

/* GELU, tanh approximation, elementwise over n values. */
void layer_gelu_forward(float *out, const float *inp, int n);
void layer_gelu_backward(float *dinp, const float *inp, const float *dout, int n);

/* out (n) = a + b; the backward is dout added to both inputs' gradients. */
void layer_residual_forward(float *out, const float *a, const float *b, int n);
void layer_residual_backward(float *da, float *db, const float *dout, int n);

/*
 * probs (N,V) = softmax(logits); losses (N) = -log probs[target]. Targets
 * must be in [0,V). The backward adds (probs - onehot) * dloss into dlogits,
 * dloss being the same scale for every row (1/N for a mean loss).
 */
void layer_softmax_xent_forward(float *probs, float *losses, const float *logits,
                                const int32_t *targets, int N, int V);
void layer_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *targets,
                                 float dloss, int N, int V);

#endif
