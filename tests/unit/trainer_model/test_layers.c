/*
 * Every layer's backward against central finite differences of its forward,
 * and the fast matmul against the naive reference. Each check uses the
 * scalar objective f = sum(out * r) for a random r, so the analytic
 * gradient is the backward run with dout = r.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "layer.h"
#include "model_test.h"

#define H    1e-2 /* finite-difference step */
#define ATOL 2e-4 /* gradients are ~0.1 .. 1; the checks pass at 4x tighter */
#define RTOL 2e-3

struct fd_case {
  void (*forward)(void *ctx);
  void *ctx;
  const float *out; /* what forward writes */
  const float *r;   /* objective weights, one per output */
  size_t nout;
};

static double objective(const struct fd_case *fc) {
  double f = 0.0;
  for (size_t i = 0; i < fc->nout; i++) f += (double)fc->out[i] * fc->r[i];
  return f;
}

/* Central differences of the objective over the n values of x (restored after). */
static void check_grad(const struct fd_case *fc, float *x, size_t n, const float *analytic,
                       const char *what) {
  double *num = malloc(n * sizeof(double));
  assert_non_null(num);
  for (size_t i = 0; i < n; i++) {
    float x0 = x[i];
    x[i] = x0 + (float)H;
    float xp = x[i];
    fc->forward(fc->ctx);
    double fp = objective(fc);
    x[i] = x0 - (float)H;
    float xm = x[i];
    fc->forward(fc->ctx);
    double fm = objective(fc);
    x[i] = x0;
    num[i] = (fp - fm) / ((double)xp - (double)xm);
  }
  fc->forward(fc->ctx);
  assert_true(test_worst(analytic, num, n, ATOL, RTOL, what) <= 1.0);
  free(num);
}

static float *randf(size_t n, uint64_t *s, float lo, float hi) {
  float *p = malloc(n * sizeof(float));
  assert_non_null(p);
  test_fill(p, n, s, lo, hi);
  return p;
}

static float *zerof(size_t n) {
  float *p = calloc(n, sizeof(float));
  assert_non_null(p);
  return p;
}

/* ---- matmul ---- */

struct mm {
  float *out, *inp, *w, *b;
  int N, C, OC;
};

static void mm_forward(void *ctx) {
  struct mm *m = ctx;
  layer_matmul_forward(m->out, m->inp, m->w, m->b, m->N, m->C, m->OC);
}

static void test_matmul_grad(void **state) {
  uint64_t s = 11;
  struct mm m = {.N = 16, .C = 16, .OC = 12};
  m.inp = randf((size_t)m.N * m.C, &s, -1, 1);
  m.w = randf((size_t)m.OC * m.C, &s, -1, 1);
  m.b = randf((size_t)m.OC, &s, -1, 1);
  m.out = zerof((size_t)m.N * m.OC);
  float *r = randf((size_t)m.N * m.OC, &s, -1, 1);
  float *dinp = zerof((size_t)m.N * m.C), *dw = zerof((size_t)m.OC * m.C), *db = zerof(m.OC);
  mm_forward(&m);
  layer_matmul_backward(dinp, dw, db, r, m.inp, m.w, m.N, m.C, m.OC);
  struct fd_case fc = {mm_forward, &m, m.out, r, (size_t)m.N * m.OC};
  check_grad(&fc, m.inp, (size_t)m.N * m.C, dinp, "matmul dinp");
  check_grad(&fc, m.w, (size_t)m.OC * m.C, dw, "matmul dw");
  check_grad(&fc, m.b, (size_t)m.OC, db, "matmul db");
  free(m.inp), free(m.w), free(m.b), free(m.out), free(r), free(dinp), free(dw), free(db);
}

static void assert_close(const float *a, const float *b, size_t n, float tol) {
  for (size_t i = 0; i < n; i++) {
    if (fabsf(a[i] - b[i]) > tol * (1.0f + fabsf(b[i])))
      fail_msg("element %zu: %.8g vs %.8g", i, a[i], b[i]);
  }
}

