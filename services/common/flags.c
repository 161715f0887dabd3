/*
 * flags: one table of rows drives parsing, checking and storing of every
 * program's flags, and the help printed about them. See flags.h for the
 * syntax. A value is parsed into a scratch union first and stored only when
 * valid, so a bad value never half-changes the caller's struct.
 */
#include "flags.h"

#include <ctype.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "stk_error.h"

union value {
  char *s;
  const char *arg;
  bool b;
  int64_t i;
  uint64_t u;
  int e;
  double d;
};

/* Rows a table may have for FLAG_REPEAT tracking within one source. */
#define FLAG_MAX_ROWS 256

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

static bool parse_double(const char *s, double *ret) {
  if (!*s || isspace((unsigned char)*s)) return false;
  char *end;
  double d = strtod(s, &end);
  if (*end || !isfinite(d)) return false;
  *ret = d;
  return true;
}

/* Multiplies a number by a unit factor, refusing overflow. */
static bool scale(uint64_t n, uint64_t factor, uint64_t limit, uint64_t *ret) {
  if (factor && n > limit / factor) return false;
  *ret = n * factor;
  return true;
}

int flag_parse_uint(const char *s, uint64_t max, uint64_t *ret_value) {
  const char *end;
  uint64_t v;
  if (!s || !parse_digits(s, &end, &v) || *end) return STK_EINVAL;
  if (v > max) return STK_ERANGE;
  *ret_value = v;
  return 0;
}

/* The unit at s: its milliseconds and length; 0 when none. */
static uint64_t duration_unit(const char *s, size_t *ret_len) {
  static const struct {
    const char *name;
    uint64_t ms;
  } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"d", 86400000}};
  for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
    size_t n = strlen(units[i].name);
    if (strncmp(s, units[i].name, n) == 0) return *ret_len = n, units[i].ms;
  }
  return 0;
}

/* One "1.5s" term at *s: its milliseconds (rounded), advancing *s. */
static int duration_term(const char **s, uint64_t *ret_ms) {
  const char *p;
  uint64_t whole, frac = 0, frac_scale = 1;
  if (!parse_digits(*s, &p, &whole)) return STK_EINVAL;
  if (*p == '.') {
    if (!isdigit((unsigned char)*++p)) return STK_EINVAL;
    for (; isdigit((unsigned char)*p); p++) {
      if (frac_scale < 1000000000ull) frac = frac * 10 + (uint64_t)(*p - '0'), frac_scale *= 10;
    }
  }
  size_t unit_len = 0;
  uint64_t unit = duration_unit(p, &unit_len), ms;
  if (!unit) return STK_EINVAL;
  if (!scale(whole, unit, INT64_MAX, &ms)) return STK_ERANGE;
  ms += (frac * unit + frac_scale / 2) / frac_scale;
  *s = p + unit_len;
  *ret_ms = ms;
  return 0;
}

