/*
 * config: the daemons' layering of defaults, config file, environment and
 * flags over one table of flag rows, and everything printed about the
 * options (help, effective values, the example file). Parsing and storing a
 * value, and the command line itself, belong to flags.c; this file adds the
 * sources a command line does not have. See config.h for the syntax.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "stk_config.h"
#include "stk_error.h"
#include "strbuf.h"

/* The command-line view of a daemon's table. */
static struct flag_table flags_of(const struct cfg_table *t) {
  return (struct flag_table){t->program, "[--config FILE] [--OPTION VALUE]...", t->opts, t->n_opts,
                             t->summary};
}

int cfg_set(const struct cfg_table *t, void *dst, const char *name, const char *value,
            const char *where, char *err, size_t err_len) {
  struct flag_table ft = flags_of(t);
  const struct flag_spec *o = flag_find(&ft, name, strlen(name));
  if (!o) {
    if (err && err_len) snprintf(err, err_len, "%s: unknown option '%s'", where, name);
    return STK_EINVAL;
  }
  return flag_set(o, dst, value, where, false, err, err_len);
}

void cfg_free(const struct cfg_table *t, void *dst) {
  struct flag_table ft = flags_of(t);
  flag_free(&ft, dst);
}

/* ---- Layers --------------------------------------------------------------- */

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *end = s + strlen(s);
  while (end > s && isspace((unsigned char)end[-1])) *--end = '\0';
  return s;
}

/* The value part of a file line: "quoted" taken literally, otherwise up to
 * a '#' that follows whitespace. NULL when a quote is not closed. */
static char *file_value(char *v) {
  v = trim(v);
  if (*v == '"') {
    char *close = strrchr(v + 1, '"');
    if (!close) return NULL;
    char *rest = trim(close + 1);
    if (*rest && *rest != '#') return NULL;
    *close = '\0';
    return v + 1;
  }
  for (char *p = v; *p; p++)
    if (*p == '#' && (p == v || isspace((unsigned char)p[-1]))) *p = '\0';
  return trim(v);
}

/* One line of the file; seen marks the rows the file gave already (a
 * FLAG_REPEAT row given again appends). */
static int file_line(const struct flag_table *ft, void *dst, char *line, const char *where,
                     bool *seen, char *err, size_t err_len) {
  char *s = trim(line);
  if (*s == '\0' || *s == '#') return 0;
  char *eq = strchr(s, '=');
  if (!eq) {
    snprintf(err, err_len, "%s: expected 'name = value', got '%s'", where, s);
    return STK_EINVAL;
  }
  *eq = '\0';
  char *name = trim(s), *value = file_value(eq + 1);
  const struct flag_spec *o = flag_find(ft, name, strlen(name));
  if (!o) {
    snprintf(err, err_len, "%s: unknown option '%s'", where, name);
    return STK_EINVAL;
  }
  if (!value) {
    snprintf(err, err_len, "%s: %s: unterminated quoted value", where, name);
    return STK_EINVAL;
  }
  char full[512];
  snprintf(full, sizeof(full), "%s: %s", where, name);
  size_t row = (size_t)(o - ft->specs);
  bool append = seen[row];
  seen[row] = true;
  return flag_set(o, dst, value, full, append, err, err_len);
}

static int load_file(const struct flag_table *ft, void *dst, const char *path, char *err,
                     size_t err_len) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, err_len, "--config %s: %s", path, strerror(errno));
    return errno == ENOENT ? STK_ENOENT : STK_EIO;
  }
  bool *seen = calloc(ft->n_specs + 1, sizeof(bool));
  char *line = NULL;
  size_t cap = 0;
  int rc = seen ? 0 : STK_ENOMEM;
  for (unsigned lineno = 1; rc == 0 && getline(&line, &cap, f) >= 0; lineno++) {
    char where[300];
    snprintf(where, sizeof(where), "%s:%u", path, lineno);
    rc = file_line(ft, dst, line, where, seen, err, err_len);
  }
  if (rc == STK_ENOMEM) snprintf(err, err_len, "out of memory");
  free(seen);
  free(line);
  fclose(f);
  return rc;
}

void cfg_env_name(const struct cfg_table *t, const struct flag_spec *o, char *out, size_t out_len) {
  struct strbuf sb = STRBUF_INIT;
  strbuf_puts(&sb, "STOKER_");
  if (t->env_prefix && *t->env_prefix) strbuf_printf(&sb, "%s_", t->env_prefix);
  strbuf_puts(&sb, o ? o->name : "CONFIG");
  for (size_t i = 0; sb.buf && i < sb.len; i++)
    sb.buf[i] = sb.buf[i] == '-' ? '_' : (char)toupper((unsigned char)sb.buf[i]);
  snprintf(out, out_len, "%s", sb.buf ? sb.buf : "");
  strbuf_release(&sb);
}

static int load_env(const struct cfg_table *t, void *dst, char *err, size_t err_len) {
  for (size_t i = 0; i < t->n_opts; i++) {
    char name[256];
    cfg_env_name(t, &t->opts[i], name, sizeof(name));
    const char *v = getenv(name);
    if (!v) continue;
    int rc = flag_set(&t->opts[i], dst, v, name, false, err, err_len);
    if (rc) return rc;
  }
  return 0;
}

/* First pass: --help anywhere wins, then --version; --config names the file. */
static int prescan(int argc, char **argv, bool *ret_help, bool *ret_version,
                   const char **ret_config, char *err, size_t err_len) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) *ret_help = true;
    if (strcmp(argv[i], "--version") == 0) *ret_version = true;
    if (strncmp(argv[i], "--config=", 9) == 0) *ret_config = argv[i] + 9;
    if (strcmp(argv[i], "--config") == 0) {
      if (i + 1 >= argc) {
        snprintf(err, err_len, "--config: missing value");
        return STK_EINVAL;
      }
      *ret_config = argv[++i];
    }
  }
  return 0;
}

