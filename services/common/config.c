/*
 * config: one table per daemon drives parsing, validation and layering of
 * defaults, config file, environment and flags, and everything printed
 * about the options (help, effective values, the example file). See
 * config.h for the syntax. Values are parsed into a scratch union first and
 * stored only when valid, so a bad value never half-changes the struct.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "stk_config.h"
#include "stk_error.h"
#include "strbuf.h"

union value {
  char *s;
  bool b;
  int64_t i;
  uint64_t u;
  int e;
};

/* ---- Parsing one value ------------------------------------------------ */

/* Decimal digits only (no sign, no spaces); false on overflow or junk. */
static bool parse_digits(const char *s, const char **ret_end, uint64_t *ret) {
  if (!isdigit((unsigned char)*s)) return false;
  uint64_t v = 0;
  for (; isdigit((unsigned char)*s); s++) {
    unsigned d = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *ret_end = s;
  *ret = v;
  return true;
}

static bool parse_bool(const char *s, bool *ret) {
  static const char *const yes[] = {"true", "yes", "on", "1"};
  static const char *const no[] = {"false", "no", "off", "0"};
  for (size_t i = 0; i < 4; i++) {
    if (strcasecmp(s, yes[i]) == 0) return *ret = true, true;
    if (strcasecmp(s, no[i]) == 0) return *ret = false, true;
  }
  return false;
}

static bool parse_int64(const char *s, int64_t *ret) {
  bool neg = *s == '-';
  const char *end;
  uint64_t u;
  if (!parse_digits(s + (neg || *s == '+'), &end, &u) || *end) return false;
  if (neg ? u > (uint64_t)INT64_MAX + 1 : u > (uint64_t)INT64_MAX) return false;
  *ret = neg ? (int64_t)(0 - u) : (int64_t)u;
  return true;
}

/* Multiplies a number by a unit factor, refusing overflow. */
static bool scale(uint64_t n, uint64_t factor, uint64_t limit, uint64_t *ret) {
  if (factor && n > limit / factor) return false;
  *ret = n * factor;
  return true;
}

static bool parse_duration_ms(const char *s, int64_t *ret) {
  static const struct {
    const char *unit;
    uint64_t ms;
  } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"d", 86400000}};
  const char *end;
  uint64_t n, v;
  if (!parse_digits(s, &end, &n)) return false;
  if (*end == '\0' && n == 0) return *ret = 0, true;
  for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
    if (strcmp(end, units[i].unit) == 0) {
      if (!scale(n, units[i].ms, INT64_MAX, &v)) return false;
      return *ret = (int64_t)v, true;
    }
  }
  return false;
}

static bool parse_size(const char *s, uint64_t *ret) {
  static const struct {
    const char *unit;
    uint64_t bytes;
  } units[] = {{"", 1},
               {"B", 1},
               {"K", 1ull << 10},
               {"KiB", 1ull << 10},
               {"M", 1ull << 20},
               {"MiB", 1ull << 20},
               {"G", 1ull << 30},
               {"GiB", 1ull << 30},
               {"T", 1ull << 40},
               {"TiB", 1ull << 40},
               {"KB", 1000ull},
               {"MB", 1000000ull},
               {"GB", 1000000000ull},
               {"TB", 1000000000000ull}};
  const char *end;
  uint64_t n;
  if (!parse_digits(s, &end, &n)) return false;
  for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
    if (strcasecmp(end, units[i].unit) == 0 && (strlen(end) != 1 || end[0] != 'b'))
      return scale(n, units[i].bytes, UINT64_MAX, ret);
  return false;
}

static bool parse_enum(const struct cfg_option *o, const char *s, int *ret) {
  for (int i = 0; o->enum_names && o->enum_names[i]; i++)
    if (strcmp(s, o->enum_names[i]) == 0) return *ret = i, true;
  return false;
}

/* "expected ..." phrase for a type, used in error messages. */
static void describe_expected(const struct cfg_option *o, struct strbuf *sb) {
  switch (o->type) {
  case CFG_STRING:
    strbuf_puts(sb, "a string");
    break;
  case CFG_BOOL:
    strbuf_puts(sb, "true or false");
    break;
  case CFG_INT64:
    strbuf_puts(sb, "an integer");
    break;
  case CFG_UINT64:
    strbuf_puts(sb, "a non-negative integer");
    break;
  case CFG_DURATION:
    strbuf_puts(sb, "a duration like 5s");
    break;
  case CFG_SIZE:
    strbuf_puts(sb, "a size like 64KiB");
    break;
  case CFG_ENUM:
    strbuf_puts(sb, "one of ");
    for (int i = 0; o->enum_names && o->enum_names[i]; i++)
      strbuf_printf(sb, "%s%s", i ? ", " : "", o->enum_names[i]);
    break;
  }
}

