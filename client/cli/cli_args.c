/*
 * stokerctl's command line, environment, durations and exit codes. Flags
 * are known up front (one table) so that they may appear anywhere and a
 * typo is a usage error rather than a silently ignored word.
 */
#include "cli_args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

enum flag_kind { FLAG_SWITCH, FLAG_VALUE };

/* Every flag stokerctl knows; global ones have a field in cli_args. */
static const struct {
  const char *name;
  enum flag_kind kind;
  size_t global_offset; /* offsetof(struct cli_args, field) + 1; 0: not global. */
} flag_table[] = {
#define GLOBAL(name, field)                                                                        \
  { name, FLAG_VALUE, offsetof(struct cli_args, field) + 1 }
    GLOBAL("coordinator", coordinator),
    GLOBAL("dataloader", dataloader),
    GLOBAL("checkpoint", checkpoint),
    GLOBAL("tls-ca", tls_ca),
    GLOBAL("tls-cert", tls_cert),
    GLOBAL("tls-key", tls_key),
    GLOBAL("token-file", token_file),
#undef GLOBAL
    {"timeout", FLAG_VALUE, 0},
    {"json", FLAG_SWITCH, 0},
    {"help", FLAG_SWITCH, 0},
    {"version", FLAG_SWITCH, 0},
    {"label", FLAG_VALUE, 0},
    {"after", FLAG_VALUE, 0},
    {"min", FLAG_VALUE, 0},
    {"max", FLAG_VALUE, 0},
    {"heartbeat", FLAG_VALUE, 0},
    {"misses", FLAG_VALUE, 0},
    {"last-call", FLAG_VALUE, 0},
    {"join-timeout", FLAG_VALUE, 0},
    {"dataset", FLAG_VALUE, 0},
    {"checkpoint-storage", FLAG_VALUE, 0},
    {"checkpoint-every", FLAG_VALUE, 0},
    {"skip-checkpoint", FLAG_SWITCH, 0},
    {"force", FLAG_SWITCH, 0},
    {"seq-len", FLAG_VALUE, 0},
    {"global-batch", FLAG_VALUE, 0},
    {"seed", FLAG_VALUE, 0},
    {"shards", FLAG_VALUE, 0},
    {"lanes", FLAG_VALUE, 0},
    {"bos", FLAG_VALUE, 0},
    {"eos", FLAG_VALUE, 0},
    {"max-doc-tokens", FLAG_VALUE, 0},
    {"from-step", FLAG_VALUE, 0},
    {"block-document", FLAG_VALUE, 0},
    {"rank", FLAG_VALUE, 0},
    {"world", FLAG_VALUE, 0},
    {"progress", FLAG_SWITCH, 0},
    {"reason", FLAG_VALUE, 0},
};

static int find_flag(const char *name, size_t len) {
  for (size_t i = 0; i < sizeof(flag_table) / sizeof(flag_table[0]); i++) {
    if (strlen(flag_table[i].name) == len && memcmp(flag_table[i].name, name, len) == 0)
      return (int)i;
  }
  return -1;
}

/* Stores one parsed flag: a global field, a global switch, or a
 * subcommand flag. */
static int store_flag(struct cli_args *a, int f, const char *value, char *err, size_t err_len) {
  const char *name = flag_table[f].name;
  if (flag_table[f].global_offset) {
    *(const char **)((char *)a + flag_table[f].global_offset - 1) = value;
  } else if (strcmp(name, "json") == 0) {
    a->json = true;
  } else if (strcmp(name, "help") == 0) {
    a->help = true;
  } else if (strcmp(name, "version") == 0) {
    a->version = true;
  } else if (strcmp(name, "timeout") == 0) {
    if (cli_parse_duration_ms(value, &a->timeout_ms) < 0 || a->timeout_ms <= 0) {
      snprintf(err, err_len, "--timeout: bad duration \"%s\" (e.g. 500ms, 10s, 2m)", value);
      return STK_EINVAL;
    }
  } else {
    if (a->n_flags == CLI_MAX_FLAGS) {
      snprintf(err, err_len, "too many flags");
      return STK_EINVAL;
    }
    a->flags[a->n_flags++] = (struct cli_flag){name, value};
  }
  return 0;
}

/* Parses the flag at argv[*i], consuming its value word if needed. */
static int parse_flag(struct cli_args *a, int argc, char **argv, int *i, char *err,
                      size_t err_len) {
  const char *word = argv[*i] + 2;
  const char *eq = strchr(word, '=');
  size_t len = eq ? (size_t)(eq - word) : strlen(word);
  int f = find_flag(word, len);
  if (f < 0) {
    snprintf(err, err_len, "unknown flag --%.*s", (int)len, word);
    return STK_EINVAL;
  }
  const char *value = NULL;
  if (flag_table[f].kind == FLAG_VALUE) {
    if (eq) {
      value = eq + 1;
    } else if (*i + 1 < argc) {
      value = argv[++*i];
    } else {
      snprintf(err, err_len, "--%s needs a value", flag_table[f].name);
      return STK_EINVAL;
    }
  } else if (eq) {
    snprintf(err, err_len, "--%s takes no value", flag_table[f].name);
    return STK_EINVAL;
  }
  return store_flag(a, f, value, err, err_len);
}