/* Odd sizes exercise the 4-row blocks, the tail rows and the SIMD remainders. */
static void test_matmul_fast_vs_ref(void **state) {
  uint64_t s = 12;
  int N = 23, C = 37, OC = 19;
  float *inp = randf((size_t)N * C, &s, -1, 1), *w = randf((size_t)OC * C, &s, -1, 1);
  float *b = randf(OC, &s, -1, 1), *dout = randf((size_t)N * OC, &s, -1, 1);
  float *o1 = zerof((size_t)N * OC), *o2 = zerof((size_t)N * OC);
  layer_matmul_forward(o1, inp, w, b, N, C, OC);
  layer_matmul_forward_ref(o2, inp, w, b, N, C, OC);
  assert_close(o1, o2, (size_t)N * OC, 1e-5f);
  layer_matmul_forward(o1, inp, w, NULL, N, C, OC); /* no bias */
  layer_matmul_forward_ref(o2, inp, w, NULL, N, C, OC);
  assert_close(o1, o2, (size_t)N * OC, 1e-5f);

  float *di1 = zerof((size_t)N * C), *dw1 = zerof((size_t)OC * C), *db1 = zerof(OC);
  float *di2 = zerof((size_t)N * C), *dw2 = zerof((size_t)OC * C), *db2 = zerof(OC);
  for (int pass = 0; pass < 2; pass++) { /* twice: both must accumulate */
    layer_matmul_backward(di1, dw1, db1, dout, inp, w, N, C, OC);
    layer_matmul_backward_ref(di2, dw2, db2, dout, inp, w, N, C, OC);
  }
  assert_close(di1, di2, (size_t)N * C, 1e-5f);
  assert_close(dw1, dw2, (size_t)OC * C, 1e-5f);
  assert_close(db1, db2, OC, 1e-5f);
  free(inp), free(w), free(b), free(dout), free(o1), free(o2);
  free(di1), free(dw1), free(db1), free(di2), free(dw2), free(db2);
}

/* ---- layernorm ---- */

struct ln {
  float *out, *mean, *rstd, *inp, *w, *b;
  int N, C;
};

static void ln_forward(void *ctx) {
  struct ln *l = ctx;
  layer_layernorm_forward(l->out, l->mean, l->rstd, l->inp, l->w, l->b, l->N, l->C);
}

static void test_layernorm_grad(void **state) {
  uint64_t s = 21;
  struct ln l = {.N = 16, .C = 16};
  size_t n = (size_t)l.N * l.C;
  l.inp = randf(n, &s, -2, 2), l.w = randf(l.C, &s, 0.5f, 1.5f), l.b = randf(l.C, &s, -1, 1);
  l.out = zerof(n), l.mean = zerof(l.N), l.rstd = zerof(l.N);
  float *r = randf(n, &s, -1, 1), *dinp = zerof(n), *dw = zerof(l.C), *db = zerof(l.C);
  ln_forward(&l);
  /* Row 0 undone by (out - b) / w has mean 0: the forward normalises. */
  double mean = 0.0;
  for (int c = 0; c < l.C; c++) mean += (l.out[c] - l.b[c]) / l.w[c];
  assert_true(fabs(mean / l.C) < 1e-5);
  layer_layernorm_backward(dinp, dw, db, r, l.inp, l.w, l.mean, l.rstd, l.N, l.C);
  struct fd_case fc = {ln_forward, &l, l.out, r, n};
  check_grad(&fc, l.inp, n, dinp, "layernorm dinp");
  check_grad(&fc, l.w, l.C, dw, "layernorm dw");
  check_grad(&fc, l.b, l.C, db, "layernorm db");
  free(l.inp), free(l.w), free(l.b), free(l.out), free(l.mean), free(l.rstd);
  free(r), free(dinp), free(dw), free(db);
}