/* ---- Formatting one value ---------------------------------------------- */

static void format_duration(struct strbuf *sb, int64_t ms) {
  static const struct {
    const char *unit;
    int64_t ms;
  } units[] = {{"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}};
  for (size_t i = 0; ms != 0 && i < sizeof(units) / sizeof(units[0]); i++)
    if (ms % units[i].ms == 0)
      return strbuf_printf(sb, "%" PRId64 "%s", ms / units[i].ms, units[i].unit);
  strbuf_printf(sb, ms ? "%" PRId64 "ms" : "%" PRId64, ms);
}

static void format_size(struct strbuf *sb, uint64_t bytes) {
  static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
  for (int i = 0; bytes != 0 && i < 4; i++) {
    uint64_t factor = 1ull << (10 * (4 - i));
    if (bytes % factor == 0) return strbuf_printf(sb, "%" PRIu64 "%s", bytes / factor, units[i]);
  }
  strbuf_printf(sb, "%" PRIu64, bytes);
}

/* Numbers shown in the option's own syntax (bounds, effective values). */
static void format_number(const struct cfg_option *o, struct strbuf *sb, int64_t v) {
  if (o->type == CFG_DURATION)
    format_duration(sb, v);
  else if (o->type == CFG_SIZE)
    format_size(sb, (uint64_t)v);
  else
    strbuf_printf(sb, "%" PRId64, v);
}

static void format_field(const struct cfg_option *o, const void *src, struct strbuf *sb) {
  const char *field = (const char *)src + o->offset;
  switch (o->type) {
  case CFG_STRING: {
    const char *s = *(char *const *)field;
    strbuf_puts(sb, s ? s : "");
    break;
  }
  case CFG_BOOL:
    strbuf_puts(sb, *(const bool *)field ? "true" : "false");
    break;
  case CFG_INT64:
    strbuf_printf(sb, "%" PRId64, *(const int64_t *)field);
    break;
  case CFG_UINT64:
    strbuf_printf(sb, "%" PRIu64, *(const uint64_t *)field);
    break;
  case CFG_DURATION:
    format_duration(sb, *(const int64_t *)field);
    break;
  case CFG_SIZE:
    format_size(sb, *(const uint64_t *)field);
    break;
  case CFG_ENUM: {
    int e = *(const int *)field;
    strbuf_puts(sb, e >= 0 && o->enum_names ? o->enum_names[e] : "?");
    break;
  }
  }
}

/* ---- Checking and storing ---------------------------------------------- */

static bool has_bounds(const struct cfg_option *o) {
  return o->min != 0 || o->max != 0;
}

static bool in_bounds(const struct cfg_option *o, const union value *v) {
  if (!has_bounds(o)) return true;
  switch (o->type) {
  case CFG_INT64:
  case CFG_DURATION:
    return v->i >= o->min && v->i <= o->max;
  case CFG_UINT64:
  case CFG_SIZE:
    return (o->min <= 0 || v->u >= (uint64_t)o->min) && o->max >= 0 && v->u <= (uint64_t)o->max;
  default:
    return true;
  }
}

/* Parses text for o into v; on failure writes the error line to sb. */
static bool parse_value(const struct cfg_option *o, const char *text, const char *where,
                        union value *v, struct strbuf *sb) {
  bool ok = false;
  switch (o->type) {
  case CFG_STRING:
    ok = (v->s = strdup(text)) != NULL;
    break;
  case CFG_BOOL:
    ok = parse_bool(text, &v->b);
    break;
  case CFG_INT64:
    ok = parse_int64(text, &v->i);
    break;
  case CFG_UINT64: {
    const char *end;
    ok = parse_digits(text, &end, &v->u) && *end == '\0';
    break;
  }
  case CFG_DURATION:
    ok = parse_duration_ms(text, &v->i);
    break;
  case CFG_SIZE:
    ok = parse_size(text, &v->u);
    break;
  case CFG_ENUM:
    ok = parse_enum(o, text, &v->e);
    break;
  }
  if (!ok) {
    strbuf_printf(sb, "%s: expected ", where);
    describe_expected(o, sb);
    strbuf_printf(sb, ", got '%s'", text);
    return false;
  }
  if (!in_bounds(o, v)) {
    strbuf_printf(sb, "%s: %s is out of range [", where, text);
    format_number(o, sb, o->min);
    strbuf_puts(sb, ", ");
    format_number(o, sb, o->max);
    strbuf_puts(sb, "]");
    return false;
  }
  return true;
}

static void store(const struct cfg_option *o, void *dst, const union value *v) {
  char *field = (char *)dst + o->offset;
  switch (o->type) {
  case CFG_STRING:
    free(*(char **)field);
    *(char **)field = v->s;
    break;
  case CFG_BOOL:
    *(bool *)field = v->b;
    break;
  case CFG_INT64:
  case CFG_DURATION:
    *(int64_t *)field = v->i;
    break;
  case CFG_UINT64:
  case CFG_SIZE:
    *(uint64_t *)field = v->u;
    break;
  case CFG_ENUM:
    *(int *)field = v->e;
    break;
  }
}

/* Writes sb's line into the caller's error buffer. */
static int fail(struct strbuf *sb, char *err, size_t err_len, int code) {
  if (err && err_len)
    snprintf(err, err_len, "%s", sb->failed || !sb->buf ? "out of memory" : sb->buf);
  strbuf_release(sb);
  return code;
}

static int set_option(const struct cfg_option *o, void *dst, const char *text, const char *where,
                      char *err, size_t err_len) {
  struct strbuf sb = STRBUF_INIT;
  union value v;
  memset(&v, 0, sizeof(v));
  if (!parse_value(o, text, where, &v, &sb)) return fail(&sb, err, err_len, STK_EINVAL);
  store(o, dst, &v);
  return 0;
}

/* Which CFG_REPEAT options the layer being loaded has set already (a
 * table's row index; cfg_load runs in main() alone, see config.h). */
#define CFG_MAX_REPEAT_ROWS 256
static bool repeat_seen[CFG_MAX_REPEAT_ROWS];

static void begin_layer(void) {
  memset(repeat_seen, 0, sizeof(repeat_seen));
}

/* set_option, except that a CFG_REPEAT option set again in the same layer
 * gets the value appended (':'-joined) to what the layer gave before. */
static int set_in_layer(const struct cfg_table *t, const struct cfg_option *o, void *dst,
                        const char *text, const char *where, char *err, size_t err_len) {
  size_t row = (size_t)(o - t->opts);
  if (!(o->flags & CFG_REPEAT) || row >= CFG_MAX_REPEAT_ROWS)
    return set_option(o, dst, text, where, err, err_len);
  const char *old = *(char **)((char *)dst + o->offset);
  if (!repeat_seen[row] || !old || !*old || !*text) {
    repeat_seen[row] = true;
    return set_option(o, dst, text, where, err, err_len);
  }
  struct strbuf sb = STRBUF_INIT;
  strbuf_printf(&sb, "%s:%s", old, text);
  if (sb.failed) return fail(&sb, err, err_len, STK_ENOMEM);
  int rc = set_option(o, dst, sb.buf, where, err, err_len);
  strbuf_release(&sb);
  return rc;
}

static const struct cfg_option *find_option(const struct cfg_table *t, const char *name,
                                            size_t len) {
  for (size_t i = 0; i < t->n_opts; i++)
    if (strlen(t->opts[i].name) == len && strncmp(t->opts[i].name, name, len) == 0)
      return &t->opts[i];
  return NULL;
}

int cfg_set(const struct cfg_table *t, void *dst, const char *name, const char *value,
            const char *where, char *err, size_t err_len) {
  const struct cfg_option *o = find_option(t, name, strlen(name));
  if (!o) {
    if (err && err_len) snprintf(err, err_len, "%s: unknown option '%s'", where, name);
    return STK_EINVAL;
  }
  return set_option(o, dst, value, where, err, err_len);
}

void cfg_free(const struct cfg_table *t, void *dst) {
  for (size_t i = 0; i < t->n_opts; i++) {
    if (t->opts[i].type != CFG_STRING) continue;
    char **field = (char **)((char *)dst + t->opts[i].offset);
    free(*field);
    *field = NULL;
  }
}

/* ---- Layers --------------------------------------------------------------- */

/* Catches mistakes in a daemon's table before they confuse a user. */
static int check_table(const struct cfg_table *t, char *err, size_t err_len) {
  for (size_t i = 0; i < t->n_opts; i++) {
    const struct cfg_option *o = &t->opts[i];
    bool bad = !o->name || !*o->name || strchr(o->name, '=') || strchr(o->name, ' ') ||
               (o->type == CFG_ENUM && (!o->enum_names || !o->enum_names[0])) ||
               find_option(t, o->name, strlen(o->name)) != o;
    if (bad) {
      snprintf(err, err_len, "config table row %zu (%s) is invalid or duplicated", i,
               o->name ? o->name : "NULL");
      return STK_EINVAL;
    }
  }
  return 0;
}

static int load_defaults(const struct cfg_table *t, void *dst, char *err, size_t err_len) {
  for (size_t i = 0; i < t->n_opts; i++) { /* Strings first: cfg_free works on any return. */
    if (t->opts[i].type == CFG_STRING) *(char **)((char *)dst + t->opts[i].offset) = NULL;
  }
  int rc = check_table(t, err, err_len);
  if (rc) return rc;
  for (size_t i = 0; i < t->n_opts; i++) {
    const struct cfg_option *o = &t->opts[i];
    const char *def = o->def;
    if (!def) def = o->type == CFG_STRING ? "" : o->type == CFG_ENUM ? o->enum_names[0] : "0";
    char where[128];
    snprintf(where, sizeof(where), "default of %s", o->name);
    rc = set_option(o, dst, def, where, err, err_len);
    if (rc) return rc;
  }
  return 0;
}

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

static int file_line(const struct cfg_table *t, void *dst, char *line, const char *where, char *err,
                     size_t err_len) {
  char *s = trim(line);
  if (*s == '\0' || *s == '#') return 0;
  char *eq = strchr(s, '=');
  if (!eq) {
    snprintf(err, err_len, "%s: expected 'name = value', got '%s'", where, s);
    return STK_EINVAL;
  }
  *eq = '\0';
  char *name = trim(s), *value = file_value(eq + 1);
  const struct cfg_option *o = find_option(t, name, strlen(name));
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
  return set_in_layer(t, o, dst, value, full, err, err_len);
}

static int load_file(const struct cfg_table *t, void *dst, const char *path, char *err,
                     size_t err_len) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, err_len, "--config %s: %s", path, strerror(errno));
    return errno == ENOENT ? STK_ENOENT : STK_EIO;
  }
  char *line = NULL;
  size_t cap = 0;
  int rc = 0;
  for (unsigned lineno = 1; rc == 0 && getline(&line, &cap, f) >= 0; lineno++) {
    char where[300];
    snprintf(where, sizeof(where), "%s:%u", path, lineno);
    rc = file_line(t, dst, line, where, err, err_len);
  }
  free(line);
  fclose(f);
  return rc;
}

