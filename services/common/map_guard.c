/*
 * map_guard: survives SIGBUS from files shrunk under their memory maps
 * (see map_guard.h for the contract). The registry is a list of
 * fixed chunks of slots that only grows (a chunk is never freed, so the
 * handler can walk it without a lock while another thread registers); a
 * slot is published by storing its start address last and retired by
 * clearing it first.
 */
#include "map_guard.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "stk_error.h"

#define SLOTS_PER_CHUNK 256
#define GROUP_PATH_MAX  512

enum { GROUP_OK, GROUP_CLAIMED, GROUP_BROKEN }; /* claimed: the path is being written */

struct map_guard_group {
  atomic_int state;
  char path[GROUP_PATH_MAX]; /* the first map that faulted; valid once GROUP_BROKEN */
};

struct map_guard_slot {
  atomic_uintptr_t begin; /* 0: free */
  size_t bytes;
  struct map_guard_group *group;
  char *path;
  bool used; /* guarded by reg_mu */
};

struct chunk {
  struct map_guard_slot slots[SLOTS_PER_CHUNK];
  struct chunk *_Atomic next;
};

static struct chunk *_Atomic reg_head;
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t page_once = PTHREAD_ONCE_INIT;
static struct sigaction prev_action;
static uintptr_t page_bytes;

/* Initial-exec: the handler must not call into the dynamic TLS allocator. */
static _Thread_local struct map_guard_group *scope_group __attribute__((tls_model("initial-exec")));
static _Thread_local unsigned long thread_faults __attribute__((tls_model("initial-exec")));

static struct map_guard_slot *find_slot(uintptr_t addr) {
  for (struct chunk *c = atomic_load(&reg_head); c; c = atomic_load(&c->next))
    for (size_t i = 0; i < SLOTS_PER_CHUNK; i++) {
      uintptr_t b = atomic_load_explicit(&c->slots[i].begin, memory_order_acquire);
      if (b && addr >= b && addr - b < c->slots[i].bytes) return &c->slots[i];
    }
  return NULL;
}

/* Async-signal-safe: marks the group (the first fault names the file). */
static void mark_broken(struct map_guard_group *g, const char *path) {
  int expect = GROUP_OK;
  if (!g || !atomic_compare_exchange_strong(&g->state, &expect, GROUP_CLAIMED)) return;
  size_t i = 0;
  for (; path && path[i] && i + 1 < sizeof g->path; i++) g->path[i] = path[i];
  g->path[i] = 0;
  atomic_store(&g->state, GROUP_BROKEN);
}

/* Replaces the slot's pages from the faulting one to the end by zeros. The
 * group is marked first: a thread that reads the zeros after the remap
 * then finds the group broken when it checks. */
static bool cover(struct map_guard_slot *s, uintptr_t addr) {
  uintptr_t page = addr & ~(page_bytes - 1);
  uintptr_t end = atomic_load(&s->begin) + s->bytes;
  end = (end + page_bytes - 1) & ~(page_bytes - 1);
  mark_broken(s->group, s->path);
  void *p =
      mmap((void *)page, end - page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  return p != MAP_FAILED;
}

/* A SIGBUS that is not ours: the previous handler, else the default action
 * (re-raised: blocked until we return, then it ends the process). */
static void pass_on(int sig, siginfo_t *si, void *uctx) {
  if (prev_action.sa_flags & SA_SIGINFO) {
    if (prev_action.sa_sigaction) {
      prev_action.sa_sigaction(sig, si, uctx);
      return;
    }
  } else if (prev_action.sa_handler != SIG_DFL && prev_action.sa_handler != SIG_IGN) {
    prev_action.sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

static void on_sigbus(int sig, siginfo_t *si, void *uctx) {
  int saved = errno;
  if (si && si->si_code > 0) { /* raised by the kernel for an access */
    uintptr_t addr = (uintptr_t)si->si_addr;
    struct map_guard_slot *s = find_slot(addr);
    if (s && cover(s, addr)) {
      thread_faults++;
      errno = saved;
      return;
    }
  }
  errno = saved;
  pass_on(sig, si, uctx);
}

static void init_page_bytes(void) {
  long pg = sysconf(_SC_PAGESIZE);
  page_bytes = pg > 0 ? (uintptr_t)pg : 4096;
}

/* Installs the handler unless it is in place; reg_mu held. Checked at every
 * registration, so a handler someone else set later (a test framework, a
 * library) is chained to rather than left in charge of our maps. */
static void ensure_installed(void) {
  pthread_once(&page_once, init_page_bytes);
  struct sigaction cur;
  if (sigaction(SIGBUS, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) &&
      cur.sa_sigaction == on_sigbus)
    return;
  struct sigaction sa = {0};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &prev_action);
}

struct map_guard_group *map_guard_group_new(void) {
  return calloc(1, sizeof(struct map_guard_group));
}

void map_guard_group_free(struct map_guard_group *g) {
  free(g);
}

bool map_guard_group_broken(const struct map_guard_group *g, const char **ret_path) {
  int st = g ? atomic_load(&((struct map_guard_group *)g)->state) : GROUP_OK;
  if (st != GROUP_OK && ret_path) *ret_path = st == GROUP_BROKEN ? g->path : "(a dataset file)";
  return st != GROUP_OK;
}

void map_guard_scope_enter(struct map_guard_group *g) {
  scope_group = g;
}

void map_guard_scope_leave(void) {
  scope_group = NULL;
}

unsigned long map_guard_thread_faults(void) {
  return thread_faults;
}

/* A free slot, appending a chunk when none is left; reg_mu held. */
static struct map_guard_slot *take_slot(void) {
  struct chunk *last = NULL;
  for (struct chunk *c = atomic_load(&reg_head); c; c = atomic_load(&c->next)) {
    for (size_t i = 0; i < SLOTS_PER_CHUNK; i++)
      if (!c->slots[i].used) return &c->slots[i];
    last = c;
  }
  struct chunk *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  if (last)
    atomic_store(&last->next, c);
  else
    atomic_store(&reg_head, c);
  return &c->slots[0];
}

int map_guard_add(const void *addr, size_t bytes, const char *path,
                  struct map_guard_slot **ret_slot) {
  *ret_slot = NULL;
  char *copy = strdup(path ? path : "");
  if (!copy) return STK_ENOMEM;
  pthread_mutex_lock(&reg_mu);
  ensure_installed();
  struct map_guard_slot *s = take_slot();
  if (s) {
    s->used = true;
    s->bytes = bytes;
    s->group = scope_group;
    s->path = copy;
    atomic_store_explicit(&s->begin, (uintptr_t)addr, memory_order_release);
  }
  pthread_mutex_unlock(&reg_mu);
  if (!s) {
    free(copy);
    return STK_ENOMEM;
  }
  *ret_slot = s;
  return 0;
}

void map_guard_remove(struct map_guard_slot *s) {
  if (!s) return;
  pthread_mutex_lock(&reg_mu);
  atomic_store_explicit(&s->begin, 0, memory_order_release);
  free(s->path);
  s->path = NULL;
  s->group = NULL;
  s->bytes = 0;
  s->used = false;
  pthread_mutex_unlock(&reg_mu);
}