/* ---- attention ---- */

struct at {
  float *out, *att, *inp;
  int B, T, C, NH;
};

static void at_forward(void *ctx) {
  struct at *a = ctx;
  layer_attention_forward(a->out, a->att, a->inp, a->B, a->T, a->C, a->NH);
}

static void test_attention_grad(void **state) {
  uint64_t s = 31;
  struct at a = {.B = 2, .T = 8, .C = 16, .NH = 2};
  size_t nin = (size_t)a.B * a.T * 3 * a.C, nout = (size_t)a.B * a.T * a.C;
  size_t natt = (size_t)a.B * a.NH * a.T * a.T;
  a.inp = randf(nin, &s, -1, 1), a.out = zerof(nout), a.att = zerof(natt);
  float *r = randf(nout, &s, -1, 1), *dinp = zerof(nin), *datt = zerof(natt);
  at_forward(&a);
  /* Causality: row t of every head sums to 1 and puts nothing after t. */
  for (int t = 0; t < a.T; t++) {
    double sum = 0.0;
    for (int t2 = 0; t2 < a.T; t2++) {
      sum += a.att[(size_t)t * a.T + t2];
      if (t2 > t) assert_true(a.att[(size_t)t * a.T + t2] == 0.0f);
    }
    assert_true(fabs(sum - 1.0) < 1e-5);
  }
  layer_attention_backward(dinp, datt, r, a.inp, a.att, a.B, a.T, a.C, a.NH);
  struct fd_case fc = {at_forward, &a, a.out, r, nout};
  check_grad(&fc, a.inp, nin, dinp, "attention dinp");
  free(a.inp), free(a.out), free(a.att), free(r), free(dinp), free(datt);
}

/* ---- gelu, residual ---- */

struct pw {
  float *out, *a, *b;
  int n;
};

static void gelu_fwd(void *ctx) {
  struct pw *p = ctx;
  layer_gelu_forward(p->out, p->a, p->n);
}

static void residual_fwd(void *ctx) {
  struct pw *p = ctx;
  layer_residual_forward(p->out, p->a, p->b, p->n);
}

static void test_gelu_grad(void **state) {
  uint64_t s = 41;
  struct pw p = {.n = 64};
  p.a = randf(p.n, &s, -3, 3), p.out = zerof(p.n);
  float *r = randf(p.n, &s, -1, 1), *da = zerof(p.n);
  gelu_fwd(&p);
  float x = 1.0f, y; /* gelu(1) = 0.8411920 (tanh form) */
  layer_gelu_forward(&y, &x, 1);
  assert_true(fabsf(y - 0.8411920f) < 1e-6f);
  layer_gelu_backward(da, p.a, r, p.n);
  struct fd_case fc = {gelu_fwd, &p, p.out, r, (size_t)p.n};
  check_grad(&fc, p.a, p.n, da, "gelu dinp");
  free(p.a), free(p.out), free(r), free(da);
}

static void test_residual_grad(void **state) {
  uint64_t s = 51;
  struct pw p = {.n = 32};
  p.a = randf(p.n, &s, -1, 1), p.b = randf(p.n, &s, -1, 1), p.out = zerof(p.n);
  float *r = randf(p.n, &s, -1, 1), *da = zerof(p.n), *db = zerof(p.n);
  residual_fwd(&p);
  layer_residual_backward(da, db, r, p.n);
  struct fd_case fc = {residual_fwd, &p, p.out, r, (size_t)p.n};
  check_grad(&fc, p.a, p.n, da, "residual da");
  check_grad(&fc, p.b, p.n, db, "residual db");
  free(p.a), free(p.b), free(p.out), free(r), free(da), free(db);
}

/* ---- encoder ---- */

struct enc {
  float *out, *wte, *wpe;
  int32_t *tok;
  int B, T, C;
};