void cfg_env_name(const struct cfg_table *t, const struct cfg_option *o, char *out,
                  size_t out_len) {
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
    int rc = set_option(&t->opts[i], dst, v, name, err, err_len);
    if (rc) return rc;
  }
  return 0;
}

/* One flag at argv[*i]; advances *i past a separate value. */
static int load_flag(const struct cfg_table *t, void *dst, int argc, char **argv, int *i, char *err,
                     size_t err_len) {
  const char *arg = argv[*i];
  if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
    snprintf(err, err_len, "unexpected argument '%s'", arg);
    return STK_EINVAL;
  }
  const char *name = arg + 2, *eq = strchr(name, '=');
  size_t len = eq ? (size_t)(eq - name) : strlen(name);
  const char *value = eq ? eq + 1 : NULL;
  const struct cfg_option *o = find_option(t, name, len);
  if (!o && !eq && strncmp(name, "no-", 3) == 0) {
    o = find_option(t, name + 3, len - 3);
    if (o && o->type == CFG_BOOL) return set_option(o, dst, "false", arg, err, err_len);
    o = NULL;
  }
  if (!o) {
    snprintf(err, err_len, "unknown option '--%.*s' (see --help)", (int)len, name);
    return STK_EINVAL;
  }
  char where[256];
  snprintf(where, sizeof(where), "--%s", o->name);
  if (!value && o->type == CFG_BOOL) value = "true";
  if (!value) {
    if (*i + 1 >= argc) {
      snprintf(err, err_len, "%s: missing value", where);
      return STK_EINVAL;
    }
    value = argv[++*i];
  }
  return set_in_layer(t, o, dst, value, where, err, err_len);
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