int cli_parse(int argc, char **argv, struct cli_args *a, char *err, size_t err_len) {
  memset(a, 0, sizeof(*a));
  a->timeout_ms = CLI_DEFAULT_TIMEOUT_MS;
  bool flags_done = false;
  for (int i = 1; i < argc; i++) {
    const char *w = argv[i];
    if (!flags_done && strcmp(w, "--") == 0) {
      flags_done = true;
    } else if (!flags_done && (strcmp(w, "-h") == 0)) {
      a->help = true;
    } else if (!flags_done && strncmp(w, "--", 2) == 0) {
      int rc = parse_flag(a, argc, argv, &i, err, err_len);
      if (rc < 0) return rc;
    } else if (a->n_pos == CLI_MAX_POSITIONAL) {
      snprintf(err, err_len, "too many arguments");
      return STK_EINVAL;
    } else {
      a->pos[a->n_pos++] = w;
    }
  }
  return 0;
}

void cli_apply_env(struct cli_args *a, const char *(*get)(const char *name)) {
  if (!a->coordinator) a->coordinator = get("STOKER_COORDINATOR");
  if (!a->coordinator || !a->coordinator[0]) a->coordinator = CLI_DEFAULT_COORDINATOR;
  if (!a->dataloader) a->dataloader = get("STOKER_DATALOADER");
  if (!a->checkpoint) a->checkpoint = get("STOKER_CHECKPOINT");
  if (!a->token_file) a->token_file = get("STOKER_TOKEN_FILE");
  if (!a->tls_ca) a->tls_ca = get("STOKER_TLS_CA");
  if (a->dataloader && !a->dataloader[0]) a->dataloader = NULL;
  if (a->checkpoint && !a->checkpoint[0]) a->checkpoint = NULL;
  if (a->token_file && !a->token_file[0]) a->token_file = NULL;
  if (a->tls_ca && !a->tls_ca[0]) a->tls_ca = NULL;
}

const char *cli_flag_value(const struct cli_args *a, const char *name) {
  for (int i = a->n_flags - 1; i >= 0; i--) {
    if (strcmp(a->flags[i].name, name) == 0) return a->flags[i].value;
  }
  return NULL;
}

bool cli_flag_set(const struct cli_args *a, const char *name) {
  for (int i = 0; i < a->n_flags; i++) {
    if (strcmp(a->flags[i].name, name) == 0) return true;
  }
  return false;
}

/* Milliseconds per unit at s (consumed into *ret_len), 0 if none. */
static double unit_ms(const char *s, size_t *ret_len) {
  static const struct {
    const char *name;
    double ms;
  } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
  for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
    size_t n = strlen(units[i].name);
    if (strncmp(s, units[i].name, n) == 0) {
      *ret_len = n;
      return units[i].ms;
    }
  }
  return 0;
}

int cli_parse_duration_ms(const char *s, int64_t *ret_ms) {
  if (!s || !*s) return STK_EINVAL;
  if (strcmp(s, "0") == 0) {
    *ret_ms = 0;
    return 0;
  }
  double total = 0;
  while (*s) {
    if (*s < '0' || *s > '9') return STK_EINVAL;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s) return STK_EINVAL;
    size_t ulen = 0;
    double ms = unit_ms(end, &ulen);
    if (ms == 0) return STK_EINVAL;
    total += v * ms;
    if (total > 86400000.0) return STK_ERANGE;
    s = end + ulen;
  }
  *ret_ms = (int64_t)(total + 0.5);
  return 0;
}

int cli_parse_uint(const char *s, uint64_t max, uint64_t *ret_value) {
  if (!s || *s < '0' || *s > '9') return STK_EINVAL;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end) return STK_EINVAL;
  if (v > max) return STK_ERANGE;
  *ret_value = v;
  return 0;
}

int cli_split_label(const char *s, char *key, size_t key_len, char *value, size_t value_len) {
  const char *eq = s ? strchr(s, '=') : NULL;
  if (!eq || eq == s) return STK_EINVAL;
  size_t klen = (size_t)(eq - s), vlen = strlen(eq + 1);
  if (klen >= key_len || vlen >= value_len) return STK_EINVAL;
  memcpy(key, s, klen);
  key[klen] = '\0';
  memcpy(value, eq + 1, vlen + 1);
  return 0;
}

int cli_exit_code(int err) {
  switch (err) {
  case 0:
    return CLI_EXIT_OK;
  case STK_EINVAL:
    return CLI_EXIT_USAGE;
  case STK_ENOENT:
    return CLI_EXIT_NOT_FOUND;
  case STK_ESTATE:
  case STK_ESTALE:
  case STK_EEXIST:
  case STK_EABORTED:
    return CLI_EXIT_CONFLICT;
  case STK_EUNAVAIL:
  case STK_ETIMEDOUT:
    return CLI_EXIT_UNAVAILABLE;
  case STK_EUNAUTH:
  case STK_EPERM:
    return CLI_EXIT_AUTH;
  default:
    return CLI_EXIT_OTHER;
  }
}