static void enc_forward(void *ctx) {
  struct enc *e = ctx;
  layer_encoder_forward(e->out, e->tok, e->wte, e->wpe, e->B, e->T, e->C);
}

static void test_encoder_grad(void **state) {
  uint64_t s = 61;
  int V = 5; /* few tokens, so rows repeat and their gradients must add up */
  struct enc e = {.B = 2, .T = 8, .C = 16};
  size_t nout = (size_t)e.B * e.T * e.C;
  e.wte = randf((size_t)V * e.C, &s, -1, 1), e.wpe = randf((size_t)e.T * e.C, &s, -1, 1);
  e.out = zerof(nout);
  e.tok = malloc((size_t)e.B * e.T * sizeof(int32_t));
  test_tokens(e.tok, (size_t)e.B * e.T, &s, V);
  float *r = randf(nout, &s, -1, 1), *dwte = zerof((size_t)V * e.C);
  float *dwpe = zerof((size_t)e.T * e.C);
  enc_forward(&e);
  layer_encoder_backward(dwte, dwpe, r, e.tok, e.B, e.T, e.C);
  struct fd_case fc = {enc_forward, &e, e.out, r, nout};
  check_grad(&fc, e.wte, (size_t)V * e.C, dwte, "encoder dwte");
  check_grad(&fc, e.wpe, (size_t)e.T * e.C, dwpe, "encoder dwpe");
  free(e.wte), free(e.wpe), free(e.out), free(e.tok), free(r), free(dwte), free(dwpe);
}

/* ---- softmax + cross-entropy ---- */

struct xent {
  float *probs, *losses, *logits;
  int32_t *targets;
  int N, V;
};

static void xent_forward(void *ctx) {
  struct xent *x = ctx;
  layer_softmax_xent_forward(x->probs, x->losses, x->logits, x->targets, x->N, x->V);
}

static void test_softmax_xent_grad(void **state) {
  uint64_t s = 71;
  struct xent x = {.N = 16, .V = 64};
  size_t n = (size_t)x.N * x.V;
  x.logits = randf(n, &s, -3, 3), x.probs = zerof(n), x.losses = zerof(x.N);
  x.targets = malloc((size_t)x.N * sizeof(int32_t));
  test_tokens(x.targets, x.N, &s, x.V);
  float *r = malloc((size_t)x.N * sizeof(float)), *dlogits = zerof(n);
  for (int i = 0; i < x.N; i++) r[i] = 1.0f / (float)x.N; /* the mean loss */
  xent_forward(&x);
  double expect = -log(x.probs[x.targets[0]]);
  assert_true(fabs(x.losses[0] - expect) < 1e-5);
  layer_softmax_xent_backward(dlogits, x.probs, x.targets, 1.0f / (float)x.N, x.N, x.V);
  struct fd_case fc = {xent_forward, &x, x.losses, r, (size_t)x.N};
  check_grad(&fc, x.logits, n, dlogits, "softmax_xent dlogits");
  free(x.logits), free(x.probs), free(x.losses), free(x.targets), free(r), free(dlogits);
}

/* A hopeless logit gap must give a large finite loss, not inf. */
static void test_softmax_xent_extreme(void **state) {
  float logits[2] = {0.0f, 200.0f}, probs[2], loss;
  int32_t target = 0;
  layer_softmax_xent_forward(probs, &loss, logits, &target, 1, 2);
  assert_true(isfinite(loss));
  assert_true(fabsf(loss - 200.0f) < 1e-3f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matmul_grad),
      cmocka_unit_test(test_matmul_fast_vs_ref),
      cmocka_unit_test(test_layernorm_grad),
      cmocka_unit_test(test_attention_grad),
      cmocka_unit_test(test_gelu_grad),
      cmocka_unit_test(test_residual_grad),
      cmocka_unit_test(test_encoder_grad),
      cmocka_unit_test(test_softmax_xent_grad),
      cmocka_unit_test(test_softmax_xent_extreme),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