static int load_flags(const struct cfg_table *t, void *dst, int argc, char **argv, char *err,
                      size_t err_len) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--config") == 0) {
      i++;
      continue;
    }
    if (strncmp(argv[i], "--config=", 9) == 0) continue;
    int rc = load_flag(t, dst, argc, argv, &i, err, err_len);
    if (rc) return rc;
  }
  return 0;
}

int cfg_load(const struct cfg_table *t, void *dst, int argc, char **argv, char *err,
             size_t err_len) {
  char scratch[8];
  if (!err || !err_len) err = scratch, err_len = sizeof(scratch);
  err[0] = '\0';
  int rc = load_defaults(t, dst, err, err_len);
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
  begin_layer();
  if (config && *config && (rc = load_file(t, dst, config, err, err_len))) return rc;
  if ((rc = load_env(t, dst, err, err_len))) return rc;
  begin_layer();
  return load_flags(t, dst, argc, argv, err, err_len);
}

/* ---- Printing ------------------------------------------------------------- */

static const char *default_text(const struct cfg_option *o) {
  if (o->def) return o->def;
  if (o->type == CFG_STRING) return "";
  return o->type == CFG_ENUM ? o->enum_names[0] : "0";
}

/* A value as a config file writes it: quoted when it would not survive
 * trimming and comment stripping as is. */