/* The flags layer: argv without --config and its value, parsed by flags.c. */
static int load_flags(const struct flag_table *ft, void *dst, int argc, char **argv, char *err,
                      size_t err_len) {
  char **rest = calloc((size_t)argc + 1, sizeof(char *));
  if (!rest) {
    snprintf(err, err_len, "out of memory");
    return STK_ENOMEM;
  }
  int n = 0;
  for (int i = 0; i < argc; i++) {
    if (i > 0 && strcmp(argv[i], "--config") == 0) {
      i++;
      continue;
    }
    if (i == 0 || strncmp(argv[i], "--config=", 9) != 0) rest[n++] = argv[i];
  }
  int rc = flag_parse(ft, dst, n, rest, NULL, err, err_len);
  free(rest);
  return rc;
}

int cfg_load(const struct cfg_table *t, void *dst, int argc, char **argv, char *err,
             size_t err_len) {
  char scratch[8];
  if (!err || !err_len) err = scratch, err_len = sizeof(scratch);
  err[0] = '\0';
  struct flag_table ft = flags_of(t);
  int rc = flag_defaults(&ft, dst, err, err_len);
  if (rc) return rc;
  bool help = false, version = false;
  const char *config = NULL;
  if ((rc = prescan(argc, argv, &help, &version, &config, err, err_len))) return rc;
  if (help) {
    cfg_print_help(t, stdout);
    return 1;
  }
  if (version) {
    printf("%s %s\n", t->program, STK_VERSION);
    return 1;
  }
  char env[256];
  cfg_env_name(t, NULL, env, sizeof(env));
  if (!config) config = getenv(env);
  if (config && *config && (rc = load_file(&ft, dst, config, err, err_len))) return rc;
  if ((rc = load_env(t, dst, err, err_len))) return rc;
  return load_flags(&ft, dst, argc, argv, err, err_len);
}

/* ---- Printing ------------------------------------------------------------- */

void cfg_print_help(const struct cfg_table *t, FILE *out) {
  struct strbuf sb = STRBUF_INIT;
  char env[256];
  cfg_env_name(t, NULL, env, sizeof(env));
  strbuf_printf(&sb, "Usage: %s [--config FILE] [--OPTION VALUE]...\n", t->program);
  if (t->summary) strbuf_printf(&sb, "%s\n", t->summary);
  strbuf_printf(&sb,
                "\nEach option comes from, in rising priority: its default, the config file\n"
                "(lines 'name = value'), its environment variable, its flag.\n\n"
                "  --config FILE\n      Read options from FILE (env %s).\n"
                "  --help\n      Print this help and exit.\n"
                "  --version\n      Print the program's name and version and exit.\n",
                env);
  for (size_t i = 0; i < t->n_opts; i++) {
    cfg_env_name(t, &t->opts[i], env, sizeof(env));
    flag_put_help(&t->opts[i], env, &sb);
  }
  if (sb.buf) fputs(sb.buf, out);
  strbuf_release(&sb);
}

static void put_effective(const struct flag_spec *o, const void *src, struct strbuf *sb) {
  struct strbuf v = STRBUF_INIT;
  flag_put_value(o, src, &v);
  if (o->flags & FLAG_SECRET)
    strbuf_puts(sb, v.len ? "(set)" : "\"\"");
  else
    flag_put_quoted(sb, v.buf ? v.buf : "");
  strbuf_release(&v);
}

void cfg_print_effective(const struct cfg_table *t, const void *src, FILE *out) {
  struct strbuf sb = STRBUF_INIT;
  for (size_t i = 0; i < t->n_opts; i++) {
    strbuf_printf(&sb, "%s = ", t->opts[i].name);
    put_effective(&t->opts[i], src, &sb);
    strbuf_putc(&sb, '\n');
  }
  if (sb.buf) fputs(sb.buf, out);
  strbuf_release(&sb);
}

void cfg_log_effective(const struct cfg_table *t, const void *src) {
  struct strbuf sb = STRBUF_INIT;
  for (size_t i = 0; i < t->n_opts; i++) {
    strbuf_printf(&sb, "%s%s=", i ? " " : "", t->opts[i].name);
    put_effective(&t->opts[i], src, &sb);
  }
  log_info("config", "%s", sb.buf ? sb.buf : "");
  strbuf_release(&sb);
}

int cfg_write_example(const struct cfg_table *t, FILE *out) {
  struct strbuf sb = STRBUF_INIT;
  strbuf_printf(&sb, "# Example configuration for %s, with every option at its default.\n",
                t->program);
  if (t->summary) strbuf_printf(&sb, "# %s\n", t->summary);
  strbuf_puts(&sb, "# Syntax: 'name = value'; '#' starts a comment. Environment variables and\n"
                   "# --flags override this file.\n");
  for (size_t i = 0; i < t->n_opts; i++) {
    const struct flag_spec *o = &t->opts[i];
    char env[256];
    cfg_env_name(t, o, env, sizeof(env));
    strbuf_puts(&sb, "\n# ");
    flag_put_indented(&sb, o->help, "\n# ");
    strbuf_puts(&sb, "\n# (");
    flag_put_facts(o, env, &sb);
    strbuf_printf(&sb, ")\n%s = ", o->name);
    flag_put_quoted(&sb, flag_default_text(o));
    strbuf_putc(&sb, '\n');
  }
  int rc = sb.failed ? STK_ENOMEM : 0;
  if (!rc && (fputs(sb.buf, out) < 0 || fflush(out) != 0)) rc = STK_EIO;
  strbuf_release(&sb);
  return rc;
}