int flag_parse_duration_ms(const char *s, int64_t *ret_ms) {
  if (!s || !*s) return STK_EINVAL;
  if (strcmp(s, "0") == 0) return *ret_ms = 0, 0;
  uint64_t total = 0;
  while (*s) {
    uint64_t ms;
    int rc = duration_term(&s, &ms);
    if (rc) return rc;
    if (ms > (uint64_t)INT64_MAX - total) return STK_ERANGE;
    total += ms;
  }
  *ret_ms = (int64_t)total;
  return 0;
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

static bool parse_enum(const struct flag_spec *o, const char *s, int *ret) {
  for (int i = 0; o->enum_names && o->enum_names[i]; i++)
    if (strcmp(s, o->enum_names[i]) == 0) return *ret = i, true;
  return false;
}

/* "expected ..." phrase for a type, used in error messages. */
static void describe_expected(const struct flag_spec *o, struct strbuf *sb) {
  static const char *const phrases[] = {
      [FLAG_STRING] = "a string",        [FLAG_ARG] = "a string",
      [FLAG_BOOL] = "true or false",     [FLAG_INT64] = "an integer",
      [FLAG_INT] = "an integer",         [FLAG_UINT64] = "a non-negative integer",
      [FLAG_FLOAT] = "a number",         [FLAG_DURATION] = "a duration like 5s",
      [FLAG_SIZE] = "a size like 64KiB", [FLAG_ENUM] = "one of ",
  };
  strbuf_puts(sb, phrases[o->type]);
  for (int i = 0; o->type == FLAG_ENUM && o->enum_names && o->enum_names[i]; i++)
    strbuf_printf(sb, "%s%s", i ? ", " : "", o->enum_names[i]);
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

/* Numbers shown in the row's own syntax (bounds). */
static void format_number(const struct flag_spec *o, struct strbuf *sb, int64_t v) {
  if (o->type == FLAG_DURATION)
    format_duration(sb, v);
  else if (o->type == FLAG_SIZE)
    format_size(sb, (uint64_t)v);
  else
    strbuf_printf(sb, "%" PRId64, v);
}

void flag_put_value(const struct flag_spec *o, const void *src, struct strbuf *sb) {
  const char *field = (const char *)src + o->offset;
  switch (o->type) {
  case FLAG_STRING:
  case FLAG_ARG: {
    const char *s = *(const char *const *)field;
    strbuf_puts(sb, s ? s : "");
    break;
  }
  case FLAG_BOOL:
    strbuf_puts(sb, *(const bool *)field ? "true" : "false");
    break;
  case FLAG_INT:
    strbuf_printf(sb, "%d", *(const int *)field);
    break;
  case FLAG_INT64:
    strbuf_printf(sb, "%" PRId64, *(const int64_t *)field);
    break;
  case FLAG_UINT64:
    strbuf_printf(sb, "%" PRIu64, *(const uint64_t *)field);
    break;
  case FLAG_FLOAT:
    strbuf_printf(sb, "%g", (double)*(const float *)field);
    break;
  case FLAG_DURATION:
    format_duration(sb, *(const int64_t *)field);
    break;
  case FLAG_SIZE:
    format_size(sb, *(const uint64_t *)field);
    break;
  case FLAG_ENUM: {
    int e = *(const int *)field;
    strbuf_puts(sb, e >= 0 && o->enum_names ? o->enum_names[e] : "?");
    break;
  }
  }
}

/* ---- Checking and storing ---------------------------------------------- */

static bool has_bounds(const struct flag_spec *o) {
  return o->min != 0 || o->max != 0;
}

static bool in_bounds(const struct flag_spec *o, const union value *v) {
  if (!has_bounds(o)) return true;
  switch (o->type) {
  case FLAG_INT:
  case FLAG_INT64:
  case FLAG_DURATION:
    return v->i >= o->min && v->i <= o->max;
  case FLAG_UINT64:
  case FLAG_SIZE:
    return (o->min <= 0 || v->u >= (uint64_t)o->min) && o->max >= 0 && v->u <= (uint64_t)o->max;
  case FLAG_FLOAT:
    return v->d >= (double)o->min && v->d <= (double)o->max;
  default:
    return true;
  }
}

/* Parses text for o into v (a FLAG_STRING copied); false when it is not
 * a value of the row's type. */
static bool parse_typed(const struct flag_spec *o, const char *text, union value *v) {
  const char *end;
  switch (o->type) {
  case FLAG_STRING:
    return (v->s = strdup(text)) != NULL;
  case FLAG_ARG:
    return v->arg = text, true;
  case FLAG_BOOL:
    return parse_bool(text, &v->b);
  case FLAG_INT:
    return parse_int64(text, &v->i) && v->i >= INT_MIN && v->i <= INT_MAX;
  case FLAG_INT64:
    return parse_int64(text, &v->i);
  case FLAG_UINT64:
    return parse_digits(text, &end, &v->u) && *end == '\0';
  case FLAG_FLOAT:
    return parse_double(text, &v->d) && fabs(v->d) <= 3.4e38;
  case FLAG_DURATION:
    return flag_parse_duration_ms(text, &v->i) == 0;
  case FLAG_SIZE:
    return parse_size(text, &v->u);
  case FLAG_ENUM:
    return parse_enum(o, text, &v->e);
  }
  return false;
}

/* Parses text for o into v; on failure writes the error line to sb. */
static bool parse_value(const struct flag_spec *o, const char *text, const char *where,
                        union value *v, struct strbuf *sb) {
  if (!parse_typed(o, text, v)) {
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

static void store(const struct flag_spec *o, void *dst, const union value *v) {
  char *field = (char *)dst + o->offset;
  switch (o->type) {
  case FLAG_STRING:
    free(*(char **)field);
    *(char **)field = v->s;
    break;
  case FLAG_ARG:
    *(const char **)field = v->arg;
    break;
  case FLAG_BOOL:
    *(bool *)field = v->b;
    break;
  case FLAG_INT:
    *(int *)field = (int)v->i;
    break;
  case FLAG_INT64:
  case FLAG_DURATION:
    *(int64_t *)field = v->i;
    break;
  case FLAG_UINT64:
  case FLAG_SIZE:
    *(uint64_t *)field = v->u;
    break;
  case FLAG_FLOAT:
    *(float *)field = (float)v->d;
    break;
  case FLAG_ENUM:
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

static int set_value(const struct flag_spec *o, void *dst, const char *text, const char *where,
                     char *err, size_t err_len) {
  struct strbuf sb = STRBUF_INIT;
  union value v;
  memset(&v, 0, sizeof(v));
  if (!parse_value(o, text, where, &v, &sb)) return fail(&sb, err, err_len, STK_EINVAL);
  if (o->flags & FLAG_LISTED) { /* Checked only; the caller keeps the text. */
    if (o->type == FLAG_STRING) free(v.s);
    return 0;
  }
  store(o, dst, &v);
  return 0;
}

int flag_set(const struct flag_spec *o, void *dst, const char *text, const char *where, bool append,
             char *err, size_t err_len) {
  const char *old = o->type == FLAG_STRING ? *(char **)((char *)dst + o->offset) : NULL;
  if (!append || !(o->flags & FLAG_REPEAT) || !old || !*old || !*text)
    return set_value(o, dst, text, where, err, err_len);
  struct strbuf sb = STRBUF_INIT;
  strbuf_printf(&sb, "%s:%s", old, text);
  if (sb.failed) return fail(&sb, err, err_len, STK_ENOMEM);
  int rc = set_value(o, dst, sb.buf, where, err, err_len);
  strbuf_release(&sb);
  return rc;
}

const struct flag_spec *flag_find(const struct flag_table *t, const char *name, size_t len) {
  for (size_t i = 0; i < t->n_specs; i++)
    if (strlen(t->specs[i].name) == len && strncmp(t->specs[i].name, name, len) == 0)
      return &t->specs[i];
  return NULL;
}

int flag_check_table(const struct flag_table *t, char *err, size_t err_len) {
  for (size_t i = 0; i < t->n_specs; i++) {
    const struct flag_spec *o = &t->specs[i];
    bool bad = !o->name || !*o->name || strchr(o->name, '=') || strchr(o->name, ' ') ||
               (o->type == FLAG_ENUM && (!o->enum_names || !o->enum_names[0])) ||
               flag_find(t, o->name, strlen(o->name)) != o || i >= FLAG_MAX_ROWS;
    if (bad) {
      snprintf(err, err_len, "flag table row %zu (%s) is invalid or duplicated", i,
               o->name ? o->name : "NULL");
      return STK_EINVAL;
    }
  }
  return 0;
}

const char *flag_default_text(const struct flag_spec *o) {
  if (o->def) return o->def;
  if (o->type == FLAG_STRING || o->type == FLAG_ARG) return "";
  return o->type == FLAG_ENUM ? o->enum_names[0] : "0";
}

int flag_defaults(const struct flag_table *t, void *dst, char *err, size_t err_len) {
  for (size_t i = 0; i < t->n_specs; i++) { /* Strings first: flag_free works on any return. */
    if (t->specs[i].type == FLAG_STRING && !(t->specs[i].flags & FLAG_LISTED))
      *(char **)((char *)dst + t->specs[i].offset) = NULL;
  }
  int rc = flag_check_table(t, err, err_len);
  for (size_t i = 0; rc == 0 && i < t->n_specs; i++) {
    const struct flag_spec *o = &t->specs[i];
    if (o->flags & FLAG_LISTED) continue;
    if (o->type == FLAG_ARG && !o->def) {
      *(const char **)((char *)dst + o->offset) = NULL;
      continue;
    }
    char where[128];
    snprintf(where, sizeof(where), "default of %s", o->name);
    rc = set_value(o, dst, flag_default_text(o), where, err, err_len);
  }
  return rc;
}

void flag_free(const struct flag_table *t, void *dst) {
  for (size_t i = 0; i < t->n_specs; i++) {
    if (t->specs[i].type != FLAG_STRING || (t->specs[i].flags & FLAG_LISTED)) continue;
    char **field = (char **)((char *)dst + t->specs[i].offset);
    free(*field);
    *field = NULL;
  }
}

/* ---- The command line ----------------------------------------------------- */

/* Records a FLAG_LISTED occurrence after checking its value. */
static int record(const struct flag_spec *o, const char *value, const char *where,
                  struct flag_rest *rest, char *err, size_t err_len) {
  if (value) {
    int rc = set_value(o, NULL, value, where, err, err_len);
    if (rc) return rc;
  }
  if (!rest || !rest->listed || rest->n_listed >= rest->max_listed) {
    snprintf(err, err_len, "too many flags");
    return STK_EINVAL;
  }
  rest->listed[rest->n_listed++] = (struct flag_occurrence){o->name, value};
  return 0;
}

/* The row for "--no-NAME" when NAME is a stored bool row. */
static const struct flag_spec *negated_bool(const struct flag_table *t, const char *name,
                                            size_t len) {
  if (len <= 3 || strncmp(name, "no-", 3) != 0) return NULL;
  const struct flag_spec *o = flag_find(t, name + 3, len - 3);
  return o && o->type == FLAG_BOOL && !(o->flags & FLAG_LISTED) ? o : NULL;
}

/* One flag at argv[*i]; advances *i past a separate value. seen marks the
 * FLAG_REPEAT rows given already. */
static int parse_one(const struct flag_table *t, void *dst, int argc, char **argv, int *i,
                     bool *seen, struct flag_rest *rest, char *err, size_t err_len) {
  const char *name = argv[*i] + 2, *eq = strchr(name, '=');
  size_t len = eq ? (size_t)(eq - name) : strlen(name);
  const char *value = eq ? eq + 1 : NULL;
  const struct flag_spec *o = flag_find(t, name, len), *negated = NULL;
  if (!o && !eq) o = negated = negated_bool(t, name, len);
  if (!o) {
    snprintf(err, err_len, "unknown flag --%.*s (see --help)", (int)len, name);
    return STK_EINVAL;
  }
  char where[256];
  snprintf(where, sizeof(where), "--%s", o->name);
  if (o->type == FLAG_BOOL && (o->flags & FLAG_LISTED)) {
    if (value) {
      snprintf(err, err_len, "%s takes no value", where);
      return STK_EINVAL;
    }
    return record(o, NULL, where, rest, err, err_len);
  }
  if (!value && o->type == FLAG_BOOL) value = negated ? "false" : "true";
  if (!value) {
    if (*i + 1 >= argc) {
      snprintf(err, err_len, "%s: missing value", where);
      return STK_EINVAL;
    }
    value = argv[++*i];
  }
  if (o->flags & FLAG_LISTED) return record(o, value, where, rest, err, err_len);
  size_t row = (size_t)(o - t->specs);
  bool append = seen[row];
  seen[row] = true;
  return flag_set(o, dst, value, where, append, err, err_len);
}

static int positional(const char *word, struct flag_rest *rest, char *err, size_t err_len) {
  if (!rest || !rest->pos) {
    snprintf(err, err_len, "unexpected argument '%s'", word);
    return STK_EINVAL;
  }
  if (rest->n_pos >= rest->max_pos) {
    snprintf(err, err_len, "too many arguments");
    return STK_EINVAL;
  }
  rest->pos[rest->n_pos++] = word;
  return 0;
}

int flag_parse(const struct flag_table *t, void *dst, int argc, char **argv, struct flag_rest *rest,
               char *err, size_t err_len) {
  char scratch[8];
  if (!err || !err_len) err = scratch, err_len = sizeof(scratch);
  int rc = flag_check_table(t, err, err_len);
  bool seen[FLAG_MAX_ROWS] = {false}, flags_done = false;
  for (int i = 1; rc == 0 && i < argc; i++) {
    const char *w = argv[i];
    bool is_help = strcmp(w, "--help") == 0 || strcmp(w, "-h") == 0;
    bool is_version = strcmp(w, "--version") == 0;
    if (flags_done || strncmp(w, "--", 2) != 0 || (w[2] == '\0' && !(rest && rest->pos))) {
      if (!flags_done && strcmp(w, "-h") == 0) {
        if (rest) rest->help = true;
      } else {
        rc = positional(w, rest, err, err_len);
      }
    } else if (w[2] == '\0') {
      flags_done = true;
    } else if (is_help || is_version) {
      if (rest) (is_help ? &rest->help : &rest->version)[0] = true;
    } else {
      rc = parse_one(t, dst, argc, argv, &i, seen, rest, err, err_len);
    }
  }
  return rc;
}

/* ---- Help ----------------------------------------------------------------- */

void flag_put_quoted(struct strbuf *sb, const char *v) {
  size_t n = strlen(v);
  bool quote = n == 0 || isspace((unsigned char)v[0]) || isspace((unsigned char)v[n - 1]) ||
               v[0] == '"' || strchr(v, '#');
  strbuf_printf(sb, quote ? "\"%s\"" : "%s", v);
}

void flag_put_indented(struct strbuf *sb, const char *text, const char *newline_prefix) {
  for (const char *p = text ? text : ""; *p; p++) {
    if (*p == '\n')
      strbuf_puts(sb, newline_prefix);
    else
      strbuf_putc(sb, *p);
  }
}

static void put_placeholder(const struct flag_spec *o, struct strbuf *sb) {
  static const char *const names[] = {
      [FLAG_STRING] = "STRING", [FLAG_ARG] = "STRING",  [FLAG_BOOL] = "",
      [FLAG_INT64] = "INTEGER", [FLAG_INT] = "INTEGER", [FLAG_UINT64] = "INTEGER",
      [FLAG_FLOAT] = "NUMBER",  [FLAG_SIZE] = "SIZE",   [FLAG_DURATION] = "DURATION",
      [FLAG_ENUM] = "",
  };
  if (o->type == FLAG_ENUM) {
    for (int i = 0; o->enum_names[i]; i++)
      strbuf_printf(sb, "%s%s", i ? "|" : "", o->enum_names[i]);
  } else {
    strbuf_puts(sb, names[o->type]);
  }
}

void flag_put_facts(const struct flag_spec *o, const char *env, struct strbuf *sb) {
  static const char *const type_names[] = {
      [FLAG_STRING] = "string", [FLAG_ARG] = "string",  [FLAG_BOOL] = "bool",
      [FLAG_INT64] = "integer", [FLAG_INT] = "integer", [FLAG_UINT64] = "integer",
      [FLAG_FLOAT] = "number",  [FLAG_SIZE] = "size",   [FLAG_DURATION] = "duration",
      [FLAG_ENUM] = "enum",
  };
  strbuf_printf(sb, "%s%s", type_names[o->type],
                (o->flags & FLAG_REPEAT) ? " (repeatable; ':'-joined list)" : "");
  if ((o->flags & FLAG_LISTED) ? o->def != NULL : !(o->type == FLAG_ARG && !o->def)) {
    strbuf_puts(sb, ", default ");
    flag_put_quoted(sb, flag_default_text(o));
  }
  if (has_bounds(o) && o->type != FLAG_BOOL && o->type != FLAG_STRING && o->type != FLAG_ENUM &&
      o->type != FLAG_ARG) {
    strbuf_puts(sb, ", range [");
    format_number(o, sb, o->min);
    strbuf_puts(sb, ", ");
    format_number(o, sb, o->max);
    strbuf_puts(sb, "]");
  }
  if (o->type == FLAG_ENUM) {
    strbuf_puts(sb, ", ");
    describe_expected(o, sb);
  }
  if (env) strbuf_printf(sb, ", env %s", env);
}

void flag_put_help(const struct flag_spec *o, const char *env, struct strbuf *sb) {
  strbuf_printf(sb, "  --%s", o->name);
  if (o->type == FLAG_BOOL && !(o->flags & FLAG_LISTED))
    strbuf_printf(sb, " | --no-%s", o->name);
  else if (o->type != FLAG_BOOL) {
    strbuf_puts(sb, " ");
    put_placeholder(o, sb);
  }
  strbuf_puts(sb, "\n      ");
  flag_put_indented(sb, o->help, "\n      ");
  strbuf_puts(sb, "\n      (");
  flag_put_facts(o, env, sb);
  strbuf_puts(sb, ")\n");
}

void flag_print_help(const struct flag_table *t, FILE *out) {
  struct strbuf sb = STRBUF_INIT;
  strbuf_printf(&sb, "Usage: %s %s\n", t->program, t->usage ? t->usage : "[--OPTION VALUE]...");
  if (t->summary) strbuf_printf(&sb, "%s\n", t->summary);
  strbuf_puts(&sb, "\n");
  for (size_t i = 0; i < t->n_specs; i++) flag_put_help(&t->specs[i], NULL, &sb);
  if (sb.buf) fputs(sb.buf, out);
  strbuf_release(&sb);
}