static void put_file_value(struct strbuf *sb, const char *v) {
  size_t n = strlen(v);
  bool quote = n == 0 || isspace((unsigned char)v[0]) || isspace((unsigned char)v[n - 1]) ||
               v[0] == '"' || strchr(v, '#');
  strbuf_printf(sb, quote ? "\"%s\"" : "%s", v);
}

/* Help text, each newline followed by the prefix of the next line. */
static void put_indented(struct strbuf *sb, const char *text, const char *newline) {
  for (const char *p = text ? text : ""; *p; p++) {
    if (*p == '\n')
      strbuf_puts(sb, newline);
    else
      strbuf_putc(sb, *p);
  }
}

static void put_placeholder(const struct cfg_option *o, struct strbuf *sb) {
  static const char *const names[] = {"STRING", "", "INTEGER", "INTEGER", "DURATION", "SIZE", ""};
  if (o->type == CFG_ENUM) {
    for (int i = 0; o->enum_names[i]; i++)
      strbuf_printf(sb, "%s%s", i ? "|" : "", o->enum_names[i]);
  } else {
    strbuf_puts(sb, names[o->type]);
  }
}

/* "type, default X, range [a, b], env NAME" as help and the example show it. */
static void put_facts(const struct cfg_table *t, const struct cfg_option *o, struct strbuf *sb) {
  static const char *const type_names[] = {"string",   "bool", "integer", "integer",
                                           "duration", "size", "enum"};
  char env[256];
  cfg_env_name(t, o, env, sizeof(env));
  strbuf_printf(sb, "%s%s, default ", type_names[o->type],
                (o->flags & CFG_REPEAT) ? " (repeatable; ':'-joined list)" : "");
  put_file_value(sb, default_text(o));
  if (has_bounds(o) && o->type != CFG_BOOL && o->type != CFG_STRING && o->type != CFG_ENUM) {
    strbuf_puts(sb, ", range [");
    format_number(o, sb, o->min);
    strbuf_puts(sb, ", ");
    format_number(o, sb, o->max);
    strbuf_puts(sb, "]");
  }
  if (o->type == CFG_ENUM) {
    strbuf_puts(sb, ", ");
    describe_expected(o, sb);
  }
  strbuf_printf(sb, ", env %s", env);
}

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
    const struct cfg_option *o = &t->opts[i];
    strbuf_printf(&sb, "  --%s ", o->name);
    if (o->type == CFG_BOOL)
      strbuf_printf(&sb, "| --no-%s", o->name);
    else
      put_placeholder(o, &sb);
    strbuf_puts(&sb, "\n      ");
    put_indented(&sb, o->help, "\n      ");
    strbuf_puts(&sb, "\n      (");
    put_facts(t, o, &sb);
    strbuf_puts(&sb, ")\n");
  }
  if (sb.buf) fputs(sb.buf, out);
  strbuf_release(&sb);
}

static void put_effective(const struct cfg_option *o, const void *src, struct strbuf *sb) {
  if (o->flags & CFG_SECRET) {
    struct strbuf v = STRBUF_INIT;
    format_field(o, src, &v);
    strbuf_puts(sb, v.len ? "(set)" : "\"\"");
    strbuf_release(&v);
    return;
  }
  struct strbuf v = STRBUF_INIT;
  format_field(o, src, &v);
  put_file_value(sb, v.buf ? v.buf : "");
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
    const struct cfg_option *o = &t->opts[i];
    strbuf_puts(&sb, "\n# ");
    put_indented(&sb, o->help, "\n# ");
    strbuf_puts(&sb, "\n# (");
    put_facts(t, o, &sb);
    strbuf_printf(&sb, ")\n%s = ", o->name);
    put_file_value(&sb, default_text(o));
    strbuf_putc(&sb, '\n');
  }
  int rc = sb.failed ? STK_ENOMEM : 0;
  if (!rc && (fputs(sb.buf, out) < 0 || fflush(out) != 0)) rc = STK_EIO;
  strbuf_release(&sb);
  return rc;
}
